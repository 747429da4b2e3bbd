"""Run folders of every lmkit version: 0.2's flat config.json and 0.3's sections load, and describe the same model."""
import json
import os

import pytest

from lmkit.config import SECTIONS, TrainConfig, load_config, stored_model_config, stored_setting
from lmkit.config.spelling import FLAT_KEYS

OLD = os.path.join(os.path.dirname(__file__), "data", "config_0_2.json")  # what lmkit 0.2 wrote


def _old():
    with open(OLD, encoding="utf-8") as f:
        return json.load(f)


def test_a_0_2_config_json_loads_with_every_value():
    stored = _old()
    cfg = TrainConfig.from_dict(stored, source="config.json")
    written = cfg.to_dict()
    assert set(written) == set(SECTIONS)  # written back by section...
    flat = {key: value for key, value in stored.items() if key not in ("keep_prob", "model_params")}
    assert {key: stored_setting(written, key) for key in flat} == flat  # ...with every value, key for key
    assert written["model"]["dropout"] == pytest.approx(0.1) and written["model"]["attention_blocks"] == 2
    # Keys newer than 0.2 (the run's plan in steps, its evaluations, the records' text field, the loss's
    # reduction) have their defaults: still a plan in epochs, on plain text, the loss summed.
    newer = set(FLAT_KEYS) - set(stored) - {"dropout"}  # (0.2 wrote keep_prob)
    assert {k: stored_setting(written, k) for k in newer} == {
        "max_steps": 0, "max_tokens": 0, "warmup_steps": 0, "min_lr": 0.0, "eval_every_steps": 0, "eval_steps": 0,
        "text_field": "text", "text_column": "text",
        "data_format": "", "chat_template": "", "train_on_prompt": False, "packing": False,  # records: a stream
        "skip_bad_records": False, "pack_windows": 3,
        "loss_reduction": "sum"}  # and the loss summed over a window, as 0.2 trained
    assert (cfg.model.name, cfg.data.kind, cfg.data.tokenizer, cfg.data.train_file) == (
        "transformer", "text", "char", "train.txt")
    assert cfg.model["dropout"] == pytest.approx(0.1) and cfg.model["attention_blocks"] == 2
    assert cfg.distribution.backend == "native" and cfg.run.seed == 7
    # The model is built from the constructor's arguments: 0.2's values, the dropout for keep_prob, and
    # attention_blocks from model_params; the keys of other models (source_vocab_size, ...) are left out.
    model = cfg.model_config()
    assert {k: model[k] for k in ("max_positions", "num_heads", "ffn_dim", "tie_weights", "attention_blocks")} == {
        "max_positions": 128, "num_heads": 4, "ffn_dim": 1024, "tie_weights": True, "attention_blocks": 2}
    assert model["dropout"] == pytest.approx(0.1) and "keep_prob" not in model
    assert "source_vocab_size" not in model and "forget_bias" not in model


def test_the_stored_model_matches_the_config_that_wrote_it():
    stored = _old()
    cfg = TrainConfig.from_dict(stored)
    mine = {**cfg.model_config(), **{k: getattr(cfg.adapters, k) for k in ("lora_rank", "lora_alpha", "lora_targets")}}
    assert stored_model_config(stored) == mine
    # An older lmkit stored fewer keys: they had their defaults.
    del stored["share_embeddings"], stored["lora_alpha"]
    assert stored_model_config(stored) == mine
    # Keys this lmkit does not know are left out; a sectioned config reads the same.
    assert stored_model_config({**stored, "some_future_key": 1}) == mine
    assert stored_model_config(cfg.to_sections()) == mine == stored_model_config(cfg.to_dict())


def test_a_new_run_writes_config_json_by_section_without_a_deprecated_key():
    cfg = load_config("config_seq2seq_rnn", {"data": "pairs", "source_file": "s", "target_file": "t"})
    stored = json.loads(cfg.to_json())
    assert set(stored) == set(SECTIONS) and "keep_prob" not in cfg.to_json() and "model_params" not in cfg.to_json()
    model = stored["model"]
    assert (model["name"], model["dropout"], stored["data"]["kind"]) == ("rnn_seq2seq", 0.1, "pairs")
    assert (model["cell"], model["attention"], model["bidirectional"]) == ("lstm", "luong", True)
    # Every argument of the constructor is written, the defaults too: a later lmkit rebuilds the same model.
    assert model["embedding_dim"] == 0 and model["max_source_positions"] == 64
    assert TrainConfig.from_dict(stored) == cfg


def test_one_setting_reads_from_either_format():
    old, new = _old(), load_config("config_small").to_dict()
    assert [stored_setting(old, k) for k in ("model", "data", "init_from", "seed")] == ["transformer", "text", "", 7]
    assert [stored_setting(new, k) for k in ("model", "data", "init_from", "seed")] == ["lstm", "ptb", "", 1234]
    assert stored_setting({}, "lora_rank", 0) == 0 and stored_setting({"adapters": {}}, "lora_rank", 5) == 5
