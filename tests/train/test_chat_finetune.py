"""End to end: a tiny random Qwen2 chat model fine-tuned on 2 workers with --packing on a synthetic task in chat
form (examples/make_chats.py: reverse 2-4 letters), then answering held-out conversations with lmkit generate
--chat, scored per assistant token by lmkit evaluate, and exported to a folder that transformers loads and that
answers the same, greedily. Every launch has a timeout (about 2 minutes in all on 2 cores)."""
import json
import os
import sys

import pytest

from tests.helpers import ROOT, mpirun_cmd, run, subprocess_env

pytestmark = [pytest.mark.transformers, pytest.mark.horovod, pytest.mark.mpi]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

STEPS = 600  # the loss per assistant token is below 0.02 by then (learning rate 3e-3 after a warmup of 100)
TRAIN = ["--packing", "--set", "num_steps=64", "--set", "batch_size=16", "--max_steps", str(STEPS), "--set",
         "dropout=0.0", "--set", "learning_rate=3e-3", "--warmup_steps", "100", "--set", "schedule='constant'",
         "--set", "checkpoint_every_epochs=0", "--set", "run.log_every_steps=200"]


def _lmkit(*args, launcher=(), env=None, timeout=300):
    res = run([*(launcher or [sys.executable]), "-m", "lmkit", *args], timeout=timeout, env=env or subprocess_env())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    return res.stdout


def _answers(stdout):
    """The assistant's text of each ``[i.0] ...`` line of lmkit generate --one_line, by prompt."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("["):
            label, text = line.split("] ", 1)
            out[int(label[1:].split(".")[0])] = text.rsplit("assistant\\n", 1)[-1].strip()
    return out


def test_a_tiny_qwen2_fine_tuned_on_two_workers_answers_held_out_conversations(tmp_path):
    data, tiny, model_dir = tmp_path / "chats", tmp_path / "tiny-qwen2", str(tmp_path / "run")
    res = run([sys.executable, os.path.join(ROOT, "examples", "make_chats.py"), "--out", str(data), "--tiny_model",
               str(tiny)], timeout=200)
    assert res.returncode == 0, res.stderr[-3000:]
    env = subprocess_env({"LMKIT_DATA_CACHE": str(tmp_path / "cache")})
    out = _lmkit("train", "--init_from", str(tiny), "--train_file", str(data / "train.jsonl"), "--valid_file",
                 str(data / "valid.jsonl"), "--model_dir", model_dir, *TRAIN, env=env, timeout=400,
                 launcher=mpirun_cmd(2, [], env_keys=["LMKIT_DATA_CACHE"]))
    assert "train_file: 1,596 records -> 1,596 examples" in out and "examples packed" in out, out[-3000:]
    with open(os.path.join(model_dir, "results.json")) as f:
        results = json.load(f)
    assert results["world_size"] == 2 and results["epochs"][-1]["valid_perplexity"] < 1.05

    # lmkit generate --chat answers the held-out questions (none of them is in train.jsonl)
    with open(data / "heldout.jsonl") as f:
        heldout = [json.loads(line) for line in f]
    prompts = [flag for r in heldout for flag in ("--prompt", r["messages"][0]["content"])]
    answers = _answers(_lmkit("generate", "--model_dir", model_dir, "--chat", "--strategy", "greedy", "--one_line",
                              "--max_new_tokens", "12", *prompts, env=env))
    right = sum(answers[i] == r["answer"] for i, r in enumerate(heldout))
    assert right >= 0.95 * len(heldout), (right, [(answers[i], r["answer"]) for i, r in enumerate(heldout)][:10])

    # lmkit evaluate: the validation file per assistant token, as training's validation scored it
    report = json.loads(_lmkit("evaluate", "--model_dir", model_dir, "--text_file", str(data / "valid.jsonl"),
                               "--json", env=env))
    assert report["examples"] == 161 and report["weighted_tokens"] > 0
    assert report["perplexity"] == pytest.approx(results["epochs"][-1]["valid_perplexity"], rel=1e-4)

    # the export loads in transformers and answers as lmkit did, greedily
    exported = str(tmp_path / "exported")
    _lmkit("export", "--model_dir", model_dir, "--format", "hf", "--output", exported, env=env)
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    model = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        for i, record in enumerate(heldout):
            ids = tokenizer.apply_chat_template(record["messages"], add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)["input_ids"]
            output = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=end, pad_token_id=end)
            text = tokenizer.decode(output[0, ids.shape[1]:], skip_special_tokens=True).strip()
            assert text == answers[i], (i, text, answers[i])
