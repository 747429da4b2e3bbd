"""``lmkit export --format saved_model``: the SavedModel runs its decode loop in a process where lmkit cannot be
imported, and ``saved_model_cli run`` runs it; its greedy and seeded sampled ids are ``lmkit generate``'s."""
import json
import os
import shutil
import subprocess
import sys

from tests.helpers import run

#: Runs in a fresh interpreter (-I: no PYTHONPATH, no user site) where any import of lmkit fails.
LOAD = """
import json, sys
class NoLmkit:
    def find_spec(self, name, path=None, target=None):
        if name == "lmkit" or name.startswith("lmkit."):
            raise ImportError("lmkit is not importable here")
sys.meta_path.insert(0, NoLmkit())
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
serve = model.signatures["serving_default"]
ids = json.loads(sys.argv[2])
width = max(map(len, ids))
out = []
for temperature, seed in ((0.0, 0), (0.7, 5)):
    result = serve(ids=tf.constant([r + [0] * (width - len(r)) for r in ids]),
                   lengths=tf.constant([len(r) for r in ids]), max_new_tokens=tf.constant(12),
                   temperature=tf.constant(temperature), seed=tf.constant(seed, tf.int64))
    out.append([row[:n] for row, n in zip(result["new_ids"].numpy().tolist(), result["new_lengths"].numpy().tolist())])
assert not [m for m in sys.modules if m.startswith("lmkit")]
print(json.dumps(out))
"""


def test_the_saved_model_decodes_like_lmkit_generate_without_lmkit(run_dir, tmp_path):
    import lmkit
    from lmkit.decoding.source import load_generator
    output = str(tmp_path / "saved")
    res = run([sys.executable, "-m", "lmkit", "export", "--model_dir", run_dir, "--format", "saved_model",
               "--output", output], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(os.path.join(output, "lmkit.json"), encoding="utf-8") as f:
        info = json.load(f)
    generator = load_generator(run_dir)
    prompts = ["the cat", "a dog ran fast"]
    ids = [[info["start_id"]] + generator.tokenizer.encode(p) for p in prompts]
    env = {"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "3"}
    loaded = subprocess.run([sys.executable, "-I", "-c", LOAD, output, json.dumps(ids)], cwd=str(tmp_path), env=env,
                            capture_output=True, text=True, timeout=600)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    greedy, sampled = json.loads(loaded.stdout.strip().splitlines()[-1])
    for k, prompt in enumerate(prompts):
        expected = lmkit.generate(generator, prompt, strategy="greedy", max_new_tokens=12, return_samples=True)[0]
        assert greedy[k] == expected.ids[len(ids[k]) - 1:]
    expected = lmkit.generate(generator, prompts, strategy="sample", temperature=0.7, seed=5, max_new_tokens=12,
                              return_samples=True)
    assert sampled == [s.ids[len(r) - 1:] for s, r in zip(expected, ids)]
    cli = shutil.which("saved_model_cli", path=os.path.dirname(sys.executable))
    inputs = f"ids={ids[:1]};lengths=[{len(ids[0])}];max_new_tokens=12;temperature=0.0;seed=0"
    shown = subprocess.run([cli, "run", "--dir", output, "--tag_set", "serve", "--signature_def", "serving_default",
                            "--input_exprs", inputs], capture_output=True, text=True, env=env, timeout=600)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "new_ids" in shown.stdout and " ".join(map(str, greedy[0][:3])) in " ".join(shown.stdout.split())
