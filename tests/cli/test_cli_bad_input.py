"""Bad input to ``lmkit train`` / ``lmkit generate`` on text data: exit 2, one message, nothing written.

Each case runs the real command in a subprocess (two at a time); the message
must name the file or value and the fix, appear once, with no traceback.
"""
import concurrent.futures
import os
import shutil
import sys
from typing import Callable, NamedTuple

import pytest

from tests.cli.test_cli_text import SMALL, USER_MODEL, write_corpus
from tests.helpers import mpirun_cmd, run, subprocess_env

LMKIT = [sys.executable, "-m", "lmkit"]


class Case(NamedTuple):
    name: str
    make: Callable  # (tmp folder, corpus files) -> argv after "lmkit"
    expected: str  # a regular expression the one error line must match


def _train(files, model_dir, *flags, train_file=None):
    return ["train", "--config", "config_transformer", "--train_file", train_file or files["train"],
            "--model_dir", model_dir, "--max_steps", "2", *SMALL, *flags]


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


CASES = [
    Case("missing text file", lambda t, f: _train(f, str(t / "m"), train_file=str(t / "nope.txt")),
         r"train_file '\S+/nope\.txt' does not exist"),
    Case("empty text file", lambda t, f: _train(f, str(t / "m"), train_file=_write(t / "e.txt", b"\n \n")),
         r"train_file '\S+/e\.txt' has only blank lines"),
    Case("binary file", lambda t, f: _train(f, str(t / "m"), train_file=_write(t / "b.txt", b"ab\0\x01cd\n")),
         r"train_file '\S+/b\.txt' .*binary"),
    Case("not UTF-8", lambda t, f: _train(f, str(t / "m"),
                                          train_file=_write(t / "l.txt", b"good line\ncaf\xe9 au lait\n")),
         r"'\S+/l\.txt' is not UTF-8: line 2 .*iconv"),
    Case("valid file missing", lambda t, f: _train(f, str(t / "m"), "--valid_file", str(t / "v.txt")),
         r"valid_file '\S+/v\.txt' does not exist"),
    Case("corpus too small for the vocabulary",
         lambda t, f: _train(f, str(t / "m"), "--tokenizer", "sentencepiece", "--vocab_size", "5000"),
         r"vocab_size 5000 .*\(--vocab_size\) to at most \d+"),
    Case("unknown model module", lambda t, f: _train(f, str(t / "m"), "--model", "no_such_pkg.lm:MyLM"),
         r"model 'no_such_pkg\.lm:MyLM': module 'no_such_pkg\.lm' cannot be imported"),
    Case("missing class", lambda t, f: _train(f, str(t / "m"), "--model", "json:NoSuchLM"),
         r"module 'json' has no 'NoSuchLM'"),
    Case("not a language model", lambda t, f: _train(f, str(t / "m"), "--model", "json:JSONDecoder"),
         r"model 'json:JSONDecoder' \(JSONDecoder\) is not a language model: .*subclass "
         r"lmkit\.models\.LanguageModel"),
    Case("unknown tokenizer", lambda t, f: _train(f, str(t / "m"), "--tokenizer", "bpe"),
         r"argument --tokenizer: invalid choice: 'bpe'"),
    Case("unknown precision flag", lambda t, f: _train(f, str(t / "m"), "--precision", "bf16"),
         r"argument --precision: invalid choice: 'bf16'"),
    Case("unknown precision key", lambda t, f: _train(f, str(t / "m"), "--set", "precision=fp16"),
         r"precision = 'fp16' is not one of float32, mixed_bfloat16, mixed_float16"),
    Case("no micro-batches", lambda t, f: _train(f, str(t / "m"), "--grad_accum_steps", "0"),
         r"grad_accum_steps = 0 must be >= 1"),
    Case("micro-batches that do not divide the batch",
         lambda t, f: _train(f, str(t / "m"), "--grad_accum_steps", "3"),
         r"grad_accum_steps = 3 does not divide batch_size = 8"),
    Case("unknown attention kernel", lambda t, f: _train(f, str(t / "m"), "--set", "attention_kernel=flash"),
         r"attention_kernel = 'flash' is not one of matmul, cudnn, auto"),
    Case("cuDNN's attention on a CPU", lambda t, f: _train(f, str(t / "m"), "--set", "attention_kernel=cudnn"),
         r"attention_kernel = 'cudnn' cannot run here: it needs a GPU \(this run computes on CPU\); use "
         r"attention_kernel = 'matmul'"),
]


def check_one_error(res, pattern: str) -> None:
    import re
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, res.stderr[-3000:]
    assert re.search(pattern, errors[0]), errors[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("corpus")), lines=60)


def test_bad_text_input_exits_2_and_writes_nothing(tmp_path, corpus):
    folders = []
    cmds = []
    for i, case in enumerate(CASES):
        folder = tmp_path / f"case{i}"
        folder.mkdir()
        folders.append(folder)
        cmds.append(LMKIT + case.make(folder, corpus))
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda cmd: run(cmd, timeout=240), cmds))
    for case, folder, res in zip(CASES, folders, results):
        check_one_error(res, case.expected)
        assert not (folder / "m").exists(), f"{case.name}: the model folder was written"
    # The corpus itself is untouched: nothing is written next to the user's data.
    assert sorted(os.listdir(os.path.dirname(corpus["train"]))) == ["test.txt", "train.txt", "valid.txt"]


@pytest.mark.horovod
@pytest.mark.mpi
def test_a_bad_file_under_mpirun_is_reported_once(tmp_path, corpus):
    binary = _write(tmp_path / "b.txt", b"\0\0\0")
    # And micro-batches that split the batch but not each worker's rows (8 = 2 x 4, not 2 x 8).
    cmds = [_train(corpus, str(tmp_path / "m"), train_file=binary),
            _train(corpus, str(tmp_path / "m2"), "--grad_accum_steps", "8")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: run(mpirun_cmd(2, ["-m", "lmkit", *c]), timeout=240), cmds))
    check_one_error(results[0], r"binary")
    check_one_error(results[1], r"batch_size 8 does not split into 2 worker\(s\) x grad_accum_steps 8 = 16 "
                                r"equal micro-batches; use a batch_size that is a multiple of 16")
    assert not (tmp_path / "m2").exists()


def test_a_model_folder_of_another_run_is_refused(tmp_path, corpus):
    """A tokenizer or a model class unlike the folder's, and an empty prompt, each exit 2."""
    model_dir = str(tmp_path / "m")
    first = run(LMKIT + _train(corpus, model_dir, "--tokenizer", "char"), timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    before = sorted(os.listdir(model_dir))
    code = tmp_path / "code"
    code.mkdir()
    (code / "user_lm.py").write_text(USER_MODEL)
    env = subprocess_env({"PYTHONPATH": f"{code}{os.pathsep}{subprocess_env()['PYTHONPATH']}"})
    cases = [
        (_train(corpus, model_dir, "--tokenizer", "byte"),
         r"holds a char tokenizer .* but a byte tokenizer .* was asked for"),
        (_train(corpus, model_dir, "--tokenizer", "char", "--model", "user_lm:TinyLM"),
         r"holds a model trained with model = 'transformer', but the config says 'user_lm:TinyLM'"),
        (["generate", "--model_dir", model_dir, "--prompt", "\n"], r"is empty after tokenization"),
    ]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: run(LMKIT + c[0], timeout=240, env=env), cases))
    for (_, pattern), res in zip(cases, results):
        check_one_error(res, pattern)
    assert sorted(os.listdir(model_dir)) == before
    shutil.rmtree(model_dir)
