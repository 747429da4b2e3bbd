"""The encoding processes of the data cache: ids in order whatever the workers, a dead worker is one
DataError wherever the pool reports it (submit, result), and lines longer than a block cut into pieces."""
import concurrent.futures.process
import os
import signal
import time

import numpy as np
import pytest

from lmkit.data import encoding_pool, textfile, token_cache
from lmkit.data.errors import DataError
from lmkit.data.text import load_text_data
from lmkit.data.textfile import TextBlocks, check_text_file
from lmkit.data.tokenizers import ByteTokenizer, train_tokenizer

DIED = "an encoding process died while encoding train_file .*LMKIT_ENCODING_WORKERS=1"


@pytest.fixture
def tokenizer_dir(tmp_path) -> str:
    folder = str(tmp_path / "tok")
    ByteTokenizer().save(folder)
    return folder


def _blocks(n: int):
    return [(f"line {k}\n", False, True) for k in range(n)]


def _kill_a_worker(pool) -> None:
    """SIGKILL one worker, as the OOM killer would, and wait until the pool has seen it die."""
    deadline = time.monotonic() + 120
    while not pool._processes and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(next(iter(pool._processes)), signal.SIGKILL)
    while not pool._broken and time.monotonic() < deadline:  # the pool's own thread notes the death
        time.sleep(0.01)
    assert pool._broken, "the pool never saw its worker die"


def test_blocks_come_back_in_order_with_the_same_ids_in_one_process_or_two(tokenizer_dir):
    got = {}
    for workers in (1, 2):
        taken = []
        with encoding_pool.encoders(workers, tokenizer_dir, True, "train_file") as pool:
            assert (pool is None) == (workers == 1)
            encoding_pool.map_blocks(_blocks(9), encoding_pool.encode_block, pool, workers, taken.append)
        got[workers] = taken
    assert [lines for _, lines, _ in got[1]] == [1] * 9
    for one, two in zip(got[1], got[2]):
        np.testing.assert_array_equal(one[0], two[0])
    assert ByteTokenizer().decode(np.concatenate([ids for ids, _, _ in got[1]])) == \
        "".join(text for text, _, _ in _blocks(9))


def test_a_worker_dead_before_submit_is_one_data_error(tokenizer_dir, monkeypatch):
    # The pool already saw the death: submit raises BrokenProcessPool (no future to ask), which used to
    # escape as a raw traceback and exit 1 (issue 55).
    raised = []
    with pytest.raises(DataError, match=DIED):
        with encoding_pool.encoders(2, tokenizer_dir, True, "train_file") as pool:
            _kill_a_worker(pool)
            real_submit = pool.submit

            def submit(*args, **kwargs):
                try:
                    return real_submit(*args, **kwargs)
                except concurrent.futures.process.BrokenProcessPool as exc:
                    raised.append(exc)
                    raise

            monkeypatch.setattr(pool, "submit", submit)
            encoding_pool.map_blocks(_blocks(3), encoding_pool.encode_block, pool, 2, lambda result: None)
    assert len(raised) == 1  # it was submit that raised


def test_a_worker_dead_while_its_block_is_in_flight_is_the_same_error(tokenizer_dir):
    def take_then_kill(pool):
        def take(result) -> None:
            if not pool._broken:
                _kill_a_worker(pool)
        return take

    with pytest.raises(DataError, match=DIED):
        with encoding_pool.encoders(2, tokenizer_dir, True, "train_file") as pool:
            encoding_pool.map_blocks(_blocks(40), encoding_pool.encode_block, pool, 2, take_then_kill(pool))


def test_workers_setting_and_id_types(monkeypatch):
    monkeypatch.setenv(encoding_pool.WORKERS_ENV, "3")
    assert encoding_pool.encoding_workers() == 3
    monkeypatch.setenv(encoding_pool.WORKERS_ENV, "zero")
    with pytest.raises(DataError, match="LMKIT_ENCODING_WORKERS = 'zero' must be a positive integer"):
        encoding_pool.encoding_workers()
    assert encoding_pool.id_dtype(1 << 16) == np.uint16 and encoding_pool.id_dtype((1 << 16) + 1) == np.uint32


