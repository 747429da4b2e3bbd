"""The files of a model directory (lmkit.core.layout): checkpoint folders and which are complete, a named
checkpoint, the stored config."""
import json
import os

import pytest

from lmkit.core import layout
from lmkit.core.errors import UsageError


def _checkpoint(folder, name, complete=True):
    path = folder / name
    path.mkdir(parents=True)
    (path / f"{layout.CHECKPOINT_PREFIX}.index").write_text("")
    if complete:
        (path / layout.META_FILE).write_text("{}")
    return str(path)


def test_complete_checkpoints_oldest_first_and_a_lone_old_copy_counts(tmp_path):
    ckpts = tmp_path / layout.CHECKPOINT_DIR
    assert layout.checkpoint_folder_name(1200) == "ckpt-000001200"
    assert layout.complete_checkpoints(str(ckpts)) == []
    ten = _checkpoint(ckpts, layout.checkpoint_folder_name(10))
    _checkpoint(ckpts, layout.checkpoint_folder_name(20), complete=False)  # killed before meta.json
    old = _checkpoint(ckpts, "ckpt-000000030.old-123")  # a re-save killed between its renames
    _checkpoint(ckpts, "ckpt-000000010.old-9")  # ckpt-10 itself is complete: ignored
    assert layout.complete_checkpoints(str(ckpts)) == [(10, ten), (30, old)]


def test_a_checkpoint_is_named_by_path_or_by_name_and_a_wrong_one_lists_those_there(tmp_path):
    ckpts = tmp_path / layout.CHECKPOINT_DIR
    path = _checkpoint(ckpts, layout.checkpoint_folder_name(5))
    assert layout.resolve_checkpoint(str(tmp_path), None) is None
    assert layout.resolve_checkpoint(str(tmp_path), "ckpt-000000005") == os.path.join(str(ckpts), "ckpt-000000005")
    assert layout.resolve_checkpoint(str(tmp_path), path) == path
    with pytest.raises(UsageError, match=f"--checkpoint ckpt-9 is not a checkpoint folder .*; those in {ckpts}: "
                                         "ckpt-000000005$"):
        layout.resolve_checkpoint(str(tmp_path), "ckpt-9")


def test_the_stored_config_is_read_without_tensorflow(tmp_path):
    with pytest.raises(UsageError, match="holds no config.json; pass the --model_dir of a training run"):
        layout.read_config_dict(str(tmp_path))
    (tmp_path / layout.CONFIG_FILE).write_text(json.dumps({"model": "lstm"}))
    assert layout.read_config_dict(str(tmp_path)) == {"model": "lstm"}
