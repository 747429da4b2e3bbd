"""hf:<name> sources (lmkit.hub.download): a folder is used as it is, a Hub name is downloaded with only the files
lmkit reads, and each failure is one message naming the flag and the way around it (no network: the download
is replaced)."""
import re

import pytest

from lmkit.core.errors import UsageError
from lmkit.hub.download import HUB_FILES, TOKENIZER_FILES, resolve_source, tokenizer_folder


def test_a_folder_is_used_as_it_is_and_a_missing_one_names_the_model_types_read(tmp_path):
    from lmkit.models.registry import CONVERTERS
    assert resolve_source(str(tmp_path)) == str(tmp_path)
    assert tokenizer_folder(str(tmp_path)) == str(tmp_path)
    with pytest.raises(UsageError, match=r"--init_from \S+missing is not a folder; pass a Hugging Face model folder "
                                         r"\(model_type " + re.escape(", ".join(CONVERTERS)) + ": "):
        resolve_source(str(tmp_path / "missing"))
    with pytest.raises(UsageError, match=r"--tokenizer hf:\./no/such: \./no/such is not a folder; pass a folder"):
        tokenizer_folder("./no/such")


def test_a_hub_name_downloads_only_the_files_lmkit_reads(tmp_path, monkeypatch):
    import huggingface_hub
    asked = []

    def download(repo_id, allow_patterns):
        asked.append((repo_id, allow_patterns))
        if repo_id == "owner/missing":
            raise OSError("404 Client Error: Repository Not Found\nmore lines")
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    assert resolve_source("hf:owner/model") == str(tmp_path)
    assert asked == [("owner/model", HUB_FILES)]
    assert any(p.endswith(".safetensors") for p in HUB_FILES) and not any("safetensors" in p for p in TOKENIZER_FILES)
    with pytest.raises(UsageError, match=r"--init_from hf:owner/missing: could not download 'owner/missing' from the "
                                         r"Hugging Face Hub \(OSError: 404 Client Error: Repository Not Found\); .* "
                                         r"pass --init_from DIR"):
        resolve_source("hf:owner/missing")
