"""Which files a --train_file names (lmkit.data.sources): files, folders, globs and lists, in sorted order."""
import os

import pytest

from lmkit.data.errors import DataError
from lmkit.data.sources import resolve_sources


def test_sources_folders_globs_and_lists_in_sorted_order(texts):
    root, files = texts
    expected = sorted([files["a"], files["b"], files["c"]])
    assert resolve_sources(str(root / "shards")) == expected  # recursive, hidden file left out
    assert resolve_sources(str(root / "shards" / "**" / "*.txt")) == expected
    assert resolve_sources(f"{files['b']},{files['a']}") == sorted([files["a"], files["b"]])
    assert resolve_sources([files["b"], files["a"], files["b"]]) == sorted([files["a"], files["b"]])
    with pytest.raises(DataError, match="pattern .*nothing.txt' matches no file"):
        resolve_sources(str(root / "*nothing.txt"))
    with pytest.raises(DataError, match="valid_file '.*missing.txt' does not exist"):
        resolve_sources(str(root / "missing.txt"), "valid_file")
    os.makedirs(root / "empty", exist_ok=True)
    with pytest.raises(DataError, match="is a folder without files"):
        resolve_sources(str(root / "empty"))
