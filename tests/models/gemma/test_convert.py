"""lmkit's gemma model against transformers' GemmaForCausalLM (a tiny random model, no download): the logits,
greedy generation from the command line, a fine-tune on 2 workers and its export, an export from scratch and
the LoRA adapters' export."""
import json
import math
import os
import random
import sys

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402  (a test dependency of the main environment: make setup)
from transformers import AutoTokenizer, GemmaConfig, GemmaForCausalLM  # noqa: E402

from lmkit import distributed as dist  # noqa: E402
from lmkit.hub.export import export_new  # noqa: E402
from lmkit.hub.peft import export_adapters  # noqa: E402
from lmkit.models import build_model  # noqa: E402
from lmkit.models.gemma.convert import GemmaConverter  # noqa: E402
from tests.helpers import decidable_greedy, mpirun_cmd, prefill_then_steps, run  # noqa: E402

pytestmark = pytest.mark.transformers

# A head size (16) apart from hidden_size / heads (12), grouped-query attention, Gemma's tied softmax.
SIZES = dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, initializer_range=0.2)
IDS = [[5, 17, 3, 88, 42, 42, 7, 1, 60, 13, 2, 96], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 50, 51]]
PROMPT = "the cat sat"
END = "<|endoftext|>"
CONVERTER = GemmaConverter()


def load(folder):
    """lmkit's model of the folder (its config read and checked, its weights loaded)."""
    model = build_model(CONVERTER.model_config(CONVERTER.read_config(folder)))
    CONVERTER.load_weights(model, folder)
    return model


def make_gemma_folder(folder, seed=0):
    """A random Gemma (its norm weights off zero) with a byte-level BPE tokenizer, saved as transformers saves
    them; returns (the corpus, the torch model)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "fast", "blue", "sky", "über", "42", "!"]
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(60)]
    os.makedirs(folder, exist_ok=True)
    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines, vocab_size=200, min_frequency=1, special_tokens=[END])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=END, eos_token=END)
    tokenizer.save_pretrained(folder)
    end = tokenizer.convert_tokens_to_ids(END)
    torch.manual_seed(seed)
    config = GemmaConfig(**SIZES, vocab_size=len(tokenizer), bos_token_id=end, eos_token_id=end, pad_token_id=end,
                         attn_implementation="eager")
    model = GemmaForCausalLM(config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("norm.weight"):  # zeros as initialised: 1 + w and w would give the same logits
                weight.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    return corpus, model


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(folder, corpus, torch model, lmkit model loaded from the folder)."""
    dist.init(backend="local")
    folder = str(tmp_path_factory.mktemp("gemma"))
    corpus, torch_model = make_gemma_folder(folder)
    return folder, corpus, torch_model, load(folder)


def _reference(torch_model, ids=IDS):
    with torch.no_grad():
        return torch_model(torch.tensor(ids)).logits.numpy()


def _lmkit(*args, launcher=(), timeout=300):
    return run([*launcher, sys.executable, "-m", "lmkit", *args], timeout=timeout)


def test_logits_equal_transformers_with_and_without_the_cache(gemma):
    folder, _, torch_model, model = gemma
    assert model.get_config()["model"] == "gemma" and model.embedding_scale == math.sqrt(48)
    expected = _reference(torch_model)
    logits, _ = model(tf.constant(IDS))
    np.testing.assert_allclose(logits.numpy(), expected, atol=1e-4, rtol=1e-4)
    assert np.abs(expected).max() > 0.5  # large enough weights that a wrong term would show
    # Cached: 5 tokens as one window, then one at a time.
    np.testing.assert_allclose(prefill_then_steps(model, IDS, 5, model.initial_state(2, 16)), expected,
                               atol=1e-4, rtol=1e-4)


def test_bfloat16_compute_stays_close(gemma):
    # (lmkit's RMSNorm rounds the scale and the normalized value to bfloat16 before it multiplies them, as
    # Llama's does; Gemma's multiplies in float32 and rounds the product: close, not equal)
    from lmkit.layers import precision
    _, _, torch_model, model = gemma
    expected = _reference(torch_model)
    with precision.scope("mixed_bfloat16"):
        logits, _ = model(tf.constant(IDS))
    assert logits.dtype == tf.float32
    assert np.abs(logits.numpy() - expected).max() < 0.1 * np.abs(expected).max()


def test_greedy_generation_from_the_command_line_equals_transformers(gemma):
    import lmkit
    folder, _, torch_model, _ = gemma
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    expected = decidable_greedy(torch_model, input_ids=torch.tensor([ids]), max_new_tokens=12, eos_token_id=None,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long), pad_token_id=0)[0]
    assert tokenizer.convert_tokens_to_ids(END) not in expected[len(ids):]  # 12 new tokens, none ends the text
    res = _lmkit("generate", "--model_dir", folder, "--prompt", PROMPT, "--strategy", "greedy",
                 "--max_new_tokens", "12", "--one_line")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == tokenizer.decode(expected).replace("\n", "\\n"), res.stdout  # its text alone
    [sample] = lmkit.generate(folder, PROMPT, max_new_tokens=12, strategy="greedy", return_samples=True)
    assert sample.ids == expected  # token for token


