"""BART checkpoints in (lmkit.models.bart.convert): logits, cached steps and greedy decoding against
transformers' BART on tiny random models; the config and weight checks; ``lmkit generate`` on a BART folder."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402  (a test dependency of the main environment: make setup)
from transformers import BartConfig, BartForConditionalGeneration  # noqa: E402

from lmkit import decoding
from lmkit import distributed as dist
from lmkit.core.errors import UsageError  # noqa: E402
from lmkit.models import build_model  # noqa: E402
from lmkit.models.bart.convert import BartConverter  # noqa: E402
from tests.helpers import decidable_greedy  # noqa: E402

pytestmark = pytest.mark.transformers

SIZES = dict(vocab_size=61, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=24,
             pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
             dropout=0.1, init_std=0.2)
VARIANTS = {
    "bart": {},  # the erf GELU, no embedding scale: bart-base and bart-large
    # the tanh GELU, token embeddings scaled by sqrt(d_model), a deeper decoder
    "scaled": dict(activation_function="gelu_new", scale_embedding=True, decoder_layers=3),
}
# Sources with <s> ... </s> (ids 0 and 2), the second padded (1); teacher-forced decoder inputs from </s>.
SOURCES = [[0, 17, 5, 33, 9, 41, 2], [0, 8, 60, 12, 2, 1, 1]]
SOURCE_MASK = [[1] * 7, [1] * 5 + [0] * 2]
TARGETS = [[2, 0, 11, 19, 4, 27], [2, 0, 50, 3, 3, 2]]
CONVERTER = BartConverter()


def load(folder):
    """lmkit's model of the folder (its config read and checked, its weights loaded)."""
    model = build_model(CONVERTER.model_config(CONVERTER.read_config(folder)))
    CONVERTER.load_weights(model, folder)
    return model


