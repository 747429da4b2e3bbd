"""``lmkit prepare``'s own checks (encoding into the cache end to end: test_cli_text.py)."""
import pytest

from lmkit.cli import prepare
from lmkit.core.errors import UsageError


def test_ptb_and_no_cache_have_nothing_to_prepare(tmp_path):
    with pytest.raises(UsageError, match="lmkit prepare encodes your own text; pass --train_file"):
        prepare.main(["--config", "config_small"])
    with pytest.raises(UsageError, match="--data_cache none leaves nothing to prepare"):
        prepare.main(["--config", "config_transformer", "--train_file", str(tmp_path / "t.txt"),
                      "--data_cache", "none"])