# ----------------------------------------------------------------------------------------------------
# Files without line breaks: memory bounded whatever the line length, and a bare CR ends a line.
#
# The blocks are made small (``BLOCK_BYTES``) so that a "long line" is a few hundred KB; a spy on the
# encoder sees every block, and the ids are compared with the in-memory encoding of whole lines.
BLOCK = 4096
WORDS = "the a cat dog sat ran on under mat log and then quickly slowly big small red blue café".split()


def _long_line_text(seed: int, words: int) -> str:
    """Short lines (CRLF and bare CR ends among them), then one line of ``words`` words with single,
    double and tab separators, then short lines again."""
    rng = np.random.default_rng(seed)
    gaps = rng.choice([" ", " ", " ", "  ", "\t"], size=words)
    line = "".join(str(w) + str(g) for w, g in zip(rng.choice(WORDS, size=words), gaps)).rstrip()
    head = "a short first line\r\nthen a mac line\rand a unix one\n\n"
    return head + line + "\n" + "the tail line\n  \nlast cat\r"


def _hf_bpe(folder):
    """A small GPT-2-style byte-level BPE (the ``tokenizers`` package), as the hf kind wraps it."""
    tokenizers = pytest.importorskip("tokenizers")
    from lmkit.hub.tokenizer import HFTokenizer

    tk = tokenizers.Tokenizer(tokenizers.models.BPE())
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
                                             show_progress=False)
    tk.train_from_iterator([" ".join(WORDS)] * 20, trainer)
    tokenizer = HFTokenizer(tk, str(folder))
    tokenizer.save(folder)
    return tokenizer


@pytest.fixture(scope="module")
def long_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("long") / "one_line.txt"
    path.write_bytes(_long_line_text(0, 40_000).encode("utf-8"))  # a line of about 200 KB
    assert os.path.getsize(path) > 40 * BLOCK
    return str(path)


@pytest.fixture
def spy(monkeypatch):
    """Records ``(bytes, ends_line)`` of every block the encoder gets (one process: workers=1)."""
    seen = []
    real = token_cache.encode_block

    def encode(text, continues=False, ends_line=True):
        seen.append((len(text.encode("utf-8")), ends_line))
        return real(text, continues, ends_line)

    monkeypatch.setattr(token_cache, "encode_block", encode)
    _small_blocks(monkeypatch)
    return seen


def _small_blocks(monkeypatch):
    monkeypatch.setattr(encoding_pool, "BLOCK_BYTES", BLOCK)  # the cache's reads
    monkeypatch.setattr(textfile, "BLOCK_BYTES", BLOCK)  # the checks' and the tokenizers' reads


@pytest.mark.parametrize("kind", ["word", "char", "byte", "sentencepiece", "hf"])
def test_a_line_longer_than_a_block_is_cut_at_spaces_into_the_ids_of_the_whole_line(long_file, spy, kind,
                                                                                     tmp_path):
    if kind == "hf":
        tokenizer = _hf_bpe(tmp_path / "tok")
    else:
        tokenizer = train_tokenizer(kind, long_file, tmp_path / "tok",
                                    **({"vocab_size": 40} if kind == "sentencepiece" else {}))
    whole = load_text_data(tokenizer, long_file)  # in memory: whole lines
    cached = token_cache.encode_to_cache(str(tmp_path / "cache"), tokenizer, [long_file], True, workers=1)
    np.testing.assert_array_equal(cached.ids, whole.train)
    assert cached.words == whole.train_words and cached.lines == 6
    assert max(size for size, _ in spy) <= 2 * BLOCK  # the line never was in memory whole
    assert sum(1 for _, ends in spy if not ends) >= 40  # it was cut into pieces


