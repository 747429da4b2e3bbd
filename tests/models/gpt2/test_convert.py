"""Hugging Face GPT-2 in and out, against ``transformers`` on PyTorch as the reference.

A small random GPT-2 (2 layers, 32 wide, 4 heads) and a byte-level BPE
tokenizer trained with ``tokenizers`` on generated text are saved with
``save_pretrained``; lmkit must load them exactly (logits to 1e-4, with and
without the key/value cache), generate greedily the same tokens and text,
fine-tune on 2 workers like on one, and export a folder ``transformers``
loads with the same logits. Bad folders exit 2 with one message naming the file.
"""
import json
import os
import random
import re
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402  (a test dependency of the main environment: make setup)
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast  # noqa: E402

from lmkit import decoding
from lmkit import distributed as dist
from lmkit.core.errors import UsageError  # noqa: E402
from lmkit.hub.converters import pretrained_training_config  # noqa: E402
from lmkit.hub.download import resolve_source  # noqa: E402
from lmkit.hub.export import export_new  # noqa: E402
from lmkit.hub.tokenizer import HFTokenizer  # noqa: E402
from lmkit.models.build import load_pretrained  # noqa: E402
from lmkit.models.gpt2.convert import GPT2Converter  # noqa: E402
from tests.cli.test_cli_bad_input import check_one_error  # noqa: E402
from tests.helpers import assert_relatively_close, decidable_greedy, mpirun_cmd, run, subprocess_env  # noqa: E402

pytestmark = pytest.mark.transformers
LMKIT = [sys.executable, "-m", "lmkit"]
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "fast", "blue", "sky", "über", "naïve", "42", "!"]
PROMPTS = ["the cat sat", "über naïve dog ran fast on a", "blue"]
CONVERTER = GPT2Converter()


