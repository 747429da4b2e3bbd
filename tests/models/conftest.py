"""The fixtures of the lmkit.layers tests (seeds; eager and compiled runs)."""

from tests.layers.conftest import _seeded, run  # noqa: F401 (pytest fixtures)
