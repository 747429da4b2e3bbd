"""lmkit's llama model against transformers' Llama, Qwen2 and Mistral (tiny random models, no download)."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402  (a test dependency of the main environment: make setup)
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from lmkit import decoding
from lmkit import distributed as dist
from lmkit.core.errors import UsageError  # noqa: E402
from lmkit.hub.safetensors import weight_files  # noqa: E402
from lmkit.models import build_model  # noqa: E402
from lmkit.models.llama.convert import LlamaConverter  # noqa: E402
from tests.helpers import decidable_greedy  # noqa: E402

pytestmark = pytest.mark.transformers

SIZES = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2)
FAMILIES = {
    # grouped-query attention, Llama 3.1's rope scaling, biases on every attention projection
    "llama": (LlamaConfig, LlamaForCausalLM,
              dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                   attention_bias=True, rope_theta=500.0)),
    # q/k/v biases, tied embeddings, the second layer sliding over 4 positions
    "qwen2": (Qwen2Config, Qwen2ForCausalLM,
              dict(tie_word_embeddings=True, use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    # a sliding window on every layer, head_dim apart from hidden_size / heads, multi-query attention
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=5, head_dim=16, num_key_value_heads=1)),
}
IDS = [[5, 17, 3, 88, 42, 42, 7, 1, 60, 13, 2, 96], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 50, 51]]
CONVERTER = LlamaConverter()


def load(folder):
    """lmkit's model of the folder (its config read and checked, its weights loaded)."""
    model = build_model(CONVERTER.model_config(CONVERTER.read_config(folder)))
    CONVERTER.load_weights(model, folder)
    return model


def reference(family, folder):
    model = FAMILIES[family][1].from_pretrained(folder).eval()
    with torch.no_grad():
        return model, model(torch.tensor(IDS)).logits.numpy()


