"""Bad input: one clear message (printed once, by rank 0), exit status 2, no file touched.

Each row of the table prepares its own copy of the inputs, runs
examples/lm_ptb.py in one process (the rows marked ``distributed`` also run
``lmkit train`` under ``mpirun -np 2``), and checks the exit
status, the message (what, which value, how to fix), that it appears once
with no traceback, and that the data folder, the model directory and the
config file hold exactly the same bytes afterwards.
"""
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, List

import pytest

from tests.distributed.reliability.support import (
    SINGLE,
    TRAIN,
    mpirun,
    run_streamed,
    tree_digest,
    write_config,
    write_corpus,
)

UNREACHABLE = "http://127.0.0.1:1/simple-examples.tgz"  # port 1: connection refused at once


@dataclass(frozen=True)
class Case:
    name: str
    setup: Callable[["Paths"], List[str]]  # prepares the inputs, returns the flags
    message: str  # a regex the one error line must match
    distributed: bool = False  # also run under mpirun -np 2


@dataclass(frozen=True)
class Paths:
    root: str
    data: str  # a private copy of the generated corpus
    model: str  # absent, or a private copy of a trained model directory
    config: str  # the tiny config for the corpus
    corpus_vocab: int
    trained: str


def _flags(p: Paths, *extra: str, data: str = None, model: str = None, config: str = None) -> List[str]:
    return ["--config", config or p.config, "--data_path", data or p.data, "--model_dir", model or p.model,
            "--data_url", UNREACHABLE, *extra]


def _with_trained_model(p: Paths) -> None:
    shutil.copytree(p.trained, p.model)


def _missing_folder(p):
    return _flags(p, data=os.path.join(p.root, "no_such_folder"))


def _missing_file(p):
    os.remove(os.path.join(p.data, "ptb.test.txt"))
    return _flags(p)


def _empty_file(p):
    open(os.path.join(p.data, "ptb.valid.txt"), "w").close()
    return _flags(p)


def _not_utf8(p):
    with open(os.path.join(p.data, "ptb.train.txt"), "ab") as f:
        f.write(b" caf\xe9 \xff\xfe\n")  # Latin-1 bytes
    return _flags(p)


def _unknown_config(p):
    return _flags(p, config="config_smal")


def _config_with(p, **kw):
    drop = kw.pop("drop", ())
    vocab = kw.pop("vocab_size", p.corpus_vocab)
    return write_config(os.path.join(p.root, "config_bad.py"), vocab, drop=drop, **kw)


def _unknown_key(p):
    return _flags(p, config=_config_with(p, hiden_size=8))


def _missing_key(p):
    return _flags(p, config=_config_with(p, drop=("num_layers",)))


def _wrong_vocab_size(p):
    return _flags(p, config=_config_with(p, vocab_size=10000))


def _indivisible_batch(p):
    return _flags(p, "--set", "batch_size=5")


def _checkpoint_other_shape(p):
    _with_trained_model(p)
    return _flags(p, "--set", "hidden_size=16")


def _checkpoint_other_vocabulary(p):
    _with_trained_model(p)
    shutil.rmtree(p.data)
    write_corpus(p.data, seed=1)  # the same 60 words, in another frequency order
    return _flags(p)


def _no_resume_over_checkpoints(p):
    _with_trained_model(p)
    return _flags(p, "--no_resume")


def _model_dir_under_a_file(p):
    blocker = os.path.join(p.root, "a_file")
    with open(blocker, "w") as f:
        f.write("not a folder\n")
    return _flags(p, model=os.path.join(blocker, "sub"))


def _unknown_flag(p):
    return _flags(p, "--bogus_flag", "3")


def _unreachable_url(p):
    empty = os.path.join(p.root, "empty_data")
    os.makedirs(empty)
    return _flags(p, data=empty)


