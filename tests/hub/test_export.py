"""Exports (lmkit.hub.export): a GPT-2 or Llama trained from scratch with lmkit's own tokenizer exports as a
Hugging Face folder that transformers reads with the same ids, logits and greedy continuation; a fine-tune
exports with its source folder's config and tokenizer files; what cannot be exported is refused before
anything is written."""
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402  (a test dependency of the main environment: make setup)
from transformers import AutoTokenizer  # noqa: E402

from lmkit.data.errors import DataError  # noqa: E402
from lmkit.data.hf_form import build_form  # noqa: E402
from lmkit.data.tokenizers import train_tokenizer  # noqa: E402
from tests.cli.test_cli_text import write_corpus  # noqa: E402
from tests.helpers import decidable_greedy, run  # noqa: E402

pytestmark = pytest.mark.transformers

# Spaces, tabs, Windows line ends, blank lines, WikiText's <unk> mark, the specials' names, unseen symbols.
TEXTS = ["the old cat sees the garden .", "the café owner  greets\ther naïve neighbour .\r\nthe bird .",
         "\n\nthe river <unk> .\n", "<bos> <pad> <unk> the", "unseen words ✓ here\r", "a\r\r\nb", "\rx", "", "\n",
         "the old cat\n"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("corpus")), lines=100)


@pytest.mark.parametrize("kind", ["word", "char", "byte", "sentencepiece"])
def test_the_exported_tokenizer_gives_lmkits_ids(kind, corpus, tmp_path):
    """transformers' AutoTokenizer on the written tokenizer.json: lmkit's ids for every text (a line break
    first with its special tokens, where lmkit's models start); lmkit reading the folder back gets them too;
    decoding gives lmkit's text (the word kind: a space on each side of a line break; sentencepiece: after
    one)."""
    from lmkit.hub.tokenizer import HFTokenizer
    options = {"vocab_size": 50} if kind == "sentencepiece" else {}
    tokenizer = train_tokenizer(kind, [corpus["train"]], str(tmp_path / "run"), **options)
    out = str(tmp_path / "hf")
    tokenizer.save_hf(out, 64)
    assert sorted(os.listdir(out)) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    reference = AutoTokenizer.from_pretrained(out)
    back = HFTokenizer.from_hf_folder(out)
    eos = tokenizer.eos_id
    with open(corpus["valid"], encoding="utf-8") as f:
        texts = TEXTS + [f.read()]
    for text in texts:
        ids = tokenizer.encode(text)
        got = reference(text, add_special_tokens=False)["input_ids"]
        if kind == "sentencepiece" and "<pad>" in text:  # a control piece: the form reads the text as it
            assert tokenizer.pad_id in got and tokenizer.pad_id not in ids
            continue
        assert got == ids, text
        assert reference(text)["input_ids"] == [eos] + ids, text
        # (lmkit reads the folder line by line, so a line ending in two carriage returns loses both there)
        assert back.encode(text) == ids or "\r\r" in text, text
        assert back.start_ids == [eos]
        decoded = reference.decode(ids)
        if kind == "word":
            decoded = decoded.replace(" \n ", "\n").replace(" \n", "\n").replace("\n ", "\n")
        if kind == "sentencepiece":
            decoded = decoded.replace("\n ", "\n")
        if tokenizer.unk_id not in ids and not (kind == "word" and "<" in text):
            assert decoded == tokenizer.decode(ids), (text, decoded)
    assert (reference.unk_token_id, reference.pad_token_id) == (tokenizer.unk_id, tokenizer.pad_id)