def save_random(folder, **options):
    """A random BART saved as transformers saves it, with every parameter (norms, positions' offset rows and
    the softmax bias included) away from its initial value, so that a wrong mapping shows."""
    torch.manual_seed(0)
    model = BartForConditionalGeneration(BartConfig(**{**SIZES, **options}, attn_implementation="eager")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    """(torch model, folder, lmkit model loaded from it)."""
    dist.init(backend="local")
    folder = str(tmp_path_factory.mktemp(request.param))
    torch_model = save_random(folder, **VARIANTS[request.param])
    return torch_model, folder, load(folder)


def test_logits_equal_transformers_teacher_forced_and_step_by_step(variant):
    torch_model, _, model = variant
    config = model.get_config()  # stored with a run: the same model again
    assert config["embedding_norm"] and config["pre_layer_norm"] is False and config["share_embeddings"]
    assert [(v.name, v.shape) for v in build_model(config).variables] == [(v.name, v.shape) for v in model.variables]
    with torch.no_grad():
        expected = torch_model(input_ids=torch.tensor(SOURCES), attention_mask=torch.tensor(SOURCE_MASK),
                               decoder_input_ids=torch.tensor(TARGETS)).logits.numpy()
    assert np.abs(expected).max() > 1.0  # weights large enough that a wrong term would show
    memory = model.encode(tf.constant(SOURCES), tf.constant(np.array(SOURCE_MASK, bool)))
    logits, _ = model(tf.constant(TARGETS), condition=memory)
    # float32 in both frameworks, summed in other orders through 4-5 layers: 1e-4 of logits of size ~10.
    np.testing.assert_allclose(logits.numpy(), expected, atol=1e-4, rtol=1e-4)
    from tests.helpers import prefill_then_steps
    state = model.initial_state(2, len(TARGETS[0]), condition=memory)
    np.testing.assert_allclose(prefill_then_steps(model, TARGETS, 2, state), expected, atol=1e-4, rtol=1e-4)


def reference_greedy(torch_model, sources, mask, max_new_tokens):
    """transformers' greedy outputs (each up to its </s>), decidable within the logits' tolerance above
    (tests.helpers.decidable_greedy), so lmkit picks the same tokens on any CPU."""
    return decidable_greedy(torch_model, stop_id=2, input_ids=torch.tensor(sources),
                            attention_mask=torch.tensor(mask), max_new_tokens=max_new_tokens,
                            forced_bos_token_id=None, forced_eos_token_id=None, no_repeat_ngram_size=0, min_length=0)


def test_greedy_decoding_equals_transformers(variant):
    torch_model, _, model = variant
    expected = reference_greedy(torch_model, SOURCES, SOURCE_MASK, 15)
    memory = model.encode(tf.constant(SOURCES), tf.constant(np.array(SOURCE_MASK, bool)))
    result = decoding.decode(model, 16, prompts=[[2], [2]], eos_id=2, pad_id=1, condition=memory)
    assert [result.ids[row, :result.lengths[row]].tolist() for row in range(2)] == expected


def test_bad_configs_are_named(tmp_path):
    folder = tmp_path / "bart"
    folder.mkdir()
    config = {**SIZES, "model_type": "bart", "activation_function": "gelu"}
    for change, pattern in [({"model_type": "t5"}, "model_type 't5' is not one of bart"),
                            ({"d_model": 0}, "d_model = 0 must be a positive integer"),
                            ({"decoder_attention_heads": 2}, "encoder_attention_heads = 4 and decoder_attention"),
                            ({"decoder_ffn_dim": 64}, "encoder_ffn_dim = 48 and decoder_ffn_dim = 64 differ"),
                            ({"activation_function": "swish"}, "activation_function 'swish' is not supported"),
                            ({"add_final_layer_norm": True}, "mBART's layout"),
                            ({"tie_word_embeddings": False}, "tie_word_embeddings = false"),
                            ({"decoder_start_token_id": None}, "decoder_start_token_id = None must be a token id")]:
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(UsageError, match=pattern):
            CONVERTER.read_config(str(folder))


def test_weights_of_another_model_are_refused_whole(tmp_path):
    from safetensors.numpy import load_file, save_file
    folder = str(tmp_path / "bart")
    save_random(folder)
    model = build_model(CONVERTER.model_config(CONVERTER.read_config(folder)))
    before = [v.numpy().copy() for v in model.variables]
    weights = load_file(os.path.join(folder, "model.safetensors"))
    for name, edit, pattern in [
            ("extra", lambda w: {**w, "model.encoder.layers.9.fc1.weight": np.zeros([2, 2], np.float32)},
             "holds model.encoder.layers.9.fc1.weight"),
            ("missing", lambda w: {k: v for k, v in w.items() if k != "model.decoder.layers.1.fc2.bias"},
             "lacks model.decoder.layers.1.fc2.bias"),
            ("shape", lambda w: {**w, "model.decoder.layers.0.encoder_attn.k_proj.weight": np.zeros([32, 16],
                                                                                                   np.float32)},
             r"model\.safetensors: model\.decoder\.layers\.0\.encoder_attn\.k_proj\.weight has shape \[32, 16\] but "
             r"\S+config\.json gives \[32, 32\]")]:
        bad = os.path.join(str(tmp_path), name)
        os.makedirs(bad)
        save_file(edit(dict(weights)), os.path.join(bad, "model.safetensors"))
        with open(os.path.join(folder, "config.json")) as src, open(os.path.join(bad, "config.json"), "w") as dst:
            dst.write(src.read())
        with pytest.raises(UsageError, match=pattern):
            CONVERTER.load_weights(model, bad)
    for was, variable in zip(before, model.variables):  # nothing assigned by a refused checkpoint
        np.testing.assert_array_equal(variable.numpy(), was)


# ------------------------------------------------------------------ the commands on a BART folder
def make_bart_folder(folder):
    """A random BART with a byte-level BPE tokenizer (<s>, <pad>, </s>, <unk> as ids 0-3; <s> tokens </s> with
    special tokens, as BART's), saved as transformers saves them; returns the transformers tokenizer and model."""
    import random

    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "fast", "blue", "sky", "über", "42", "!"]
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(200)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines, vocab_size=120, min_frequency=1, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    from tokenizers.processors import RobertaProcessing
    bpe._tokenizer.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))  # as bart-base's tokenizer.json
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", pad_token="<pad>",
                                        eos_token="</s>", unk_token="<unk>")
    os.makedirs(folder, exist_ok=True)
    tokenizer.save_pretrained(folder)
    return tokenizer, save_random(folder, vocab_size=len(tokenizer))


