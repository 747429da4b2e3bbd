"""The fixtures of the lmkit.modules tests (seeds; eager and compiled runs)."""

from tests.modules.conftest import _seeded, run  # noqa: F401 (pytest fixtures)