def test_a_bpe_sentencepiece_has_no_form_and_its_export_writes_nothing(corpus, tmp_path):
    from lmkit.hub.converters import converter_for
    from lmkit.hub.export import export_new
    from lmkit.models import build_model
    tokenizer = train_tokenizer("sentencepiece", [corpus["train"]], str(tmp_path / "run"), vocab_size=40,
                                model_type="bpe")
    with pytest.raises(DataError, match=r"a sentencepiece tokenizer of model_type 'bpe' cannot be written as a "
                                        r"Hugging Face tokenizer.json .* --set spm_model_type='unigram'"):
        build_form(tokenizer)
    model = build_model(dict(model="gpt2", vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1,
                             num_heads=2, ffn_dim=32, max_positions=16))
    out = str(tmp_path / "hf")
    with pytest.raises(DataError, match="model_type 'bpe'"):
        export_new(converter_for("gpt2"), model, tokenizer, out)
    assert not os.path.exists(out) and not [n for n in os.listdir(tmp_path) if n.startswith(".export-")]


def test_a_gpt2_with_its_own_attention_dropout_exports_it_as_attn_pdrop(corpus, tmp_path):
    from lmkit.hub.converters import converter_for
    from lmkit.hub.export import export_new
    from lmkit.models import build_model
    tokenizer = train_tokenizer("byte", [corpus["train"]], str(tmp_path / "run"))
    for attention, want in ((None, 0.1), (0.0, 0.0)):
        model = build_model(dict(model="gpt2", vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1,
                                 num_heads=2, ffn_dim=32, max_positions=16, dropout=0.1,
                                 **({} if attention is None else {"attention_dropout": attention})))
        out = str(tmp_path / f"hf_{attention}")
        export_new(converter_for("gpt2"), model, tokenizer, out)
        with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        assert (config["resid_pdrop"], config["embd_pdrop"], config["attn_pdrop"]) == (0.1, 0.1, want)


def _lmkit(*args, timeout=300):
    return run([sys.executable, "-m", "lmkit", *args], timeout=timeout)


@pytest.mark.parametrize("model_name, kind", [("gpt2", "byte"), ("gpt2", "sentencepiece"), ("llama", "char")])
def test_a_model_trained_from_scratch_exports_and_generates_alike(model_name, kind, corpus, tmp_path):
    """lmkit train (a gpt2 or llama model; a byte, sentencepiece or char tokenizer), lmkit export:
    transformers' AutoModelForCausalLM gives lmkit's logits and, from tokenizer(prompt), lmkit's greedy
    continuation; lmkit generate and lmkit evaluate on the exported folder give what they give on the run."""
    from transformers import AutoModelForCausalLM

    from lmkit import distributed as dist
    from lmkit.train.checkpoint import load_model
    run_dir, out = str(tmp_path / "run"), str(tmp_path / "exported")
    res = _lmkit("train", "--train_file", corpus["train"], "--model_dir", run_dir, "--max_steps", "3",
                 "--set", f"model='{model_name}'", "--set", f"tokenizer='{kind}'", "--set", "hidden_size=32",
                 *(["--set", "vocab_size=48"] if kind == "sentencepiece" else []),
                 "--set", "ffn_dim=64", "--set", "num_layers=2", "--set", "num_heads=2", "--set", "batch_size=4",
                 "--set", "num_steps=24", "--set", "max_positions=64", "--set", "learning_rate=0.01",
                 "--set", "warmup_epochs=0.0", "--set", "model.dropout=0.0")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    res = _lmkit("export", "--model_dir", run_dir, "--format", "hf", "--output", out)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    dist.init(backend="local")
    model, tokenizer, _ = load_model(run_dir)
    assert tokenizer.name == kind
    # A text starts after a line break (lmkit's eos id); no end of document.
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == \
        (tokenizer.eos_id, None, tokenizer.pad_id)
    assert config["model_type"] == model_name
    reference = AutoModelForCausalLM.from_pretrained(out).eval()
    reference_tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = "the café owner"
    ids = reference_tokenizer(prompt)["input_ids"]
    assert ids == [tokenizer.eos_id] + tokenizer.encode(prompt)
    logits, _ = model(tf.constant([ids]), None, training=False)
    with torch.no_grad():
        expected_logits = reference(torch.tensor([ids])).logits.numpy()[0]
    np.testing.assert_allclose(logits.numpy()[0], expected_logits, atol=1e-4, rtol=0)
    expected = decidable_greedy(reference, input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                dtype=torch.long), max_new_tokens=8, pad_token_id=tokenizer.pad_id)[0]
    samples = []  # 8 new tokens stay within the 24 positions trained on (the run would slide past them)
    for folder in (run_dir, out):
        res = _lmkit("generate", "--model_dir", folder, "--prompt", prompt, "--strategy", "greedy",
                     "--max_new_tokens", "8", "--one_line")
        assert res.returncode == 0, res.stderr[-3000:]
        samples.append(res.stdout)
    assert samples[0] == samples[1]
    assert samples[0].rstrip("\n") == tokenizer.decode(expected[1:]).replace("\n", "\\n")  # one sample: its text
    # lmkit evaluate reads the export as it reads the run: the same windows give the same loss.
    reports = []
    for folder in (run_dir, out):
        res = _lmkit("evaluate", "--model_dir", folder, "--text_file", corpus["valid"], "--num_steps", "24",
                     "--batch_size", "2", "--json", "--data_cache", "none")
        assert res.returncode == 0, res.stderr[-3000:]
        reports.append(json.loads(res.stdout))
    assert reports[0]["tokens"] == reports[1]["tokens"] > 100
    # The same float32 weights through the same lmkit model on the same CPU: equal but for summation order.
    np.testing.assert_allclose(reports[1]["loss_per_token"], reports[0]["loss_per_token"], rtol=1e-6)


