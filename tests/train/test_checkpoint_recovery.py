"""Training, ``lmkit generate`` and ``lmkit evaluate`` with a damaged checkpoint or another run's.

* the newest checkpoint of a run is corrupt (its data file truncated): a
  rerun names it and resumes from the one before, saying from which step;
  generate and evaluate load the one before with a note on stderr;
* a checkpoint asked for by name that is corrupt, or that belongs to a run
  of another size: exit 2, one message, no traceback.
"""
import concurrent.futures
import os
import re
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

from lmkit import distributed as dist
from lmkit.config import TrainConfig
from lmkit.data.vocab import Vocab
from lmkit.models import build_model
from lmkit.train import Trainer
from tests.helpers import run

VOCAB = 40
LMKIT = [sys.executable, "-m", "lmkit"]


def _config(hidden_size=8, **kw):
    values = dict(model="lstm", vocab_size=VOCAB, hidden_size=hidden_size, num_layers=1, init_scale=0.1,
                  keep_prob=1.0, batch_size=4, num_steps=5, num_epochs=3, learning_rate=1.0, max_grad_norm=5.0,
                  seed=3)
    values.update(kw)
    return TrainConfig.from_dict(values)


def _ids(n=300):
    rng = np.random.RandomState(0)
    ids = np.zeros(n, np.int32)
    for i in range(1, n):
        ids[i] = (ids[i - 1] * 7 + 2) % VOCAB if rng.rand() < 0.85 else rng.randint(VOCAB)
    return ids


def _vocab():
    return Vocab(["<unk>", "<eos>", "<bos>", "<pad>"] + [f"w{i}" for i in range(VOCAB - 4)])


def _train(model_dir, cfg, log):
    model = build_model(cfg.model_config())
    return Trainer(model, cfg, model_dir=model_dir, vocab=_vocab(), log=log).fit(_ids(), num_epochs=3)