def test_the_folders_tokenizer_frames_texts_as_bart_does(tmp_path):
    from lmkit.data.errors import DataError
    from lmkit.data.tokenizers import load_tokenizer
    from lmkit.hub.tokenizer import HFTokenizer
    folder = str(tmp_path / "bart")
    theirs, _ = make_bart_folder(folder)
    target = HFTokenizer.from_hf_folder(folder)
    source = target.source_side()
    text = "the cat sat on a mat"
    assert source.encode(text) == theirs(text)["input_ids"]  # transformers' framing: <s> tokens </s>
    assert target.encode(text) == theirs(text)["input_ids"][:-1]  # the end id follows in training
    assert source.encode_batch([text, "über 42"]) == [theirs(t)["input_ids"] for t in (text, "über 42")]
    assert (target.bos_id, target.eos_id, target.pad_id) == (2, 2, 1)  # decoder start, end, padding
    assert target.decode([2, 0, *theirs(text, add_special_tokens=False)["input_ids"], 2, 1]) == text
    assert len({source.fingerprint(), target.fingerprint(), HFTokenizer(target.hf).fingerprint()}) == 3
    target.save(str(tmp_path / "run"))  # a run keeps the framing without the folder
    again = load_tokenizer(str(tmp_path / "run"))
    assert again.framing == target.framing and again.source_side().encode(text) == source.encode(text)
    with pytest.raises(DataError, match="framing .* must have the keys"):
        HFTokenizer(target.hf, framing={"bos": 2})
    with pytest.raises(DataError, match="framing prefix = \\[-1\\] must hold token ids"):
        HFTokenizer(target.hf, framing={**target.framing, "prefix": [-1]})
    with pytest.raises(DataError, match="framing suffix = 2 must hold token ids \\(a list\\)"):
        HFTokenizer(target.hf, framing={**target.framing, "suffix": 2})


def test_a_runs_framed_tokenizer_is_reused_when_the_run_goes_on(tmp_path):
    """A BART fine-tune resumed (the same `lmkit train` again) asks for the folder's tokenizer again: the one
    saved in the run is reused, its framing (read from the folder, never asked for) kept."""
    from lmkit.data.tokenizers import train_tokenizer
    folder, run = str(tmp_path / "bart"), str(tmp_path / "run")
    make_bart_folder(folder)
    os.makedirs(run)
    first = train_tokenizer("hf", [], run, source=folder)
    again = train_tokenizer("hf", [], run, source=folder)
    assert again.framing == first.framing is not None and again.end_ids == []


def _lmkit(*args):
    import subprocess
    import sys

    from tests.helpers import ROOT, subprocess_env
    return subprocess.run([sys.executable, "-m", "lmkit", *args], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=600)