def make_gpt2_folder(folder, n_embd=32, seed=0):
    """A random GPT-2 and its tokenizer, saved as transformers saves them; returns the corpus path."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(400)]
    os.makedirs(folder, exist_ok=True)
    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    tokenizer = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                  eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=n_embd, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return corpus


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    dist.init(backend="local")
    path = str(tmp_path_factory.mktemp("gpt2") / "tiny")
    make_gpt2_folder(path)
    return path


@pytest.fixture(scope="module")
def loaded(folder):
    model, tokenizer, _ = load_pretrained(folder)
    return model, tokenizer


def reference_logits(folder_or_model, ids):
    model = GPT2LMHeadModel.from_pretrained(folder_or_model) if isinstance(folder_or_model, str) \
        else folder_or_model
    with torch.no_grad():
        return model.eval()(torch.tensor([ids])).logits.numpy()[0]


def test_the_tokenizer_encodes_and_decodes_like_transformers(folder, loaded):
    _, tokenizer = loaded
    reference = AutoTokenizer.from_pretrained(folder)
    for text in PROMPTS + ["  two  spaces", "über-naïve? 42!"]:
        ids = tokenizer.encode(text)
        assert ids == reference(text)["input_ids"]
        assert tokenizer.decode(ids) == reference.decode(ids) == text
    assert tokenizer.vocab_size == len(reference) == 300


def test_logits_equal_transformers_for_prompts_of_different_lengths(folder, loaded):
    model, tokenizer = loaded
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    width = max(map(len, prompts))
    # One right-padded batch: a causal model's logits at a position ignore the padding after it.
    batch = tf.constant([p + [0] * (width - len(p)) for p in prompts])
    logits, _ = model(batch, None, training=False)
    for i, ids in enumerate(prompts):
        expected = reference_logits(folder, ids)
        np.testing.assert_allclose(logits.numpy()[i, :len(ids)], expected, atol=1e-4, rtol=0)
        # With the key/value cache: the first half as one window, then one token at a time.
        state = model.initial_state(1, 32)
        half = max(1, len(ids) // 2)
        first, state = model(tf.constant([ids[:half]]), state)
        rows = [first.numpy()[0]]
        for token in ids[half:]:
            step, state = model.step(tf.constant([token]), state)
            rows.append(step.numpy())
        np.testing.assert_allclose(np.concatenate(rows, axis=0), expected, atol=1e-4, rtol=0)


def test_greedy_generation_equals_transformers(folder, loaded):
    model, tokenizer = loaded
    reference = GPT2LMHeadModel.from_pretrained(folder).eval()
    reference_tokenizer = AutoTokenizer.from_pretrained(folder)
    for text in PROMPTS:
        ids = tokenizer.encode(text)
        expected = decidable_greedy(reference, input_ids=torch.tensor([ids]),
                                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=30, eos_token_id=None, pad_token_id=0)[0]
        assert len(expected) == len(ids) + 30
        got = decoding.decode(model, len(ids) + 30, prompts=[ids]).sequences(include_prompt=True)[0]
        assert got == expected
        assert tokenizer.decode(got) == reference_tokenizer.decode(expected)


def test_generate_reads_the_prompt_as_given_like_transformers(folder):
    # lmkit.generate (the code of `lmkit generate`) on the folder itself: no token before the
    # prompt, the continuation token for token as transformers', line breaks included.
    import lmkit
    reference = GPT2LMHeadModel.from_pretrained(folder).eval()
    reference_tokenizer = AutoTokenizer.from_pretrained(folder)
    samples = lmkit.generate(folder, PROMPTS, strategy="greedy", max_new_tokens=25, return_samples=True)
    for text, sample in zip(PROMPTS, samples):
        ids = reference_tokenizer(text)["input_ids"]
        expected = decidable_greedy(reference, input_ids=torch.tensor([ids]),
                                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=25, eos_token_id=None, pad_token_id=0)[0]
        assert sample.ids == expected and sample.text == reference_tokenizer.decode(expected)
    # The repetition penalty as transformers applies it (greedy: token for token).
    penalized = lmkit.generate(folder, PROMPTS[1], strategy="greedy", max_new_tokens=25,
                               repetition_penalty=1.5, return_samples=True)[0]
    ids = reference_tokenizer(PROMPTS[1])["input_ids"]
    expected = decidable_greedy(reference, input_ids=torch.tensor([ids]),
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=25, eos_token_id=None, pad_token_id=0, repetition_penalty=1.5)[0]
    assert penalized.ids == expected and penalized.ids != samples[1].ids
    # --start_token puts <|endoftext|> first, as a user of transformers would by hand.
    started = lmkit.generate(folder, PROMPTS[0], strategy="greedy", max_new_tokens=10, start_token=True,
                             return_samples=True)[0]
    ids = [reference_tokenizer.eos_token_id] + reference_tokenizer(PROMPTS[0])["input_ids"]
    expected = decidable_greedy(reference, input_ids=torch.tensor([ids]),
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=10, eos_token_id=None, pad_token_id=0)[0]
    assert started.ids == expected[1:]
    # No prompt: a document starts, from <|endoftext|>, as transformers' generate() starts from bos_token_id.
    end = reference_tokenizer.eos_token_id
    [unprompted] = lmkit.generate(folder, None, strategy="greedy", max_new_tokens=10, return_samples=True)
    expected = decidable_greedy(reference, input_ids=torch.tensor([[end]]),
                                attention_mask=torch.ones(1, 1, dtype=torch.long), max_new_tokens=10,
                                eos_token_id=end, pad_token_id=0, stop_id=end)[0][1:]
    if expected and expected[-1] == end:  # an end of text ends it (not text)
        expected = expected[:-1]
    assert unprompted.ids == expected and unprompted.prompt_length == 0


def test_export_loads_in_transformers_with_the_same_logits(folder, loaded, tmp_path):
    model, tokenizer = loaded
    tf.random.set_seed(5)  # weights unlike the original's: the export must carry lmkit's own
    for v in model.trainable_variables:
        v.assign_add(tf.random.normal(v.shape, stddev=0.01))
    try:
        out = str(tmp_path / "exported")
        files = export_new(CONVERTER, model, tokenizer, out)
        assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.json", "merges.txt"} <= set(files)
        reference = GPT2LMHeadModel.from_pretrained(out)
        reference_tokenizer = AutoTokenizer.from_pretrained(out)
        for text in PROMPTS:
            ids = tokenizer.encode(text)
            assert reference_tokenizer(text)["input_ids"] == ids
            logits, _ = model(tf.constant([ids]), None, training=False)
            np.testing.assert_allclose(reference_logits(reference, ids), logits.numpy()[0], atol=1e-4, rtol=0)
        # GPT-2's older layout, vocab.json + merges.txt without tokenizer.json, reads the same.
        os.remove(os.path.join(out, "tokenizer.json"))
        legacy = HFTokenizer.from_hf_folder(out)
        assert [legacy.encode(t) for t in PROMPTS] == [tokenizer.encode(t) for t in PROMPTS]
        with pytest.raises(UsageError, match="exists and is not an empty folder"):
            export_new(CONVERTER, model, tokenizer, out)
    finally:
        CONVERTER.load_weights(model, folder)  # the module's model back to the checkpoint


def test_lmkit_evaluate_reads_a_folder_with_transformers_loss(folder, tmp_path):
    """lmkit evaluate on a Hugging Face folder: its tokenizer, its weights; one window of the whole text
    gives transformers' loss on the same ids, and without --text_file it says the folder has no splits."""
    text_file = str(tmp_path / "text.txt")
    with open(text_file, "w", encoding="utf-8") as f:
        f.write("the cat sat on a mat\nüber naïve dog ran fast\n42 !\n")
    with open(text_file, encoding="utf-8") as f:
        ids = HFTokenizer.from_hf_folder(folder).encode(f.read())
    assert 10 < len(ids) <= 65
    with torch.no_grad():
        expected = GPT2LMHeadModel.from_pretrained(folder).eval()(torch.tensor([ids]),
                                                                   labels=torch.tensor([ids])).loss.item()
    res = run(LMKIT + ["evaluate", "--model_dir", folder, "--text_file", text_file, "--batch_size", "1",
                       "--num_steps", str(len(ids) - 1), "--json", "--data_cache", "none"], timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert report["tokens"] == len(ids) and report["tokenizer"] == "hf"
    assert_relatively_close(report["loss_per_token"], expected, 1e-5)
    res = run(LMKIT + ["evaluate", "--model_dir", folder], timeout=120)
    check_one_error(res, "is a Hugging Face folder, which has no data splits; pass --text_file")


def test_a_pytorch_bin_folder_loads_and_without_pytorch_says_how_to_convert(folder, tmp_path, monkeypatch):
    # What transformers before 4.35 saved (v5 writes safetensors only): a pickled state dict.
    legacy = str(tmp_path / "bin")
    os.makedirs(legacy)
    torch.save(GPT2LMHeadModel.from_pretrained(folder).state_dict(), os.path.join(legacy, "pytorch_model.bin"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(folder, name), legacy)
    assert os.path.isfile(os.path.join(legacy, "pytorch_model.bin"))
    assert not os.path.isfile(os.path.join(legacy, "model.safetensors"))
    model, tokenizer, _ = load_pretrained(legacy)
    ids = tokenizer.encode(PROMPTS[1])
    logits, _ = model(tf.constant([ids]), None, training=False)
    np.testing.assert_allclose(logits.numpy()[0], reference_logits(folder, ids), atol=1e-4, rtol=0)
    monkeypatch.setitem(sys.modules, "torch", None)  # as if PyTorch were not installed
    with pytest.raises(UsageError, match=r"holds only pytorch_model.bin, which needs PyTorch .* convert it once"):
        load_pretrained(legacy)


def _broken(base, tmp_path, name, change):
    path = str(tmp_path / name)
    shutil.copytree(base, path)
    change(path)
    return path


def _edit_config(**values):
    def change(path):
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        config.update(values)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
    return change


def test_bad_folders_exit_2_naming_the_file(folder, tmp_path):
    cases = [
        (_broken(folder, tmp_path, "bert", _edit_config(model_type="bert")),
         r"config\.json: model_type 'bert' is not one lmkit reads; it reads gpt2, llama, qwen2, mistral"),
        (_broken(folder, tmp_path, "noweights", lambda p: os.remove(os.path.join(p, "model.safetensors"))),
         r"holds no weights: model\.safetensors \(or pytorch_model\.bin\) is missing"),
        (_broken(folder, tmp_path, "shapes", _edit_config(n_embd=64)),
         r"model\.safetensors: transformer\.wte\.weight has shape \[300, 32\] but \S+config\.json gives "
         r"\[300, 64\]"),
        (_broken(folder, tmp_path, "vocab", _edit_config(vocab_size=200)),
         r"tokenizer\.json has ids up to 299 but the model's vocab_size is 200"),
        (_broken(folder, tmp_path, "notokenizer", lambda p: os.remove(os.path.join(p, "tokenizer.json"))),
         r"holds no tokenizer: neither tokenizer\.json nor vocab\.json \+ merges\.txt"),
    ]
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: run(LMKIT + ["generate", "--model_dir", c[0], "--prompt", "the cat",
                                                       "--strategy", "greedy"], timeout=240), cases))
    for (_, pattern), res in zip(cases, results):
        check_one_error(res, pattern)


