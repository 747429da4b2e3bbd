"""lmkit.cli.evaluate: its checks before TensorFlow, and its report of how it decoded (the run itself: test_cli_text,
test_cli_seq2seq)."""
import pytest

from lmkit.config import load_config


def test_evaluate_refuses_the_data_cache_for_a_ptb_run(tmp_path):
    import json

    from lmkit.cli import evaluate
    from lmkit.core.errors import UsageError
    (tmp_path / "config.json").write_text(json.dumps(load_config("config_small").to_dict()), encoding="utf-8")
    with pytest.raises(UsageError, match=r"--data_cache is for runs on your own text, but .* trained on PTB"):
        evaluate.main(["--model_dir", str(tmp_path), "--data_cache", "/tmp/x"])


def test_the_report_says_how_the_outputs_were_decoded():
    from lmkit.cli.evaluate import _decoding
    from lmkit.decoding.config import GenerationConfig
    beam, _ = GenerationConfig(strategy="beam", beam_scoring="transformers", no_repeat_ngram_size=3,
                               max_new_tokens=20).resolve(default_strategy="greedy")
    report = _decoding(beam)
    assert (report["strategy"], report["beam_width"], report["length_penalty"], report["beam_scoring"]) == \
        ("beam", 4, 0.6, "transformers")
    assert report["decoding"] == {"beam_width": 4, "length_penalty": 0.6, "scoring": "transformers",
                                  "early_stopping": False, "no_repeat_ngram_size": 3, "forced_first_id": None,
                                  "forced_last_id": None, "min_new_tokens": 0, "max_new_tokens": 20}
    greedy = _decoding(GenerationConfig().resolve(default_strategy="greedy")[0])
    assert greedy["strategy"] == "greedy" and "beam_width" not in greedy
    assert greedy["decoding"]["max_new_tokens"] is None
