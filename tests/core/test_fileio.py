"""lmkit.core.fileio: what it writes is whole, and gets the modes a plain open() or mkdir would give it."""
from __future__ import annotations

import os
import stat

import pytest

from lmkit.core.fileio import atomic_write_bytes, atomic_write_text, current_umask, make_temp_dir


@pytest.fixture(params=[0o022, 0o002, 0o077])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_current_umask_reads_without_changing_it(umask):
    assert current_umask() == umask
    assert current_umask() == umask


def test_new_files_get_the_mode_open_gives(tmp_path, umask):
    atomic_write_text(tmp_path / "config.json", "{}\n")
    with open(tmp_path / "plain.json", "w") as f:
        f.write("{}\n")
    assert mode(tmp_path / "config.json") == mode(tmp_path / "plain.json") == 0o666 & ~umask
    assert (tmp_path / "config.json").read_text() == "{}\n"


def test_an_existing_file_keeps_its_own_mode(tmp_path, umask):
    target = tmp_path / "results.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert mode(target) == 0o640
    assert os.listdir(tmp_path) == ["results.json"]  # no temporary file left


def test_temp_dirs_get_the_mode_mkdir_gives(tmp_path, umask):
    made = make_temp_dir(".tmp-key-", tmp_path)
    os.mkdir(tmp_path / "plain")
    assert os.path.basename(made).startswith(".tmp-key-")
    assert mode(made) == mode(tmp_path / "plain") == 0o777 & ~umask


def test_the_token_cache_and_exports_are_readable_by_the_group(tmp_path):
    """The cache folder, its manifest and an exported folder: 0755/0644 under umask 022 (they were 0700/0600)."""
    from lmkit.data.token_cache import MANIFEST_FILE, encode_to_cache
    from lmkit.data.tokenizers import train_tokenizer
    from lmkit.hub.folders import write_folder

    previous = os.umask(0o022)
    try:
        text = tmp_path / "train.txt"
        text.write_text("the cat sat\non the mat\n")
        tokenizer = train_tokenizer("word", str(text), tmp_path / "run")
        saved = sorted(os.listdir(tmp_path / "run"))
        assert saved and all(mode(tmp_path / "run" / name) in (0o644, 0o755) for name in saved), saved
        found = encode_to_cache(str(tmp_path / "cache"), tokenizer, [str(text)], add_eos=True, workers=1)
        assert mode(found.folder) == 0o755
        assert mode(os.path.join(found.folder, MANIFEST_FILE)) == 0o644

        def fill(folder: str) -> None:
            atomic_write_text(os.path.join(folder, "config.json"), "{}")

        write_folder(str(tmp_path / "export"), fill)
        assert mode(tmp_path / "export") == 0o755
        assert mode(tmp_path / "export" / "config.json") == 0o644
    finally:
        os.umask(previous)