def test_a_window_longer_than_the_checkpoint_allows_is_one_clear_error(folder, tmp_path):
    corpus = os.path.join(folder, "corpus.txt")
    res = run(LMKIT + ["train", "--init_from", folder, "--train_file", corpus, "--model_dir", str(tmp_path / "m")],
              timeout=120)  # config_gpt2_finetune's 128-token windows; this GPT-2 has 64 positions
    check_one_error(res, r"num_steps = 128 \(the training window\) exceeds n_positions = 64 of \S+config\.json; "
                         r"pass --set num_steps=64 or less")
    assert not (tmp_path / "m").exists()


def test_the_checkpoints_dropout_unless_a_set_asks_for_another(folder):
    # The sizes are the checkpoint's; dropout is the recipe's: --set model.dropout wins over the folder's.
    from lmkit.cli.train import build_parser, config_from_args
    corpus = os.path.join(folder, "corpus.txt")
    flags = ["--init_from", folder, "--train_file", corpus, "--set", "num_steps=16"]
    config = config_from_args(build_parser().parse_args(flags))
    assert config.model["dropout"] == 0.0 and config.model["hidden_size"] == 32  # the tiny GPT-2's pdrop, n_embd
    config = config_from_args(build_parser().parse_args(flags + ["--set", "keep_prob=0.8"]))
    assert config.model["dropout"] == pytest.approx(0.2) and config.model["hidden_size"] == 32