def _truncate_data(checkpoint):
    data = os.path.join(checkpoint, "ckpt.data-00000-of-00001")
    os.truncate(data, os.path.getsize(data) // 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of 3 epochs (a checkpoint each): "a" of hidden size 8, "b" of 12."""
    dist.init()
    root = tmp_path_factory.mktemp("runs")
    for name, hidden in (("a", 8), ("b", 12)):
        tf.random.set_seed(1)
        _train(str(root / name), _config(hidden), lambda s: None)
    return root


def _checkpoints(model_dir):
    return sorted(os.listdir(os.path.join(model_dir, "checkpoints")))


def test_a_rerun_resumes_from_the_checkpoint_before_a_corrupt_latest_one(runs, tmp_path):
    model_dir = str(tmp_path / "a")
    shutil.copytree(runs / "a", model_dir)
    names = _checkpoints(model_dir)
    assert len(names) == 3, names
    steps = [int(n.split("-")[1]) for n in names]
    _truncate_data(os.path.join(model_dir, "checkpoints", names[2]))
    lines = []
    result = _train(model_dir, _config(), lines.append)
    assert result.resumed_from.endswith(names[1]), lines
    corrupt = [line for line in lines if "corrupt" in line]
    assert len(corrupt) == 2, lines
    assert re.fullmatch(rf"warning: checkpoint \S+/{names[2]} is corrupt \(IndexError: Read less bytes than "
                        r"requested\); skipping it", corrupt[0]), corrupt[0]
    assert re.fullmatch(rf"warning: continuing from the previous complete checkpoint \S+/{names[1]} "
                        rf"\(step {steps[1]}\) instead of the corrupt one\(s\) after it", corrupt[1]), corrupt[1]
    assert any(re.match(rf"resumed from \S+/{names[1]} \(epoch 2, step {steps[1]}\)", line) for line in lines)
    assert result.epochs[0].epoch == 3 and result.global_step == steps[2]
    # The last epoch was trained again and its checkpoint written anew over the corrupt one.
    assert _checkpoints(model_dir) == names
    lines.clear()
    again = _train(model_dir, _config(), lines.append)
    assert again.resumed_from.endswith(names[2]) and not any("corrupt" in line for line in lines)


def test_generate_and_evaluate_with_corrupt_or_foreign_checkpoints(runs, tmp_path):
    """One subprocess each, two at a time."""
    a = str(tmp_path / "a")
    shutil.copytree(runs / "a", a)
    names = _checkpoints(a)
    _truncate_data(os.path.join(a, "checkpoints", names[2]))
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i % 30}" for i in range(200)) + "\n")
    foreign = str(runs / "b" / "checkpoints" / _checkpoints(str(runs / "b"))[2])
    generate = LMKIT + ["generate", "--model_dir", a, "--prompt", "w1 w2", "--max_new_tokens", "3", "--seed", "1"]
    commands = {
        "latest corrupt": generate,
        "evaluate, latest corrupt": LMKIT + ["evaluate", "--model_dir", a, "--text_file", str(text)],
        "named corrupt": generate + ["--checkpoint", names[2]],
        "another run's": generate + ["--checkpoint", foreign],
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(commands, pool.map(lambda cmd: run(cmd, timeout=300), commands.values())))

    for key in ("latest corrupt", "evaluate, latest corrupt"):
        res = done[key]
        assert res.returncode == 0, key + res.stdout[-2000:] + res.stderr[-3000:]
        notes = [line for line in res.stderr.splitlines() if "corrupt" in line]
        assert len(notes) == 2, res.stderr[-3000:]
        assert re.fullmatch(rf"warning: checkpoint \S+/{names[2]} is corrupt \(IndexError: Read less bytes "
                            r"than requested\); skipping it", notes[0]), notes
        assert f"continuing from the previous complete checkpoint {a}/checkpoints/{names[1]}" in notes[1], notes
    assert "perplexity" in done["evaluate, latest corrupt"].stdout

    def one_error(res, pattern):
        assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-3000:]
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
        errors = [line for line in res.stderr.splitlines() if "error" in line]
        assert len(errors) == 1, res.stderr[-3000:]
        assert re.fullmatch(pattern, errors[0]), errors[0]

    one_error(done["named corrupt"],
              rf"error: checkpoint \S+/{names[2]} is corrupt \(IndexError: Read less bytes than requested\); "
              rf"pass another --checkpoint \(those in \S+: {', '.join(names)}\) or none for the newest readable one")
    one_error(done["another run's"],
              rf"error: the checkpoint {re.escape(foreign)} does not match {re.escape(a)}/config\.json "
              r"\(ValueError: .*shape.*\); pass a --checkpoint of this run, or the --model_dir of the run that "
              r"wrote it")


def test_a_rerun_after_a_re_save_killed_between_its_renames_starts_from_that_step(runs, tmp_path):
    """What a re-save without an atomic exchange leaves when killed between its two renames: the step's
    old copy as ckpt-N.old-PID and the new one as ckpt-N.tmp-PID. With keep_checkpoints = 1 that is the
    only checkpoint; the rerun resumes from it (not from step 0) and puts it back in place."""
    model_dir = str(tmp_path / "a")
    shutil.copytree(runs / "a", model_dir)
    ckpts = os.path.join(model_dir, "checkpoints")
    names = _checkpoints(model_dir)
    for name in names[:2]:
        shutil.rmtree(os.path.join(ckpts, name))
    last = os.path.join(ckpts, names[2])
    shutil.copytree(last, last + ".tmp-4242")
    os.remove(os.path.join(last + ".tmp-4242", "meta.json"))
    os.rename(last, last + ".old-4242")
    lines = []
    result = _train(model_dir, _config(keep_checkpoints=1), lines.append)
    assert result.resumed_from == last, lines
    assert result.global_step == int(names[2].split("-")[1]) and result.epochs == []
    assert _checkpoints(model_dir) == [names[2]]