def save_random(name, folder, **options):
    """A random model of family ``name`` saved as transformers saves it; returns the torch model."""
    config_cls, model_cls, extra = FAMILIES[name]
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**SIZES, **extra}, attn_implementation="eager")).eval()
    model.save_pretrained(folder, **options)
    return model


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(name, folder, lmkit model loaded from it)."""
    dist.init(backend="local")
    name = request.param
    folder = str(tmp_path_factory.mktemp(name))
    save_random(name, folder)
    return name, folder, load(folder)


def test_logits_equal_transformers_with_and_without_the_cache(family):
    name, folder, model = family
    _, expected = reference(name, folder)
    logits, _ = model(tf.constant(IDS))
    np.testing.assert_allclose(logits.numpy(), expected, atol=1e-4, rtol=1e-4)
    assert np.abs(expected).max() > 0.5  # large enough weights that a wrong term would show
    # Cached: 5 tokens as one window, then one at a time, past the sliding windows.
    from tests.helpers import prefill_then_steps
    np.testing.assert_allclose(prefill_then_steps(model, IDS, 5, model.initial_state(2, 16)), expected, atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("blocks", [3, 5])
def test_attention_blocks_keep_transformers_logits_and_the_gradients(family, blocks):
    # model_params = {"attention_blocks": B} on a checkpoint (grouped heads, sliding windows, multi-query):
    # the logits of transformers, and the gradients of one block.
    name, folder, model = family
    _, expected = reference(name, folder)
    blocked = build_model({**model.get_config(), "attention_blocks": blocks})
    assert blocked.get_config()["attention_blocks"] == blocks and "attention_blocks" not in model.get_config()
    for mine, theirs in zip(blocked.variables, model.variables):
        mine.assign(theirs)
    ids = tf.constant(IDS)
    results = []
    for each in (model, blocked):
        with tf.GradientTape() as tape:
            logits, _ = each(ids, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(ids[:, 1:], logits[:, :-1]))
        results.append([logits] + [tf.convert_to_tensor(g) for g in tape.gradient(loss, each.trainable_variables)])
    np.testing.assert_allclose(results[1][0].numpy(), expected, atol=1e-4, rtol=1e-4)
    # The same products (skipped keys add exact zeros) summed in another order: float32 rounding, a few
    # eps (1.2e-7) of each value through two layers; 1e-5 relative and 1e-6 absolute.
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_compiled_pass_equals_transformers(family):
    name, folder, model = family
    _, expected = reference(name, folder)
    compiled = tf.function(lambda ids: model(ids)[0], jit_compile=True)
    np.testing.assert_allclose(compiled(tf.constant(IDS)).numpy(), expected, atol=1e-4, rtol=1e-4)


def test_greedy_continuation_equals_transformers(family):
    name, folder, model = family
    torch_model, _ = reference(name, folder)
    for prompt in ([5, 17, 3], IDS[1][:7]):
        expected = decidable_greedy(torch_model, input_ids=torch.tensor([prompt]),
                                    attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                    max_new_tokens=20, eos_token_id=None, pad_token_id=0)[0]
        got = decoding.decode(model, len(prompt) + 20, prompts=[prompt]).sequences(include_prompt=True)[0]
        assert got == expected


def test_bfloat16_compute_stays_close(family):
    from lmkit.layers import precision
    name, folder, model = family
    _, expected = reference(name, folder)
    with precision.scope("mixed_bfloat16"):
        logits, _ = model(tf.constant(IDS))
    assert logits.dtype == tf.float32
    assert np.abs(logits.numpy() - expected).max() < 0.1 * np.abs(expected).max()


def test_sharded_checkpoints_load_and_mismatches_are_named(tmp_path):
    dist.init(backend="local")
    folder, sharded = str(tmp_path / "whole"), str(tmp_path / "sharded")
    save_random("llama", folder)
    torch_model = save_random("llama", sharded, max_shard_size="20KB")
    with torch.no_grad():
        expected = torch_model(torch.tensor(IDS)).logits.numpy()
    assert os.path.isfile(os.path.join(sharded, "model.safetensors.index.json"))
    assert len(weight_files(sharded)) > 1
    again = load(sharded)
    np.testing.assert_allclose(again(tf.constant(IDS))[0].numpy(), expected, atol=1e-4, rtol=1e-4)
    # A config that does not fit the weights: named, nothing assigned.
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    wrong = build_model(CONVERTER.model_config({**config, "intermediate_size": 40}))
    before = [v.numpy().copy() for v in wrong.trainable_variables]
    with pytest.raises(UsageError, match=r"model\.safetensors: model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight "
                                         r"has shape \[\d+, \d+\] but .*config\.json gives"):
        CONVERTER.load_weights(wrong, folder)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, wrong.trainable_variables))
    for change, pattern in [({"model_type": "gptj"}, r"model_type 'gptj' is not one of llama, qwen2, mistral"),
                            ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported"),
                            ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
                             r"rope type 'yarn' is not supported")]:
        bad = tmp_path / f"bad-{len(change)}-{sorted(change)[0]}"
        bad.mkdir()
        (bad / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(UsageError, match=pattern):
            CONVERTER.read_config(str(bad))


# ------------------------------------------------------------------ the commands on a Llama folder
def make_llama_folder(folder, seed=0, chat_template=None):
    """A random Llama with a byte-level BPE tokenizer (and a chat template), saved as transformers saves
    them; returns the corpus."""
    import random

    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "fast", "blue", "sky", "über", "42", "!"]
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(300)]
    os.makedirs(folder, exist_ok=True)
    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    bpe = ByteLevelBPETokenizer()
    special = ["<|endoftext|>"] + (["<|im_start|>", "<|im_end|>"] if chat_template else [])
    bpe.train_from_iterator(lines, vocab_size=300, min_frequency=1, special_tokens=special)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                        eos_token="<|im_end|>" if chat_template else "<|endoftext|>")
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")  # the model's begin and end, as its tokenizer's
    config = LlamaConfig(**{**SIZES, "vocab_size": len(tokenizer)}, attn_implementation="eager",
                         bos_token_id=end, eos_token_id=end)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    return corpus


def test_generation_stops_at_every_end_id_of_the_generation_config(tmp_path):
    """generation_config.json's eos_token_id list (Llama 3 Instruct's end of text and end of turn): a sample
    ends at whichever comes first, as transformers' generate ends it, also after fine-tuning (the ids are
    kept with the run's tokenizer); ids the vocabulary lacks, and a folder that names none, are handled."""
    from transformers import AutoTokenizer

    import lmkit
    from lmkit.hub.generation_config import end_token_ids
    folder = str(tmp_path / "llama")
    make_llama_folder(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = "the cat sat"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    inputs = dict(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                  max_new_tokens=12, pad_token_id=0)
    free = decidable_greedy(LlamaForCausalLM.from_pretrained(folder).eval(), eos_token_id=None, **inputs)[0]
    new = free[len(ids):]
    # The end of turn: a token the model writes as its k-th new token (k >= 3) and not before.
    k = next(k for k in range(2, len(new)) if new[k] not in new[:k] and new[k] != 0)
    end_of_text = 0  # <|endoftext|>
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": end_of_text, "eos_token_id": [end_of_text, new[k]]}, f)
    assert end_token_ids(folder) == [end_of_text, new[k]]
    expected = decidable_greedy(LlamaForCausalLM.from_pretrained(folder).eval(), **inputs)[0]
    assert expected == ids + new[:k + 1]  # transformers stops there too
    [sample] = lmkit.generate(folder, prompt, max_new_tokens=12, strategy="greedy", return_samples=True)
    assert sample.ids == ids + new[:k] and sample.stopped_by == "eos"
    assert sample.text == tokenizer.decode(ids + new[:k])
    # Beam search and the uncompiled loop stop there as well.
    [beam] = lmkit.generate(folder, prompt, max_new_tokens=12, strategy="beam", beam_width=1, return_samples=True)
    assert beam.ids == sample.ids and beam.stopped_by == "eos"
    # An id beyond the vocabulary names no text: left out; with none left, <|endoftext|> ends a text.
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [10 ** 6]}, f)
    [unbounded] = lmkit.generate(folder, prompt, max_new_tokens=12, strategy="greedy", return_samples=True)
    assert unbounded.ids == free and unbounded.stopped_by == "length"
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": "</s>"}, f)
    with pytest.raises(UsageError, match=r"generation_config.json: eos_token_id = '</s>' must be a token id"):
        lmkit.generate(folder, prompt, max_new_tokens=2)