def test_the_pieces_are_encoded_alike_in_several_processes(long_file, monkeypatch, tmp_path):
    _small_blocks(monkeypatch)
    tokenizer = train_tokenizer("word", long_file, tmp_path / "tok")
    one = token_cache.encode_to_cache(str(tmp_path / "one"), tokenizer, [long_file], True, workers=1)
    two = token_cache.encode_to_cache(str(tmp_path / "two"), tokenizer, [long_file], True, workers=2)
    np.testing.assert_array_equal(one.ids, two.ids)
    assert (one.words, one.lines) == (two.words, two.lines)


def test_a_line_without_spaces_is_cut_between_characters(spy, tmp_path):
    """No space in a block: a hard cut, never inside a UTF-8 character (an é straddles the cut)."""
    path = tmp_path / "no_spaces.txt"
    line = "x" * (BLOCK - 1) + "é" + "yz€" * 9000
    path.write_text("first line\n" + line + "\nlast line\n", encoding="utf-8")
    for kind in ("char", "byte"):  # a cut word is still the same characters and bytes
        tokenizer = train_tokenizer(kind, str(path), tmp_path / kind)
        cached = token_cache.encode_to_cache(str(tmp_path / "c"), tokenizer, [str(path)], True, workers=1)
        np.testing.assert_array_equal(cached.ids, load_text_data(tokenizer, str(path)).train)
    assert max(size for size, _ in spy) <= 2 * BLOCK
    spy.clear()
    word = train_tokenizer("word", str(path), tmp_path / "word")
    cut = token_cache.encode_to_cache(str(tmp_path / "c"), word, [str(path)], True, workers=1)
    pieces = sum(1 for _, ends in spy if not ends)
    assert pieces >= 5 and cut.words == 3 + (pieces + 1 + 1) + 3  # the long word counts once per piece
    assert word.unk_id not in cut.ids  # the tokenizer was trained on the same pieces


def test_a_file_with_bare_cr_line_ends_is_read_line_by_line(spy, tmp_path):
    path = tmp_path / "mac.txt"
    path.write_bytes(("\r".join(f"line {k} of the old mac file" for k in range(3000)) + "\r").encode())
    tokenizer = train_tokenizer("word", str(path), tmp_path / "tok")
    assert len(tokenizer.vocab) == 4 + 3006  # words, not one giant line's
    cached = token_cache.encode_to_cache(str(tmp_path / "c"), tokenizer, [str(path)], True, workers=1)
    np.testing.assert_array_equal(cached.ids, load_text_data(tokenizer, str(path)).train)
    assert cached.lines == 3000 and int(np.sum(cached.ids == tokenizer.eos_id)) == 3000
    assert max(size for size, _ in spy) <= 2 * BLOCK and all(ends for _, ends in spy)
    with pytest.raises(DataError, match=r"has only blank lines \(4\)"):
        path.write_bytes(b"\r \r\t\r\n\r")
        check_text_file(str(path), "train_file")


def test_a_crlf_split_across_two_reads_is_one_line_end(spy, tmp_path):
    """The \\r that ends a read waits for the next one: a \\n there makes one line end, not two."""
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"x" * (BLOCK - 1) + b"\r\n" + b"ok\r\n" + b"caf\xe9\r\n")
    assert path.read_bytes()[BLOCK - 1:BLOCK + 1] == b"\r\n"
    tokenizer = train_tokenizer("byte", [], tmp_path / "tok")
    with pytest.raises(DataError, match=r"is not UTF-8: line 3 has the byte 0xe9 at byte 4 of the line"):
        token_cache.encode_to_cache(str(tmp_path / "c"), tokenizer, [str(path)], True, workers=1)
    path.write_bytes(path.read_bytes().replace(b"\xe9", "é".encode()))
    blocks = TextBlocks(str(path), "train_file", block_bytes=BLOCK)
    lines = [piece for block in blocks for piece, _, _ in
             textfile.line_segments(block.text, block.continues, block.ends_line)]
    assert lines == ["x" * (BLOCK - 1), "ok", "café"] and blocks.lines == 3


