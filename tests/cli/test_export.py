"""``lmkit export``: which family's converter writes a run, read from its config.json (by section or 0.2's flat
one); exports themselves are tested with each family (tests/models/<family>, tests/hub)."""
import json

import pytest

from lmkit.cli import export
from lmkit.config import load_config
from lmkit.core.errors import UsageError


def _run(tmp_path, stored):
    (tmp_path / "config.json").write_text(json.dumps(stored), encoding="utf-8")
    return str(tmp_path)


def test_a_run_of_a_family_without_a_converter_is_named(tmp_path):
    folder = _run(tmp_path, load_config("config_small").to_dict())
    with pytest.raises(UsageError, match=r"export --format hf writes a model of a family with a Hugging Face "
                                         r"converter \(.*\); .* holds a 'lstm' model, of the rnn family"):
        export._converter(folder, adapters=False)


@pytest.mark.parametrize("flat", [False, True])
def test_peft_asks_for_a_lora_run_in_either_format(tmp_path, flat):
    cfg = load_config("config_gpt2_finetune", {"data": "text", "train_file": "t.txt", "tokenizer": "hf:x"})
    stored = cfg.to_dict()
    if flat:  # as lmkit 0.2 wrote it
        stored = {"model": "gpt2", "lora_rank": 0, "data": "text"}
    folder = _run(tmp_path, stored)
    assert export._converter(folder, adapters=False).title  # the gpt2 family's converter
    with pytest.raises(UsageError, match=r"export --format peft writes the LoRA adapters of a .* run; .* is a "
                                         r"'gpt2' run with lora_rank = 0"):
        export._converter(folder, adapters=True)