def test_a_download_without_a_network_is_one_clear_error(tmp_path):
    env = subprocess_env({"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hub")})
    res = run(LMKIT + ["train", "--init_from", "hf:gpt2", "--train_file", __file__,
                       "--model_dir", str(tmp_path / "m")], timeout=120, env=env)
    check_one_error(res, r"--init_from hf:gpt2: could not download 'gpt2' from the Hugging Face Hub .* pass "
                         r"--init_from DIR")
    assert not (tmp_path / "m").exists()


def test_a_missing_folder_names_every_family_lmkit_reads(tmp_path):
    from lmkit.models.registry import CONVERTERS  # every family's types, in FAMILIES' order
    assert list(CONVERTERS)[:4] == ["gpt2", "llama", "qwen2", "mistral"] and "bart" in CONVERTERS
    with pytest.raises(UsageError, match=r"is not a folder; pass a Hugging Face model folder \(model_type "
                                         + re.escape(", ".join(CONVERTERS)) + ": "):
        resolve_source(str(tmp_path / "missing"))


@pytest.mark.horovod
@pytest.mark.mpi
def test_fine_tuning_on_two_workers_equals_one_then_generate_and_export(folder, tmp_path):
    corpus = os.path.join(folder, "corpus.txt")
    # SGD: Adam's first step moves every entry by about +-lr whatever the gradient's size, so
    # the rounding noise of GPT-2's zero-gradient attention key bias would show up as 1e-7 of 1e-3.
    flags = ["--init_from", folder, "--train_file", corpus, "--max_steps", "1", "--set", "num_steps=16",
             "--set", "batch_size=4", "--set", "optimizer='sgd'", "--set", "learning_rate=0.5",
             "--set", "warmup_epochs=0.0", "--set", "optimizer_params={}"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    first = run(LMKIT + ["train", *flags, "--model_dir", one], timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    second = run(mpirun_cmd(2, ["-m", "lmkit", "train", *flags, "--model_dir", two]), timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    results = [json.load(open(os.path.join(d, "results.json"))) for d in (one, two)]
    assert [r["world_size"] for r in results] == [1, 2]
    loss_one, loss_two = (r["epochs"][0]["train_perplexity"] for r in results)
    assert loss_two == pytest.approx(loss_one, rel=1e-5)  # the same loss of the one step ...
    from lmkit.train.checkpoint import load_model
    model_one, _, _ = load_model(one)
    model_two, tokenizer, config = load_model(two)
    assert config.model.name == "gpt2" and config.checkpoints.init_from == os.path.abspath(folder)
    pretrained, _, _ = load_pretrained(folder)
    moved = False
    for a, b, c in zip(model_two.trainable_variables, model_one.trainable_variables,
                       pretrained.trainable_variables):
        assert_relatively_close(a.numpy(), b.numpy(), 1e-5, a.name)  # ... and the same update
        moved = moved or float(np.max(np.abs(a.numpy() - c.numpy()))) > 1e-4
    assert moved  # the step changed the pretrained weights
    # The fine-tuned run exports to a folder transformers loads, with lmkit's logits.
    exported = str(tmp_path / "exported")
    res = run(LMKIT + ["export", "--model_dir", two, "--format", "hf", "--output", exported], timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    ids = tokenizer.encode(PROMPTS[0])
    logits, _ = model_two(tf.constant([ids]), None, training=False)
    np.testing.assert_allclose(reference_logits(exported, ids), logits.numpy()[0], atol=1e-4, rtol=0)
    # lmkit generate reads the exported Hugging Face folder directly.
    res = run(LMKIT + ["generate", "--model_dir", exported, "--prompt", PROMPTS[0], "--strategy", "greedy",
                       "--max_length", "12", "--verbose", "--one_line"], timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(r"first call \(compiling the decode loop included\) [\d.]+ s; compiled: \d+ tokens in "
                     r"[\d.]+ s, \d+ tokens/sec", res.stderr), res.stderr[-2000:]
    line = res.stdout.strip().splitlines()[-1]  # one sample: its text alone
    assert line.startswith(PROMPTS[0]) and len(line) > len(PROMPTS[0])


def test_lora_on_gpt2_starts_as_the_base_and_exports_merged(folder, loaded, tmp_path):
    """A LoRA run of a GPT-2 folder as lmkit train builds it: base frozen, adapters on qkv, merged on export."""
    from lmkit.config import load_config
    from lmkit.layers.lora import lora_of, merge_lora
    from lmkit.models.build import build_run_model
    config = pretrained_training_config(load_config("config_gpt2_finetune", {
        "data": "text", "train_file": "t.txt", "init_from": folder, "lora_rank": 2, "num_steps": 16}), folder)
    model = build_run_model(config)
    lora = lora_of(model)
    assert sorted(lora.adapters) == ["decoder/layers/0/attention/qkv", "decoder/layers/1/attention/qkv"]
    assert {v.ref() for v in model.trainable_variables} == {v.ref() for v in lora.variables}
    ids = loaded[1].encode(PROMPTS[1])
    np.testing.assert_allclose(model(tf.constant([ids]))[0].numpy()[0], reference_logits(folder, ids),
                               atol=1e-4, rtol=0)  # B = 0: the base
    for i, adapter in enumerate(lora.adapters.values()):
        adapter.b.assign(tf.random.stateless_normal(adapter.b.shape, [i, 7], stddev=0.5))
    adapted = model(tf.constant([ids]))[0].numpy()[0]
    merge_lora(model)
    out = str(tmp_path / "merged")
    export_new(CONVERTER, model, loaded[1], out)
    theirs = reference_logits(out, ids)
    np.testing.assert_allclose(theirs, adapted, atol=1e-4, rtol=0)
    assert np.abs(theirs - reference_logits(folder, ids)).max() > 1e-2
