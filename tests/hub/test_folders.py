"""Hugging Face folders (lmkit.hub.folders): telling one apart, its config.json, and an export's folder, which
appears whole or not at all and never over an existing one."""
import json
import os

import pytest

from lmkit.core.errors import UsageError
from lmkit.hub.folders import (
    check_export_source,
    check_new_folder,
    is_hf_folder,
    model_type_of,
    read_config_json,
    read_json,
    write_folder,
)


def test_a_folder_is_told_apart_by_its_config_and_model_type(tmp_path):
    assert not is_hf_folder(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    assert not is_hf_folder(str(tmp_path))
    with pytest.raises(UsageError, match=r"config\.json is not readable JSON"):
        read_config_json(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match=r"config\.json is not a JSON object"):
        read_json(str(tmp_path / "config.json"))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 3}))
    assert not is_hf_folder(str(tmp_path)) and model_type_of(str(tmp_path))[1] is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "anything"}))
    assert is_hf_folder(str(tmp_path)) and model_type_of(str(tmp_path)) == (str(tmp_path / "config.json"), "anything")
    with pytest.raises(UsageError, match=r"\S+missing is not a Hugging Face model folder: \S+config\.json is missing"):
        read_config_json(str(tmp_path / "missing"))


def test_an_export_needs_a_new_folder_and_its_source(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").touch()
    (tmp_path / "empty").mkdir()
    check_new_folder(str(tmp_path / "empty"))
    check_new_folder(str(tmp_path / "new"))
    with pytest.raises(UsageError, match=r"--output \S+full exists and is not an empty folder; pass a new folder"):
        check_new_folder(str(tmp_path / "full"))
    with pytest.raises(UsageError, match=r"export --format hf of a llama run needs the Hugging Face folder it was "
                                         r"fine-tuned from \(its init_from\)"):
        check_export_source(None, "llama", str(tmp_path / "new"))
    with pytest.raises(UsageError, match=r"fine-tuned from \S+gone, which is gone"):
        check_export_source(str(tmp_path / "gone"), "llama", str(tmp_path / "new"))


def test_a_folder_is_written_whole_or_not_at_all(tmp_path):
    def fill(folder):
        with open(os.path.join(folder, "a.json"), "w") as f:
            f.write("{}")

    assert write_folder(str(tmp_path / "out"), fill) == ["a.json"]
    (tmp_path / "empty").mkdir()
    assert write_folder(str(tmp_path / "empty"), fill) == ["a.json"]  # an empty folder is replaced

    def broken(folder):
        fill(folder)
        raise RuntimeError("the export failed halfway")

    with pytest.raises(RuntimeError):
        write_folder(str(tmp_path / "half"), broken)
    assert sorted(os.listdir(tmp_path)) == ["empty", "out"]  # no half folder, no temporary one