def test_a_prompt_starts_with_the_start_token_the_folders_tokenizer_puts_first(tmp_path):
    """A Llama tokenizer.json puts <s> before every text (its post-processor): generation reads the prompt
    as transformers' tokenizer(prompt) encodes it, <s> first, and writes what transformers' generate writes;
    --no_start_token feeds the prompt alone, --start_token keeps <s>."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    import lmkit
    folder = str(tmp_path / "llama")
    make_llama_folder(folder)
    hf_tokenizer = AutoTokenizer.from_pretrained(folder)
    backend = hf_tokenizer.backend_tokenizer
    start = backend.token_to_id("<|endoftext|>")  # the tiny vocabulary's one special token plays <s>
    backend.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", start)])
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|endoftext|>",
                            eos_token="<|endoftext|>").save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = "the cat sat"
    ids = tokenizer(prompt)["input_ids"]
    assert ids[0] == start and len(ids) > 1  # transformers puts it first
    reference = LlamaForCausalLM.from_pretrained(folder).eval()
    expected = decidable_greedy(reference, input_ids=torch.tensor([ids]), max_new_tokens=10, eos_token_id=None,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long), pad_token_id=0)[0]
    from lmkit.hub.tokenizer import read_tokenizer
    assert read_tokenizer(folder).start_ids == [start]
    [sample] = lmkit.generate(folder, prompt, max_new_tokens=10, strategy="greedy", return_samples=True)
    assert sample.stopped_by == "length"
    assert sample.ids[sample.prompt_length:] == expected[len(ids):]  # the same continuation as transformers'
    [marked] = lmkit.generate(folder, prompt, max_new_tokens=10, strategy="greedy", start_token=True)
    assert marked == sample.text
    [bare] = lmkit.generate(folder, prompt, max_new_tokens=10, strategy="greedy", start_token=False,
                            return_samples=True)
    unmarked = decidable_greedy(reference, input_ids=torch.tensor([ids[1:]]), max_new_tokens=10, eos_token_id=None,
                                attention_mask=torch.ones(1, len(ids) - 1, dtype=torch.long), pad_token_id=0)[0]
    assert bare.ids[bare.prompt_length:] == unmarked[len(ids) - 1:]
    assert bare.ids != sample.ids  # the start token changes the continuation: the test tells them apart


def test_a_runs_tokenizer_keeps_the_end_ids_and_is_reused_when_the_run_goes_on(tmp_path):
    """`lmkit train --init_from <folder>` saves the folder's tokenizer in the run with its end ids; a resumed
    run (the same command again) asks for it again and reuses it, whatever the folder-derived options hold."""
    from lmkit.data.tokenizers import load_tokenizer, train_tokenizer
    folder, run = str(tmp_path / "llama"), str(tmp_path / "run")
    make_llama_folder(folder)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [0, 5]}, f)
    os.makedirs(run)
    first = train_tokenizer("hf", [], run, source=folder)
    assert first.end_ids == [0, 5] and load_tokenizer(run).end_ids == [0, 5]
    again = train_tokenizer("hf", [], run, source=folder)
    assert again.options == first.options and again.end_ids == [0, 5]


def _lmkit(*args, launcher=()):
    import subprocess
    import sys

    from tests.helpers import ROOT, subprocess_env
    cmd = [*launcher, sys.executable, "-m", "lmkit", *args] if launcher else [sys.executable, "-m", "lmkit", *args]
    return subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.horovod
@pytest.mark.mpi
def test_generate_and_fine_tune_a_llama_folder_from_the_command_line(tmp_path):
    from transformers import AutoTokenizer
    folder = str(tmp_path / "llama")
    corpus = make_llama_folder(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reference_model = LlamaForCausalLM.from_pretrained(folder).eval()
    prompt = "the cat sat"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    expected = decidable_greedy(reference_model, input_ids=torch.tensor([ids]),
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=12, eos_token_id=None, pad_token_id=0)[0]
    res = _lmkit("generate", "--model_dir", folder, "--prompt", prompt, "--strategy", "greedy",
                 "--max_new_tokens", "12", "--one_line")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == tokenizer.decode(expected).replace("\n", "\\n"), res.stdout  # its text alone
    # Fine-tuning it: one SGD step on 2 workers equals one on one process, then the run generates.
    flags = ["train", "--init_from", folder, "--train_file", corpus, "--max_steps", "1", "--set", "num_steps=16",
             "--set", "batch_size=4", "--set", "optimizer='sgd'", "--set", "learning_rate=0.5",
             "--set", "warmup_epochs=0.0", "--set", "optimizer_params={}"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    res = _lmkit(*flags, "--model_dir", one)
    assert res.returncode == 0, res.stderr[-3000:]
    from tests.helpers import assert_relatively_close, mpirun_cmd
    res = _lmkit(*flags, "--model_dir", two, launcher=mpirun_cmd(2, [])[:-1])
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    with open(os.path.join(two, "config.json")) as f:
        saved = json.load(f)
    assert saved["model"]["name"] == "llama" and saved["model"]["num_kv_heads"] == 2  # config.json by section
    results = [json.load(open(os.path.join(d, "results.json"))) for d in (one, two)]
    assert [r["world_size"] for r in results] == [1, 2]
    from lmkit.train.checkpoint import load_model
    model_one, _, _ = load_model(one)
    model_two, _, _ = load_model(two)
    pretrained = load(folder)
    moved = False
    for a, b, c in zip(model_two.trainable_variables, model_one.trainable_variables,
                       pretrained.trainable_variables):
        assert_relatively_close(a.numpy(), b.numpy(), 1e-5, a.name)  # the same update on 2 workers
        moved = moved or float(np.max(np.abs(a.numpy() - c.numpy()))) > 1e-4
    assert moved
    res = _lmkit("generate", "--model_dir", two, "--prompt", prompt, "--strategy", "greedy", "--max_new_tokens", "5")
    assert res.returncode == 0 and res.stdout.startswith("the cat sat"), res.stderr[-3000:]
    # The fine-tuned run exports to a folder transformers loads, with lmkit's logits.
    exported = str(tmp_path / "exported")
    res = _lmkit("export", "--model_dir", two, "--format", "hf", "--output", exported)
    assert res.returncode == 0, res.stderr[-3000:]
    with torch.no_grad():
        theirs = LlamaForCausalLM.from_pretrained(exported).eval()(torch.tensor(IDS)).logits.numpy()
    np.testing.assert_allclose(model_two(tf.constant(IDS))[0].numpy(), theirs, atol=1e-4, rtol=1e-4)
    assert AutoTokenizer.from_pretrained(exported)(prompt)["input_ids"] == tokenizer(prompt)["input_ids"]
    # A run without adapters has none to export alone: one clear error, nothing written.
    res = _lmkit("export", "--model_dir", two, "--format", "peft", "--output", str(tmp_path / "adapters"))
    assert res.returncode == 2 and not os.path.exists(tmp_path / "adapters")
    assert res.stderr.strip().splitlines()[-1].startswith("error: export --format peft writes the LoRA adapters"), \
        res.stderr[-2000:]