def test_generate_and_evaluate_a_bart_folder_on_the_command_line(tmp_path):
    folder = str(tmp_path / "bart")
    tokenizer, torch_model = make_bart_folder(folder)
    sources = ["the cat sat on a mat", "blue sky !", "über 42"]
    expected = []
    for text in sources:  # BART's framing: <s> tokens </s> in, </s> <s> ... </s> out
        ids = [0] + tokenizer(text, add_special_tokens=False)["input_ids"] + [2]
        out = reference_greedy(torch_model, [ids], [[1] * len(ids)], 10)[0]
        expected.append(tokenizer.decode(out, skip_special_tokens=True).replace("\n", " "))
    source_file = tmp_path / "sources.txt"
    source_file.write_text("\n".join(sources) + "\n", encoding="utf-8")
    res = _lmkit("generate", "--model_dir", folder, "--source_file", str(source_file), "--max_new_tokens", "10")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines() == expected and all(expected), expected  # no empty output passes by chance
    res = _lmkit("generate", "--model_dir", folder, "--prompt", sources[1], "--max_new_tokens", "10",
                 "--strategy", "beam", "--beam_width", "3", "--num_samples", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert [line[:6] for line in res.stdout.splitlines()] == ["[0.0] ", "[0.1] "], res.stdout
    # lmkit evaluate: the perplexity of transformers' loss on the pairs (labels <s> tokens </s>).
    targets = ["the dog ran fast", "a blue mat", "sky 42 !"]
    target_file = tmp_path / "targets.txt"
    target_file.write_text("\n".join(targets) + "\n", encoding="utf-8")
    total, count = 0.0, 0
    for source, target in zip(sources, targets):
        labels = [0] + tokenizer(target, add_special_tokens=False)["input_ids"] + [2]
        with torch.no_grad():
            loss = torch_model(input_ids=torch.tensor([[0] + tokenizer(source, add_special_tokens=False)["input_ids"]
                                                       + [2]]), labels=torch.tensor([labels])).loss.item()
        total, count = total + loss * len(labels), count + len(labels)
    res = _lmkit("evaluate", "--model_dir", folder, "--source_file", str(source_file), "--target_file",
                 str(target_file), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert report["target_tokens"] == count and report["pairs"] == 3
    # float32 sums of 3 x ~8 token losses in two frameworks: 1e-5 relative
    assert report["perplexity"] == pytest.approx(float(np.exp(total / count)), rel=1e-5)
    res = _lmkit("evaluate", "--model_dir", folder)
    assert res.returncode == 2 and "has no data splits; pass --source_file and --target_file" in res.stderr
    # Fine-tuning from the folder (--init_from) on pairs: with a learning rate of 1e-30 the weights stay
    # the folder's, and the run's own test perplexity is transformers' on the same pairs.
    train_src, train_tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    train_src.write_text("\n".join(sources * 8) + "\n", encoding="utf-8")
    train_tgt.write_text("\n".join(targets * 8) + "\n", encoding="utf-8")
    flags = ["train", "--init_from", folder, "--source_file", str(train_src), "--target_file", str(train_tgt),
             "--test_source_file", str(source_file), "--test_target_file", str(target_file),
             "--set", "batch_size=8", "--set", "warmup_epochs=0.0", "--set", "model.dropout=0.0"]
    frozen, tuned = str(tmp_path / "frozen"), str(tmp_path / "tuned")
    res = _lmkit(*flags, "--model_dir", frozen, "--max_steps", "1", "--set", "learning_rate=1e-30")
    assert res.returncode == 0, res.stderr[-3000:]
    with open(os.path.join(frozen, "results.json"), encoding="utf-8") as f:
        # the trainer's batched float32 evaluation against transformers': 1e-5 relative
        assert json.load(f)["test_perplexity"] == pytest.approx(report["perplexity"], rel=1e-5)
    with open(os.path.join(frozen, "config.json"), encoding="utf-8") as f:
        saved = json.load(f)
    model = saved["model"]  # config.json by section
    assert model["name"] == "transformer_seq2seq" and saved["data"]["kind"] == "pairs" and model["share_embeddings"]
    assert model["dropout"] == 0.0  # --set keep_prob wins over the folder's dropout (0.1)
    assert model["embedding_norm"] is True
    # 12 steps of AdamW at 1e-3 on 24 pairs: the test perplexity falls, and the run generates and evaluates.
    res = _lmkit(*flags, "--model_dir", tuned, "--max_steps", "12", "--set", "learning_rate=1e-3")
    assert res.returncode == 0, res.stderr[-3000:]
    with open(os.path.join(tuned, "results.json"), encoding="utf-8") as f:
        assert json.load(f)["test_perplexity"] < report["perplexity"] / 2
    res = _lmkit("generate", "--model_dir", tuned, "--source_file", str(source_file), "--max_new_tokens", "10")
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 3, res.stderr[-3000:]
    # The tuned run exports to a BART folder that transformers loads, with lmkit's logits.
    exported = str(tmp_path / "exported")
    res = _lmkit("export", "--model_dir", tuned, "--format", "hf", "--output", exported)
    assert res.returncode == 0, res.stderr[-3000:]
    from lmkit.train.checkpoint import load_model
    model, _, _ = load_model(tuned)
    with torch.no_grad():
        theirs = BartForConditionalGeneration.from_pretrained(exported).eval()(
            input_ids=torch.tensor(SOURCES), attention_mask=torch.tensor(SOURCE_MASK),
            decoder_input_ids=torch.tensor(TARGETS)).logits.numpy()
    mine, _ = model(tf.constant(TARGETS), condition=model.encode(tf.constant(SOURCES),
                                                                 tf.constant(np.array(SOURCE_MASK, bool))))
    np.testing.assert_allclose(mine.numpy(), theirs, atol=1e-4, rtol=1e-4)
    assert os.path.isfile(os.path.join(exported, "tokenizer.json"))


def test_lora_fine_tunes_a_bart_folder_and_exports_merged(tmp_path):
    """lmkit train --init_from <BART> --lora_rank 2: adapters on every attention's input projections only,
    the base frozen; the run generates, and `lmkit export --format hf` merges the adapters into a folder
    transformers loads with the run's logits, which the training moved off the base's."""
    folder = str(tmp_path / "bart")
    tokenizer, torch_model = make_bart_folder(folder)
    sources, targets = ["the cat sat on a mat", "blue sky !", "über 42"], ["the dog ran fast", "a blue mat", "sky 42"]
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    src.write_text("\n".join(sources * 8) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(targets * 8) + "\n", encoding="utf-8")
    run = str(tmp_path / "lora")
    res = _lmkit("train", "--init_from", folder, "--source_file", str(src), "--target_file", str(tgt),
                 "--model_dir", run, "--max_steps", "6", "--lora_rank", "2", "--set", "batch_size=8",
                 "--set", "warmup_epochs=0.0", "--set", "model.dropout=0.0", "--set", "learning_rate=1e-2")
    assert res.returncode == 0, res.stderr[-3000:]
    from lmkit.layers.lora import lora_of
    from lmkit.train.checkpoint import load_model
    model, _, _ = load_model(run)  # the base from the folder, the adapters from the run, merged
    assert lora_of(model) is None
    with open(os.path.join(run, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["adapters"]["lora_rank"] == 2
    # Which layers were adapted: the run unmerged, as `lmkit train` built it.
    built, _, _ = load_model(run, merge_adapters=False)
    paths = sorted(lora_of(built).adapters)
    assert paths == sorted([f"decoder/layers/{i}/{p}" for i in range(2)
                            for p in ("attention/qkv", "cross_attention/query", "cross_attention/key_value")]
                           + [f"encoder/layers/{i}/attention/{p}" for i in range(2) for p in ("query", "key_value")])
    assert {v.ref() for v in built.trainable_variables} == {v.ref() for v in lora_of(built).variables}
    res = _lmkit("generate", "--model_dir", run, "--source_file", str(src), "--max_new_tokens", "6")
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 24, res.stderr[-3000:]
    exported = str(tmp_path / "merged")
    res = _lmkit("export", "--model_dir", run, "--format", "hf", "--output", exported)
    assert res.returncode == 0, res.stderr[-3000:]
    with torch.no_grad():
        batch = dict(input_ids=torch.tensor(SOURCES), attention_mask=torch.tensor(SOURCE_MASK),
                     decoder_input_ids=torch.tensor(TARGETS))
        theirs = BartForConditionalGeneration.from_pretrained(exported).eval()(**batch).logits.numpy()
        base = torch_model(**batch).logits.numpy()
    mine, _ = model(tf.constant(TARGETS), condition=model.encode(tf.constant(SOURCES),
                                                                 tf.constant(np.array(SOURCE_MASK, bool))))
    np.testing.assert_allclose(mine.numpy(), theirs, atol=1e-4, rtol=1e-4)
    assert np.abs(theirs - base).max() > 1e-2  # the adapters trained: the merged model is not the base
    res = _lmkit("export", "--model_dir", run, "--format", "peft", "--output", str(tmp_path / "peft"))
    assert res.returncode == 2 and "export --format peft writes the LoRA adapters of a Llama" in res.stderr
