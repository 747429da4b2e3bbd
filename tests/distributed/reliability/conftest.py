"""Shared, generated inputs of the reliability tests (made once per session)."""
import os
import shutil
import sys
from dataclasses import dataclass

import pytest

from tests.distributed.reliability.support import SINGLE, run_streamed, write_config, write_corpus


@dataclass(frozen=True)
class Corpus:
    data: str  # folder with ptb.{train,valid,test}.txt
    vocab_size: int
    config: str  # the tiny config for that vocabulary


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Corpus:
    root = tmp_path_factory.mktemp("corpus")
    vocab = write_corpus(str(root / "data"))
    return Corpus(str(root / "data"), vocab, write_config(str(root / "config_tiny.py"), vocab))


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory, corpus) -> str:
    """A model directory after one real epoch (one checkpoint), copied by the tests that use it."""
    model_dir = str(tmp_path_factory.mktemp("trained") / "model")
    out = run_streamed([sys.executable, SINGLE, "--config", corpus.config, "--data_path", corpus.data,
                        "--model_dir", model_dir], timeout=300)
    assert out.returncode == 0, out.output[-4000:]
    assert len(os.listdir(os.path.join(model_dir, "checkpoints"))) == 1
    return model_dir


@pytest.fixture()
def model_copy(tmp_path, trained_dir) -> str:
    path = str(tmp_path / "model")
    shutil.copytree(trained_dir, path)
    return path