LLAMAS = {
    # grouped-query attention, Llama 3.1's rope scaling, biases on every attention projection, untied
    "llama": dict(num_heads=4, num_kv_heads=2, qkv_bias=True, attention_output_bias=True, tie_weights=False,
                  rope_theta=500.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    # Qwen2's biases (query, key and value only), tied: a Llama with a zero output bias
    "qwen2_biases": dict(num_heads=4, num_kv_heads=2, qkv_bias=True, tie_weights=True),
    # every layer sliding, a head size apart from hidden_size / heads, one key/value head
    "mistral": dict(num_heads=4, num_kv_heads=1, head_dim=16, sliding_window=5, tie_weights=False),
}


@pytest.mark.parametrize("name", sorted(LLAMAS))
def test_a_llama_trained_from_scratch_exports_in_the_family_that_holds_it(name, corpus, tmp_path):
    """A llama model built from lmkit keys (no Hugging Face folder behind it) exports with its word tokenizer:
    transformers' AutoModelForCausalLM reads the family that holds it and computes lmkit's logits, its
    AutoTokenizer gives lmkit's ids, and lmkit reads the config back to the same keys."""
    from transformers import AutoModelForCausalLM

    from lmkit.hub.converters import converter_for
    from lmkit.hub.export import export_new
    from lmkit.models import build_model
    tokenizer = train_tokenizer("word", [corpus["train"]], str(tmp_path / "run"))
    model = build_model(dict(model="llama", vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=2,
                             ffn_dim=48, max_positions=64, **LLAMAS[name]))
    tf.random.set_seed(3)
    for v in model.trainable_variables:  # norms and biases off their initial values too
        v.assign_add(tf.random.normal(v.shape, stddev=0.2))
    out = str(tmp_path / "hf")
    converter = converter_for("llama")
    export_new(converter, model, tokenizer, out)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    family = "mistral" if name == "mistral" else "llama"
    assert config["model_type"] == family
    kept = {k: v for k, v in converter.model_config(config).items()
            if k not in ("head_dim", "keep_prob", "dropout", "init_scale", "qkv_bias", "attention_output_bias")}
    expected = model.get_config()
    assert kept == {k: expected[k] for k in kept}
    reference = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reference).__name__.lower().startswith(family)
    text = "the old cat sees the garden .\nthe bird follows the river ."
    ids = AutoTokenizer.from_pretrained(out)(text)["input_ids"]
    assert ids == [tokenizer.eos_id] + tokenizer.encode(text)
    logits, _ = model(tf.constant([ids]), None, training=False)
    with torch.no_grad():
        expected_logits = reference(torch.tensor([ids])).logits.numpy()[0]
    np.testing.assert_allclose(logits.numpy()[0], expected_logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("keys, message", [
    (dict(sliding_window=4, qkv_bias=True), "Llama has no window, Mistral's every layer slides and it has no biases"),
    (dict(sliding_window=4, layer_types=["sliding_attention"]), "reads a Qwen2 folder .* with its own tokenizer"),
])
def test_a_llama_no_family_holds_is_refused_before_anything_is_written(keys, message, corpus, tmp_path):
    from lmkit.core.errors import UsageError
    from lmkit.hub.converters import converter_for
    from lmkit.hub.export import export_new
    from lmkit.models import build_model
    tokenizer = train_tokenizer("word", [corpus["train"]], str(tmp_path / "run"))
    model = build_model(dict(model="llama", vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1,
                             num_heads=2, ffn_dim=32, max_positions=16, **keys))
    out = str(tmp_path / "hf")
    with pytest.raises(UsageError, match=message):
        export_new(converter_for("llama"), model, tokenizer, out)
    assert not os.path.exists(out)


# ------------------------------------------------------------------ the skeleton, without transformers
LLAMA = dict(vocab_size=31, hidden_size=16, num_layers=2, num_heads=2, ffn_dim=24, max_positions=16)


def _source(folder, **changes):
    """A Llama folder (config, weights, a tokenizer file) of a model of LLAMA's sizes with ``changes``; the model."""
    from lmkit.hub.converters import converter_for
    from lmkit.hub.export import config_json
    from lmkit.hub.safetensors import save_tensors
    from lmkit.models import build_model
    converter = converter_for("llama")
    model = build_model(dict(model="llama", **{**LLAMA, **changes}))
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config_json(converter, converter.arguments(model)), f)
    save_tensors(converter.tensors(model), os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        f.write("{}")
    return model


def test_a_fine_tune_exports_its_weights_with_the_source_folders_files(tmp_path):
    from lmkit import distributed as dist
    from lmkit.hub.converters import converter_for
    from lmkit.hub.export import export
    dist.init(backend="local")
    converter, source, out = converter_for("llama"), str(tmp_path / "source"), str(tmp_path / "out")
    model = _source(source)
    for v in model.trainable_variables:  # the fine-tune moved every weight
        v.assign_add(tf.ones_like(v))
    files = export(converter, model, None, source, out)
    assert files == ["config.json", "model.safetensors", "tokenizer.json"]
    with open(os.path.join(source, "config.json")) as f, open(os.path.join(out, "config.json")) as g:
        assert json.load(g) == {**json.load(f), "torch_dtype": "float32", "dtype": "float32"}
    again = _source(str(tmp_path / "other"))
    converter.load_weights(again, out)
    for a, b in zip(again.variables, model.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_what_cannot_be_exported_is_refused_before_anything_is_written(tmp_path):
    from lmkit import distributed as dist
    from lmkit.core.errors import UsageError
    from lmkit.hub.converters import converter_for
    from lmkit.hub.export import export
    from lmkit.models import build_model
    dist.init(backend="local")
    source, out = str(tmp_path / "source"), str(tmp_path / "out")
    _source(source, hidden_size=32)
    model = build_model(dict(model="llama", **LLAMA))
    cases = [
        (converter_for("llama"), model, source, r"\S+source does not describe this run's model \(its hidden_size is "
                                                r"32, the run's 16\)"),
        (converter_for("llama"), model, str(tmp_path / "gone"), r"the run was fine-tuned from \S+gone, which is gone"),
        (converter_for("bart"), build_model(dict(model="transformer_seq2seq", source_vocab_size=31, **LLAMA)), None,
         r"export --format hf of a transformer_seq2seq run needs the Hugging Face folder it was fine-tuned from"),
        (converter_for("gpt2"), build_model(dict(model="transformer", **LLAMA)), None,
         r"export --format hf needs a model of GPT-2's architecture \(model = 'gpt2'\); this one is "
         r"TransformerLanguageModel with model = 'transformer'"),
    ]
    for converter, model, source, message in cases:
        with pytest.raises(UsageError, match=message):
            export(converter, model, None, source, out)
        assert not os.path.exists(out)