CASES = [
    Case("missing data folder", _missing_folder,
         r"error: data folder \S+/no_such_folder does not exist, and downloading PTB failed: cannot download "
         r"http://127\.0\.0\.1:1/simple-examples\.tgz: .*Connection refused.*put ptb\.train\.txt, "
         r"ptb\.valid\.txt, ptb\.test\.txt in \S+/no_such_folder"),
    Case("missing file", _missing_file,
         r"error: data folder \S+/data lacks ptb\.test\.txt \(it has ptb\.train\.txt, ptb\.valid\.txt\), and "
         r"downloading PTB failed: cannot download .*Download simple-examples\.tgz yourself"),
    Case("empty text file", _empty_file,
         r"error: text file '\S+/ptb\.valid\.txt' is empty \(no words\); .*delete it"),
    Case("non-UTF-8 text", _not_utf8,
         r"error: text file '\S+/ptb\.train\.txt' is not UTF-8 \(invalid .* near line \d+\); convert it "
         r"with e\.g\. `iconv -t UTF-8`", distributed=True),
    Case("unknown config name", _unknown_config,
         r"error: unknown config 'config_smal'; did you mean 'config_small'\? available: .*config_small"),
    Case("config with an unknown key", _unknown_key,
         r"error: config '\S+config_bad\.py': unknown key 'hiden_size'; did you mean 'hidden_size'\?"),
    Case("config with a missing key", _missing_key,
         r"error: config '\S+config_bad\.py': missing required key 'num_layers'; add `num_layers = \.\.\.`"),
    Case("config vocab_size unlike the data", _wrong_vocab_size,
         r"error: the data has 60 words but the config says vocab_size = 10000; set vocab_size = 60"),
    Case("checkpoint of another model shape", _checkpoint_other_shape,
         r"error: \S+/model holds a model trained with hidden_size = 8, but the config says 16; use the "
         r"same config to resume, or another --model_dir", distributed=True),
    Case("checkpoint of another vocabulary", _checkpoint_other_vocabulary,
         r"error: \S+/model/vocab\.txt \(60 tokens\) differs from the vocabulary of the data \(60 tokens\); "
         r"resume with the same data, or use another --model_dir"),
    Case("--no_resume over checkpoints", _no_resume_over_checkpoints,
         r"error: --no_resume, but \S+/model already holds checkpoints; pass a new --model_dir or drop "
         r"--no_resume"),
    Case("model directory not writable", _model_dir_under_a_file,
         r"error: model directory \S+/a_file/sub is not writable \(Not a directory\); pass a --model_dir "
         r"you can write to"),
    Case("unknown flag", _unknown_flag, r"(lm_ptb\.py|lmkit train): error: unrecognized arguments: "
                                        r"--bogus_flag 3"),
    Case("unreachable --data_url", _unreachable_url,
         r"error: cannot download http://127\.0\.0\.1:1/simple-examples\.tgz: .*Connection refused\. "
         r"Download simple-examples\.tgz yourself and put .* in \S+/empty_data, or set LMKIT_PTB_URL / "
         r"--data_url to a mirror"),
    Case("batch size not divisible by the workers", _indivisible_batch,
         r"error: batch_size 5 is not divisible by 2 workers; use a multiple of 2", distributed=True),
]
SINGLE_CASES = [c for c in CASES if c.name != "batch size not divisible by the workers"]
DISTRIBUTED_CASES = [c for c in CASES if c.distributed]


def _run_case(case: Case, root: str, corpus, trained: str, distributed: bool):
    os.makedirs(root)
    paths = Paths(root=root, data=os.path.join(root, "data"), model=os.path.join(root, "model"),
                  config=corpus.config, corpus_vocab=corpus.vocab_size, trained=trained)
    shutil.copytree(corpus.data, paths.data)
    flags = case.setup(paths)
    watched = [root, corpus.config]
    before = tree_digest(*watched)
    cmd = mpirun([*TRAIN, *flags]) if distributed else [sys.executable, SINGLE, *flags]
    out = run_streamed(cmd, timeout=300)
    return out, before, tree_digest(*watched)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, corpus, trained_dir):
    """Runs every row once, two at a time (each run is mostly TensorFlow's start-up)."""
    base = tmp_path_factory.mktemp("bad_input")
    jobs = [(c, False) for c in SINGLE_CASES] + [(c, True) for c in DISTRIBUTED_CASES]
    with ThreadPoolExecutor(max_workers=2) as pool:  # leaving the block waits for every run
        return {(c.name, d): pool.submit(_run_case, c, str(base / f"{i}"), corpus, trained_dir, d)
                for i, (c, d) in enumerate(jobs)}


def _check(case: Case, future) -> None:
    out, before, after = future.result()
    text = out.output
    assert out.returncode == 2, text[-4000:]
    found = re.findall(case.message, text)
    assert len(found) == 1, f"expected the message once:\n{text[-4000:]}"  # once: rank 0 only
    assert len(re.findall(r"(?m)^\S*:? ?error: ", text)) == 1, text[-4000:]  # and no other error line
    assert "Traceback" not in text, text[-4000:]
    assert after == before  # nothing written, overwritten or left behind


@pytest.mark.parametrize("case", SINGLE_CASES, ids=[c.name for c in SINGLE_CASES])
def test_bad_input_in_one_process(case, outcomes):
    _check(case, outcomes[(case.name, False)])


@pytest.mark.horovod
@pytest.mark.mpi
@pytest.mark.parametrize("case", DISTRIBUTED_CASES, ids=[c.name for c in DISTRIBUTED_CASES])
def test_bad_input_under_mpirun_is_reported_once(case, outcomes):
    _check(case, outcomes[(case.name, True)])


def test_help_is_not_a_failure():
    out = run_streamed([sys.executable, SINGLE, "--help"], timeout=300)
    assert out.returncode == 0, out.output[-4000:]
    assert out.output.startswith("usage: lm_ptb.py") and "--data_url" in out.output
    assert "failed" not in out.output and "Traceback" not in out.output
