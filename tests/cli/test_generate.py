"""lmkit.cli.generate: flags mapped onto a planned generation (checked before any model is built), and the output:
one sample's text alone, several labelled. The command end to end: test_cli_text, test_cli_seq2seq, test_chat."""
import io
import sys
from types import SimpleNamespace

import pytest

from lmkit.config import load_config


def _generate(folder, *flags):
    """``lmkit generate`` in this process (a bad flag fails while the generation is planned, before any model)."""
    from lmkit.cli import generate
    return generate.main(["--model_dir", str(folder), *flags])


@pytest.fixture(scope="module")
def word_run(tmp_path_factory):
    """A run folder as far as planning reads it: its config.json and a word tokenizer (no checkpoint)."""
    from lmkit.data.tokenizers import train_tokenizer
    folder = tmp_path_factory.mktemp("run")
    (folder / "text.txt").write_text("the old cat sees a dog\n", encoding="utf-8")
    train_tokenizer("word", str(folder / "text.txt"), str(folder))
    config = load_config("config_small", {"data": "text", "train_file": str(folder / "text.txt"), "tokenizer": "word"})
    (folder / "config.json").write_text(config.to_json(), encoding="utf-8")
    return folder


@pytest.mark.parametrize("flags, match", [
    (["--stream", "--num_samples", "2"], "--stream writes one sample as it comes"),
    (["--stream", "--strategy", "beam"], "--stream writes one sample as it comes"),
    (["--strategy", "beam", "--repetition_penalty", "1.2"], "--repetition_penalty applies to the per-token strategies"),
    (["--repetition_penalty", "0"], r"--repetition_penalty 0.0 must be > 0 \(1 = off\)"),
    (["--min_new_tokens", "-1"], "--min_new_tokens -1 must be an integer >= 0"),
    (["--max_new_tokens", "0"], "--max_new_tokens 0 must be an integer >= 1"),
    (["--temperature", "0"], r"--temperature 0.0 must be > 0 \(use 1e-3 for near-greedy\)"),
    (["--min_p", "1.5"], r"--min_p 1.5 must be in \[0, 1\]"),
    (["--no_repeat_ngram_size", "-2"], "--no_repeat_ngram_size -2 must be an integer >= 0"),
    (["--min_p", "0.1", "--strategy", "greedy"], "--min_p applies to --strategy top_p"),
    (["--strategy", "beam", "--num_samples", "5"], "--num_samples 5 exceeds --beam_width 4: .*; use --beam_width 5"),
    (["--system", "be brief"], "--system gives a chat's system turn; add --chat"),
    (["--source_file", "s.txt"], "--source_file is for an encoder-decoder's run"),
    (["--prompt", "the old", "--max_length", "2"], "--prompt 'the old' has 2 tokens, .*; use --max_length 3"),
    (["--prompt", " "], r"--prompt ' ' is empty after tokenization; .* leave --prompt out"),
    (["--stop", ""], r"--stop '' must be non-empty strings"),
])
def test_generate_flag_errors_name_the_flag_before_any_model_is_built(word_run, flags, match):
    """Each error is a GenerationConfig's or the plan's, spelled as the flag; none needs TensorFlow or a checkpoint."""
    from lmkit.core.errors import UsageError
    with pytest.raises(UsageError, match=match):
        _generate(word_run, *flags)


@pytest.fixture(scope="module")
def pairs_run(tmp_path_factory):
    """An encoder-decoder's run folder as far as planning reads it (config.json, the word tokenizer)."""
    from lmkit.data.tokenizers import train_tokenizer
    folder = tmp_path_factory.mktemp("pairs")
    (folder / "text.txt").write_text("s1 s2 s3\n", encoding="utf-8")
    train_tokenizer("word", str(folder / "text.txt"), str(folder))
    config = load_config("config_seq2seq", {"data": "pairs", "source_file": str(folder / "text.txt"),
                                            "target_file": str(folder / "text.txt")})
    (folder / "config.json").write_text(config.to_json(), encoding="utf-8")
    return folder


