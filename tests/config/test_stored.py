"""Run folders of earlier lmkit versions: their flat config.json loads, and describes the same model."""
import json
import os

import pytest

from lmkit.config import TrainConfig, load_config, stored_model_config

OLD = os.path.join(os.path.dirname(__file__), "data", "config_0_2.json")  # what lmkit 0.2 wrote


def _old():
    with open(OLD, encoding="utf-8") as f:
        return json.load(f)


def test_a_0_2_config_json_loads_with_every_value():
    stored = _old()
    cfg = TrainConfig.from_dict(stored, source="config.json")
    written = cfg.to_dict()
    assert {key: written[key] for key in stored} == stored  # written back, key for key
    # Keys newer than 0.2 (the run's plan in steps, its evaluations, the records' text field, the loss's
    # reduction) have their defaults: still a plan in epochs, on plain text, the loss summed.
    assert {k: written[k] for k in set(written) - set(stored)} == {
        "max_steps": 0, "max_tokens": 0, "warmup_steps": 0, "min_lr": 0.0, "eval_every_steps": 0, "eval_steps": 0,
        "text_field": "text", "text_column": "text",
        "loss_reduction": "sum"}  # and the loss summed over a window, as 0.2 trained
    assert (cfg.model, cfg.model.name, cfg.data.kind, cfg.tokenizer, cfg.train_file) == (
        "transformer", "transformer", "text", "char", "train.txt")
    assert cfg.model.dropout == pytest.approx(0.1) and cfg.keep_prob == 0.9
    assert cfg.model.attention_blocks == 2 and cfg.model_params == {"attention_blocks": 2}
    assert cfg.distribution.backend == "native" and cfg.run.seed == 7
    assert cfg.model_config() == {**{k: stored[k] for k in cfg.model_config() if k in stored}, "attention_blocks": 2}


def test_the_stored_model_matches_the_config_that_wrote_it():
    stored = _old()
    cfg = TrainConfig.from_dict(stored)
    mine = {**cfg.model_config(), **{k: getattr(cfg, k) for k in ("lora_rank", "lora_alpha", "lora_targets")}}
    assert stored_model_config(stored) == mine
    # An older lmkit stored fewer keys: they had their defaults.
    del stored["share_embeddings"], stored["lora_alpha"]
    assert stored_model_config(stored) == mine
    # Keys this lmkit does not know are left out; a sectioned config reads the same.
    assert stored_model_config({**stored, "some_future_key": 1}) == mine
    assert stored_model_config(cfg.to_sections()) == mine


def test_a_new_run_writes_the_flat_config_json_that_0_2_read():
    cfg = load_config("config_seq2seq_rnn", {"data": "pairs", "source_file": "s", "target_file": "t"})
    flat = json.loads(cfg.to_json())
    assert flat["model"] == "rnn_seq2seq" and flat["keep_prob"] == 0.9 and flat["data"] == "pairs"
    assert flat["model_params"] == {"cell": "lstm", "attention": "luong", "bidirectional": True}
    assert TrainConfig.from_dict(flat) == cfg