@pytest.mark.horovod
@pytest.mark.mpi
def test_fine_tune_on_two_workers_and_export_to_a_folder_transformers_loads(gemma, tmp_path):
    from lmkit.core.layout import CHECKPOINT_DIR, CONFIG_FILE, RESULTS_FILE
    from lmkit.train.checkpoint import load_model
    folder, corpus, torch_model, pretrained = gemma
    run_dir = str(tmp_path / "run")
    res = _lmkit("train", "--init_from", folder, "--train_file", corpus, "--model_dir", run_dir, "--num_epochs", "1",
                 "--set", "num_steps=16", "--set", "batch_size=4", "--set", "optimizer='sgd'",
                 "--set", "learning_rate=0.2", "--set", "warmup_epochs=0.0", "--set", "optimizer_params={}",
                 launcher=mpirun_cmd(2, [])[:-1])
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    with open(os.path.join(run_dir, CONFIG_FILE)) as f:
        saved = json.load(f)
    assert saved["model"]["name"] == "gemma" and saved["model"]["head_dim"] == 16  # config.json by section
    with open(os.path.join(run_dir, RESULTS_FILE)) as f:
        results = json.load(f)
    assert results["world_size"] == 2 and results["global_step"] >= 1
    assert math.isfinite(results["final_train_perplexity"]), results
    assert any(name.startswith("ckpt-") for name in os.listdir(os.path.join(run_dir, CHECKPOINT_DIR)))
    model, _, _ = load_model(run_dir)
    moved = max(float(np.abs(a.numpy() - b.numpy()).max())
                for a, b in zip(model.trainable_variables, pretrained.trainable_variables))
    assert moved > 1e-4
    # lmkit export: transformers' Gemma computes the run's logits.
    exported = str(tmp_path / "exported")
    res = _lmkit("export", "--model_dir", run_dir, "--format", "hf", "--output", exported)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(os.path.join(exported, "config.json")) as f:
        assert json.load(f)["model_type"] == "gemma"
    theirs = _reference(GemmaForCausalLM.from_pretrained(exported).eval())
    np.testing.assert_allclose(model(tf.constant(IDS))[0].numpy(), theirs, atol=1e-4, rtol=1e-4)
    assert np.abs(theirs - _reference(torch_model)).max() > 1e-3  # the fine-tune shows


def test_a_gemma_trained_from_scratch_exports_as_a_folder_transformers_reads(gemma, tmp_path):
    """A gemma model built from lmkit keys, with lmkit's own word tokenizer: transformers' Gemma computes its
    logits, AutoTokenizer gives lmkit's ids, and the config reads back to the same keys."""
    from lmkit.data.tokenizers import train_tokenizer
    _, corpus, _, _ = gemma
    tokenizer = train_tokenizer("word", [corpus], str(tmp_path / "run"))
    model = build_model(dict(model="gemma", vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=2,
                             num_heads=2, num_kv_heads=1, head_dim=24, ffn_dim=48, max_positions=64,
                             attention_bias=True, tie_weights=False,
                             rope_scaling={"rope_type": "linear", "factor": 2.0}))
    tf.random.set_seed(3)
    for v in model.trainable_variables:  # norms and biases off their initial values too
        v.assign_add(tf.random.normal(v.shape, stddev=0.2))
    out = str(tmp_path / "hf")
    export_new(CONVERTER, model, tokenizer, out)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == "gemma" and CONVERTER.model_config(config) == model.get_config()
    ids = AutoTokenizer.from_pretrained(out)("the cat sat on")["input_ids"]
    assert ids == [tokenizer.eos_id] + tokenizer.encode("the cat sat on")
    theirs = _reference(GemmaForCausalLM.from_pretrained(out).eval(), [ids])
    np.testing.assert_allclose(model(tf.constant([ids]))[0].numpy(), theirs, atol=1e-4, rtol=1e-4)


def test_lora_adapters_export_as_a_peft_folder(gemma, tmp_path):
    from peft import PeftModel

    from lmkit.layers.lora import add_lora
    folder, _, torch_model, _ = gemma
    model = load(folder)
    lora = add_lora(model, rank=2, alpha=4.0, targets=("query", "value", "down"))
    tf.random.set_seed(5)
    for adapter in lora.adapters.values():  # B starts at zero: moved, so the adapters change the logits
        adapter.b.assign(tf.random.normal(adapter.b.shape, stddev=0.3))
    out = str(tmp_path / "adapters")
    export_adapters(CONVERTER, model, folder, out)
    ours = model(tf.constant(IDS))[0].numpy()
    with torch.no_grad():
        peft_model = PeftModel.from_pretrained(GemmaForCausalLM.from_pretrained(folder), out).eval()
        np.testing.assert_allclose(peft_model(torch.tensor(IDS)).logits.numpy(), ours, atol=1e-4, rtol=1e-4)
    assert np.abs(ours - _reference(torch_model)).max() > 1e-3
