"""lmkit download / lmkit.data.corpora: public corpora fetched by name, each file checked by its hash."""
import os
import subprocess
import sys

import pytest

from lmkit.core.errors import UsageError
from lmkit.data import corpora
from lmkit.data.download import file_blob_sha1, git_blob_sha1
from lmkit.data.errors import DataError
from tests.helpers import ROOT, StaticServer, make_ptb_archive, subprocess_env

FILES = {"train.txt": b" a b c \n d e \n", "valid.txt": b" b c \n", "test.txt": b" c d \n"}


@pytest.fixture()
def served(tmp_path, monkeypatch):
    """A corpus "toy" served from 127.0.0.1, registered with its files' hashes."""
    folder = tmp_path / "served"
    folder.mkdir()
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    with StaticServer(str(folder)) as server:
        toy = corpora.Corpus("toy", server.url, {n: git_blob_sha1(d) for n, d in FILES.items()}, "a toy")
        monkeypatch.setitem(corpora.CORPORA, "toy", toy)
        yield server, folder


def test_downloads_checks_and_keeps_the_files(served, tmp_path):
    server, _ = served
    target = tmp_path / "data" / "toy"
    paths = corpora.fetch_corpus("toy", str(target), progress=False)
    assert {n: open(p, "rb").read() for n, p in paths.items()} == FILES
    assert sorted(os.listdir(target)) == sorted(FILES)  # no temporary file left
    asked = len(server.requests)
    assert corpora.fetch_corpus("toy", str(target), progress=False) == paths
    assert len(server.requests) == asked  # present files are not downloaded again


def test_a_corrupt_file_keeps_nothing(served, tmp_path):
    server, folder = served
    (folder / "test.txt").write_bytes(b" something else \n")
    target = tmp_path / "t"
    with pytest.raises(DataError) as err:
        corpora.fetch_corpus("toy", str(target), progress=False)
    message = str(err.value)
    assert "test.txt has git blob SHA-1 " + file_blob_sha1(str(folder / "test.txt")) in message
    assert "expected " + git_blob_sha1(FILES["test.txt"]) in message and "--no_verify" in message
    assert os.listdir(target) == []  # not even the good files: all or none
    paths = corpora.fetch_corpus("toy", str(target), progress=False, verify=False)  # kept when asked
    assert open(paths["test.txt"], "rb").read() == b" something else \n"


def test_only_missing_files_are_fetched_and_a_mirror_wins(served, tmp_path, monkeypatch):
    server, folder = served
    target = tmp_path / "t"
    target.mkdir()
    (target / "train.txt").write_bytes(b"my own copy\n")
    monkeypatch.setitem(corpora.CORPORA, "toy", corpora.Corpus("toy", "http://127.0.0.1:9/nowhere",
                                                               corpora.CORPORA["toy"].files, "a toy"))
    monkeypatch.setenv(corpora.URL_ENV, server.url)
    corpora.fetch_corpus("toy", str(target), progress=False)
    assert sorted(server.requests) == ["/test.txt", "/valid.txt"]
    assert (target / "train.txt").read_bytes() == b"my own copy\n"  # the user's file is kept


def test_unknown_corpus_names_the_choices():
    with pytest.raises(UsageError, match=r"unknown corpus 'wikitext2'; did you mean 'wikitext-2'"):
        corpora.fetch_corpus("wikitext2", "unused")


def test_the_pinned_address_is_a_commit_and_every_file_has_a_hash():
    for corpus in corpora.CORPORA.values():
        commit = [part for part in corpus.url.split("/") if len(part) == 40]
        assert commit and all(c in "0123456789abcdef" for c in commit[0]), corpus.url  # immutable bytes
        assert corpus.files and all(len(h) == 40 for h in corpus.files.values())


def _lmkit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lmkit", "download", *args], cwd=ROOT,
                          env=subprocess_env(env), capture_output=True, text=True, timeout=120)


def test_cli_downloads_wikitext_2_from_a_mirror_and_refuses_other_bytes(tmp_path):
    folder = tmp_path / "mirror"
    folder.mkdir()
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    with StaticServer(str(folder)) as server:
        target = tmp_path / "wt2"
        res = _lmkit("wikitext-2", "--dir", str(target), "--url", server.url)
        assert res.returncode == 2, res.stderr
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "train.txt has git blob SHA-1" in errors[0], res.stderr
        assert "expected " + corpora.CORPORA["wikitext-2"].files["train.txt"] in errors[0]
        assert not target.exists() or os.listdir(target) == []
        res = _lmkit("wikitext-2", "--dir", str(target), "--url", server.url, "--no_verify")
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == "wikitext-2: " + ", ".join(str(target / n) for n in FILES)
        assert (target / "valid.txt").read_bytes() == FILES["valid.txt"]


def test_cli_downloads_ptb_and_lists_and_refuses_unknown_names(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    make_ptb_archive(str(served / "simple-examples.tgz"))
    with StaticServer(str(served)) as server:
        res = _lmkit("ptb", "--dir", str(tmp_path / "ptb"), "--url", server.url + "/simple-examples.tgz",
                     "--no_verify")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("ptb.test.txt") and os.path.isfile(res.stdout.split(", ")[-1].strip())
    res = _lmkit("--list")
    assert res.returncode == 0 and res.stdout.split()[0] == "ptb" and "wikitext-2" in res.stdout
    res = _lmkit("wikitxt")
    assert res.returncode == 2 and "unknown corpus 'wikitxt'; did you mean 'wikitext-2'? choices: ptb, wikitext-2" \
        in res.stderr