@pytest.mark.parametrize("flags, match", [
    (["--batch_size", "0"], "--batch_size 0 must be an integer >= 1"),
    (["--temperature", "0"], r"--temperature 0.0 must be > 0 \(use 1e-3 for near-greedy\)"),
    (["--min_p", "0.1", "--strategy", "greedy"], "--min_p applies to --strategy top_p"),
    (["--num_samples", "2"], "--num_samples 2: greedy decoding writes one output per source; use --strategy"),
    (["--stop", "x"], "--stop applies to language models; .* holds an encoder-decoder"),
    (["--stream"], "--stream applies to language models|--stream writes a language model's sample"),
    (["--chat"], "--chat applies to language models; .* holds an encoder-decoder"),
])
def test_an_encoder_decoders_flags_are_checked_as_a_language_models(pairs_run, flags, match):
    """The sampling and length flags have one set of ranges for both kinds of model (GenerationConfig's)."""
    from lmkit.core.errors import UsageError
    with pytest.raises(UsageError, match=match):
        _generate(pairs_run, "--prompt", "s1 s2", *flags)


def test_the_flags_plan_lmkits_defaults_of_the_command(word_run):
    from lmkit.cli.generate import build_parser, plan_of_flags
    plan = plan_of_flags(build_parser().parse_args(["--model_dir", str(word_run), "--prompt", "the old"]))
    assert plan.budgets == [48] and plan.settings.max_length == 50  # 50 tokens, the prompt included
    assert plan.settings.strategy == "top_p" and isinstance(plan.settings.seed, int)
    plan = plan_of_flags(build_parser().parse_args(["--model_dir", str(word_run), "--max_new_tokens", "7"]))
    assert plan.budgets == [7] and plan.settings.max_length is None and plan.inputs == [None]


def sample(i, j, text):
    return SimpleNamespace(prompt_index=i, sample_index=j, text=text)


@pytest.mark.parametrize("inputs, num_samples, conditional, one_line, samples, printed", [
    (["a"], 1, False, False, [sample(0, 0, "a b\nc")], "a b\nc\n"),  # one sample: its text alone
    (["a", "b"], 1, False, False, [sample(0, 0, "a x"), sample(1, 0, "b y")], "[0.0] a x\n[1.0] b y\n"),
    (["a"], 2, False, False, [sample(0, 0, "a\nx"), sample(0, 1, "a y")], "[0.0] a\nx\n\n[0.1] a y\n"),
    (["a"], 2, False, True, [sample(0, 0, "a\nx"), sample(0, 1, "a y")], "[0.0] a\\nx\n[0.1] a y\n"),
    (["s", "t"], 1, True, False, [sample(0, 0, "x"), sample(1, 0, "y\nz")], "x\ny\\nz\n"),  # a line a source
    (["s"], 2, True, False, [sample(0, 0, "x"), sample(0, 1, "y")], "[0.0] x\n[0.1] y\n"),
])
def test_one_sample_prints_its_text_alone_and_several_are_labelled(monkeypatch, inputs, num_samples, conditional,
                                                                  one_line, samples, printed):
    from lmkit.cli.generate import _Output
    plan = SimpleNamespace(conditional=conditional, inputs=inputs, settings=SimpleNamespace(num_samples=num_samples),
                           single=len(inputs) == 1 and num_samples == 1)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    _Output(SimpleNamespace(one_line=one_line, source_file=None), plan).finish(samples, streamed=False)
    assert out.getvalue() == printed


def test_a_streamed_sample_is_written_as_it_comes_and_ends_its_line(monkeypatch):
    from lmkit.cli.generate import _Output
    plan = SimpleNamespace(conditional=False, inputs=["a"], settings=SimpleNamespace(num_samples=1), single=True)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    output = _Output(SimpleNamespace(one_line=False, source_file=None), plan)
    for piece in ("a", " b\x07", "c"):
        output.write(piece)
    output.finish([sample(0, 0, "a b\x07c")], streamed=True)
    assert out.getvalue() == "a b\\x07c\n"  # control characters escaped, no label