def test_reading_a_long_line_holds_a_bounded_piece(monkeypatch, long_file, tmp_path):
    """check_text_file, the word count and the tokenizer training read pieces of a long line too."""
    sizes = []
    real = textfile.TextBlocks._block

    def block(self, raw, ends_line):
        sizes.append(len(raw))
        return real(self, raw, ends_line)

    monkeypatch.setattr(textfile.TextBlocks, "_block", block)
    monkeypatch.setattr(textfile, "BLOCK_BYTES", BLOCK)
    check_text_file(long_file, "train_file")
    words = textfile.count_words(long_file, line_ends=True)
    tokenizer = train_tokenizer("word", long_file, tmp_path / "tok")
    assert max(sizes) <= 2 * BLOCK and len(sizes) >= 3 * 40
    text = open(long_file, encoding="utf-8", newline="").read()
    assert words == len(text.split()) + 6
    assert set(tokenizer.vocab.tokens[4:]) == set(text.split())


def test_the_line_layout_refuses_a_line_too_long_to_be_an_example(monkeypatch, tmp_path):
    monkeypatch.setattr(encoding_pool, "BLOCK_BYTES", 256)
    monkeypatch.setattr(encoding_pool, "MAX_LINE_BYTES", 2000)
    tokenizer = train_tokenizer("byte", [], tmp_path / "tok")
    path = tmp_path / "src.txt"
    path.write_text("a short one\n" + "word " * 500 + "\nthe end\n")
    root = tmp_path / "cache"
    with pytest.raises(DataError, match=r"source_file '.*src.txt': line 2 is longer than 2000 bytes; each "
                                        r"line of an encoder-decoder's file is one example"):
        token_cache.cached_lines(str(root), tokenizer, str(path), what="source_file")
    assert os.listdir(root) == []  # nothing half-written
    path.write_bytes(b"one\rtwo\r" * 300)
    with pytest.raises(DataError, match=r"line 1 is longer than 2000 bytes \(its lines end with a bare CR, "
                                        r"old Mac line ends.*tr '\\r' '\\n'"):
        token_cache.cached_lines(str(root), tokenizer, str(path), what="source_file")
    path.write_text("a short one\n" + "word " * 300 + "\nthe end\n")  # 1500 bytes: kept whole
    lines = token_cache.cached_lines(str(root), tokenizer, str(path), what="source_file")
    assert lines.lines == 3 and lines.lengths()[1] == 1500


def test_sentencepiece_trains_on_a_corpus_of_one_long_line(tmp_path):
    """SentencePiece skips lines over 4192 bytes: a one-line corpus left it nothing ("INTERNAL ...
    !sentences_.empty()"); the long line now reaches it in pieces, and sampled corpora too."""
    from lmkit.data import sentencepiece

    words = [f"w{i}" for i in range(300)]
    rng = np.random.default_rng(0)
    path = tmp_path / "one.txt"
    path.write_text(" ".join(words[i] for i in rng.integers(0, 300, 12000)))  # ~60 KB, no line break
    assert sentencepiece._longest_line([str(path)]) == os.path.getsize(path)
    tokenizer = train_tokenizer("sentencepiece", str(path), tmp_path / "spm", vocab_size=40)
    assert tokenizer.decode(tokenizer.encode("w1 w22 w299")) == "w1 w22 w299"
    lines = tmp_path / "lines.txt"
    lines.write_text("a b\r\nc\rd e f\n\n" * 3)
    assert sentencepiece._longest_line([str(lines)]) == 5
    sample = tmp_path / "sample.txt"
    assert sentencepiece._sample_lines([str(path)], str(sample), budget=30_000) == [str(sample)]
    pieces = sample.read_text().splitlines()
    assert pieces and max(len(p.encode()) for p in pieces) <= sentencepiece.MAX_SENTENCE_BYTES
