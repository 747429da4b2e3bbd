"""Source formats (lmkit.data.formats): each gives the ids of the same documents in a plain text file.

Every file is made here, small: JSON Lines, Parquet, a ``datasets`` folder
(and a DatasetDict), and plain text or JSON Lines compressed with gzip, bzip2
and zstd.
"""
import bz2
import gzip
import json
import os
import pickle
import subprocess
import sys

import datasets  # lmkit[data], in the test extra: these tests run, never skip
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from lmkit.data import formats, textfile, token_cache
from lmkit.data.errors import DataError
from lmkit.data.sources import resolve_sources
from lmkit.data.text import load_text_data
from lmkit.data.tokenizers import train_tokenizer
from tests.helpers import ROOT, subprocess_env

#: One document each: accents, a blank one and one of only spaces (skipped, as blank lines are), one
#: with a line break of its own (two lines, as in a plain file), and one as long as several reads.
DOCUMENTS = ["the old cat sat on the mat", "a café owner greets her naïve neighbour", "",
             "   ", "two lines\nin one record", "tabs\tand  double  spaces ", "a b c " * 300,
             "the end"]


def write_plain(path, documents):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("".join(doc + "\n" for doc in documents))
    return str(path)


def write_jsonl(path, documents, field="text"):
    with open(path, "w", encoding="utf-8") as f:
        for k, doc in enumerate(documents):
            f.write(json.dumps({"id": k, field: doc}) + "\n")
            if k == 2:
                f.write("\n")  # a blank line between records is skipped
    return str(path)


def write_parquet(path, documents, column="text"):
    # Row groups of 3: the reader goes from one to the next.
    pq.write_table(pa.table({"id": list(range(len(documents))), column: documents}), str(path), row_group_size=3)
    return str(path)


def save_dataset(path, documents, column="text", splits=None):
    data = datasets.Dataset.from_dict({"id": list(range(len(documents))), column: documents})
    if splits:
        other = datasets.Dataset.from_dict({"id": [0], column: ["another split's text"]})
        data = datasets.DatasetDict({name: data if name == splits[0] else other for name in splits})
    data.save_to_disk(str(path))
    return str(path)


def compress(path, suffix):
    with open(path, "rb") as f:
        data = f.read()
    if suffix == ".gz":
        packed = gzip.compress(data)
    elif suffix == ".bz2":
        packed = bz2.compress(data)
    else:  # two frames: a reader that stops after the first loses text
        middle = len(data) // 2
        packed = b"".join(zstandard.ZstdCompressor().compress(part) for part in (data[:middle], data[middle:]))
    with open(path + suffix, "wb") as f:
        f.write(packed)
    return path + suffix


def make_source(kind, folder, documents=DOCUMENTS):
    """The documents as a source of ``kind`` in ``folder``."""
    folder = str(folder)
    base, _, suffix = kind.partition(":")
    if base == "jsonl":
        path = write_jsonl(os.path.join(folder, "docs.jsonl"), documents)
    elif base == "txt":
        path = write_plain(os.path.join(folder, "docs.txt"), documents)
    elif base == "parquet":
        return write_parquet(os.path.join(folder, "docs.parquet"), documents)
    elif base == "datasets":
        return save_dataset(os.path.join(folder, "docs"), documents)
    else:  # a DatasetDict: the train split is the documents
        return save_dataset(os.path.join(folder, "docs"), documents, splits=["train", "validation"])
    return compress(path, suffix) if suffix else path


KINDS = ["jsonl", "parquet", "datasets", "datasetdict", "txt:.gz", "txt:.zst", "txt:.bz2", "jsonl:.zst",
         "jsonl:.gz", "jsonl:.bz2"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return write_plain(tmp_path_factory.mktemp("plain") / "docs.txt", DOCUMENTS)


@pytest.fixture(scope="module")
def char(plain, tmp_path_factory):
    return train_tokenizer("char", plain, tmp_path_factory.mktemp("char"))


@pytest.fixture(scope="module")
def trained_on_plain(plain, tmp_path_factory):
    return {name: train_tokenizer(name, plain, tmp_path_factory.mktemp(name), **options)
            for name, options in (("word", {}), ("sentencepiece", {"vocab_size": 40}))}


@pytest.mark.parametrize("kind", KINDS)
def test_each_format_gives_the_ids_words_and_tokenizer_of_the_plain_text(kind, plain, char, trained_on_plain,
                                                                          tmp_path):
    source = make_source(kind, tmp_path)
    want = token_cache.encode_to_cache(str(tmp_path / "cache"), char, [plain], True)
    got = token_cache.encode_to_cache(str(tmp_path / "cache"), char, resolve_sources(source), True)
    assert not got.reused and got.folder != want.folder
    np.testing.assert_array_equal(got.ids, want.ids)
    assert (got.words, got.lines) == (want.words, want.lines) == (textfile.count_words(plain, line_ends=True), 7)
    assert textfile.count_words(source, line_ends=True) == want.words
    # In memory (--data_cache none) too, and the tokenizers trained on it are those of the plain text.
    in_memory = load_text_data(char, source)
    np.testing.assert_array_equal(in_memory.train, want.ids)
    assert in_memory.train_words == want.words
    assert train_tokenizer("char", source, str(tmp_path / "char")).fingerprint() == char.fingerprint()
    for name, reference in trained_on_plain.items():
        options = {"vocab_size": 40} if name == "sentencepiece" else {}
        trained = train_tokenizer(name, source, str(tmp_path / name), **options)
        assert trained.fingerprint() == reference.fingerprint(), name


@pytest.mark.parametrize("kind", ["txt:.gz", "jsonl:.zst", "parquet", "datasets"])
def test_progress_counts_the_bytes_of_the_source_on_disk(kind, tmp_path):
    import random

    rng = random.Random(0)  # words that compress little, so the compressed file is read in many pieces
    words = ["".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(2000)]
    documents = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 300))) for _ in range(3000)]
    source = make_source(kind, tmp_path, documents)
    blocks = textfile.TextBlocks(source, "train_file", block_bytes=4096)
    seen = [blocks.consumed for _ in blocks]
    size = formats.source_size(source)
    assert seen == sorted(seen) and seen[0] < size / 2 and seen[-1] == size
    assert blocks.read == sum(len(doc) + 1 for doc in documents)
    if kind in ("txt:.gz", "jsonl:.zst"):
        assert size < blocks.read / 2  # MB/s of the file on disk, not of its text


def test_a_datasetdict_gives_each_flag_its_split_and_the_split_keys_the_cache(tmp_path):
    from lmkit.data.tokenizers import ByteTokenizer

    byte = ByteTokenizer()
    folder = save_dataset(tmp_path / "dd", ["train text"], splits=["train", "validation", "test"])
    data = load_text_data(byte, folder, folder, folder)
    assert byte.decode(data.train) == "train text\n"
    assert byte.decode(data.valid) == byte.decode(data.test) == "another split's text\n"
    keys = {token_cache.cache_key(byte, resolve_sources(folder, dataset_split=split), True)
            for split in ("train", "validation", "test")}
    assert len(keys) == 3
    missing = save_dataset(tmp_path / "no_test", ["x"], splits=["train", "validation"])
    with pytest.raises(DataError, match=r"test_file '.*no_test' is a DatasetDict folder with the splits train, "
                                        r"validation and no 'test' split, .* name a split's own folder instead "
                                        r"\(e.g. .*no_test/train\)"):
        load_text_data(byte, folder, test_file=missing)
    # A split's own folder is a datasets folder of its own.
    assert byte.decode(load_text_data(byte, os.path.join(folder, "test")).train) == "another split's text\n"


def test_text_field_and_text_column_choose_the_text_and_key_the_cache(tmp_path, char):
    path = tmp_path / "two.jsonl"
    path.write_text('{"text": "the cat", "body": "the dog"}\n', encoding="utf-8")
    table = write_parquet(tmp_path / "two.parquet", ["the cat"], column="text")
    pq.write_table(pa.table({"text": ["the cat"], "body": ["the dog"]}), table)
    for source in (str(path), table):
        default = token_cache.encode_to_cache(str(tmp_path / "cache"), char, resolve_sources(source), True)
        chosen = resolve_sources(source, text_field="body", text_column="body")
        body = token_cache.encode_to_cache(str(tmp_path / "cache"), char, chosen, True)
        assert (char.decode(default.ids), char.decode(body.ids)) == ("the cat\n", "the dog\n")
        assert default.folder != body.folder
    # Plain text keys its caches as before formats existed: no reading options in its identity.
    plain = write_plain(tmp_path / "p.txt", ["x"])
    assert set(textfile.source_identity(plain)) == {"path", "size", "mtime_ns", "sample"}
    assert textfile.source_identity(str(path))["read"] == {"format": "jsonl", "text_field": "text"}


def test_flags_and_config_keys_set_the_field_and_the_column():
    from lmkit.cli.train import build_parser, config_from_args
    from lmkit.config import ConfigError, load_config

    args = build_parser("lmkit train").parse_args(["--config", "config_tiny_transformer", "--train_file", "a.jsonl",
                                                   "--text_field", "body", "--text_column", "content"])
    config = config_from_args(args, distributed=False)
    assert (config.data.text_field, config.data.text_column) == ("body", "content")
    flat = load_config("config_tiny_transformer", {"data": "text", "train_file": "a", "text_field": "t"})
    assert flat.data.text_field == "t"
    dotted = load_config("config_tiny_transformer", {"data.kind": "text", "data.train_file": "a",
                                                     "data.text_column": "c"})
    assert (dotted.data.text_field, dotted.data.text_column) == ("text", "c")
    with pytest.raises(ConfigError, match="text_field .*is empty; name the field"):
        load_config("config_tiny_transformer", {"data": "text", "train_file": "a", "text_field": " "})


def _bad_jsonl(tmp_path, lines):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("lines, message", [
    (['{"text": "a"}', '{"txt": "b", "id": 2}'],
     r"train_file '.*bad.jsonl': record 2 \(line 2\) has no field 'text'; did you mean 'txt'\? present: txt, id; "
     r"set --text_field to the one that holds the text"),
    (['{"text": "a"}', '', '{"text": 5}'],
     r"record 2 \(line 3\) has a number in the field 'text', not a string; .*set --text_field"),
    (['{"text": null}'], r"record 1 \(line 1\) has null in the field 'text', not a string"),
    (['{"text": ["a"]}'], r"record 1 \(line 1\) has a list in the field 'text'"),
    (['{"text": "a"', ], r"record 1 \(line 1\) is not JSON \(.*\); a .jsonl file holds one JSON object a line"),
    (['["text"]'], r"record 1 \(line 1\) is a JSON list, not an object"),
    (['{"text": "a\\u0000b"}'], r"record 1 \(line 1\) has a NUL character in its text"),
    (['{"text": "\\ud800"}'], r"record 1 \(line 1\) has text that is not valid Unicode"),
])
def test_a_bad_jsonl_record_is_one_error_naming_the_file_and_the_record(tmp_path, lines, message):
    path = _bad_jsonl(tmp_path, lines)
    with pytest.raises(DataError, match=message):
        textfile.check_text_file(resolve_sources(path)[0], "train_file")


def test_a_bad_column_or_record_of_arrow_data_is_one_error(tmp_path):
    table = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"id": [1, 2], "body": ["a", None]}), table)
    with pytest.raises(DataError, match=r"valid_file '.*t.parquet' has no column 'text'; present: id, body; "
                                        r"set --text_column"):
        textfile.check_text_file(table, "valid_file")
    with pytest.raises(DataError, match=r"t.parquet': the column 'id' holds int64, not strings .*"
                                        r"\(columns: id \(int64\), body \(string\)\)"):
        textfile.check_text_file(resolve_sources(table, text_column="id")[0], "train_file")
    with pytest.raises(DataError, match=r"t.parquet': record 2 has null in the column 'body', not a string"):
        textfile.check_text_file(resolve_sources(table, text_column="body")[0], "train_file")
    folder = save_dataset(tmp_path / "ds", ["a", "b"], column="content")
    with pytest.raises(DataError, match=r"'.*ds' has no column 'text'; present: id, content; set --text_column"):
        textfile.check_text_file(folder, "train_file")


def test_damaged_files_and_empty_ones_are_named(tmp_path, plain):
    text = open(plain, "rb").read()
    cut = tmp_path / "cut.txt.zst"
    cut.write_bytes(zstandard.ZstdCompressor().compress(text)[:-6])
    cut_gz = tmp_path / "cut.txt.gz"
    cut_gz.write_bytes(gzip.compress(text)[:-10])
    not_zstd, not_parquet = tmp_path / "plain.txt.zst", tmp_path / "x.parquet"
    not_zstd.write_bytes(text)
    not_parquet.write_bytes(text)
    for path, message in ((cut, r"cut.txt.zst' is damaged or not zstd \(the last frame is cut short\); "
                                r"test it with `zstd -t .*cut.txt.zst`, or give it uncompressed"),
                          (cut_gz, r"cut.txt.gz' is damaged or not gzip \(Compressed file ended"),
                          (not_zstd, r"plain.txt.zst' is damaged or not zstd \(.*Unknown frame descriptor"),
                          (not_parquet, r"x.parquet' is not a Parquet file")):
        with pytest.raises(DataError, match=message):
            textfile.check_text_file(str(path), "train_file")
    packed = tmp_path / "t.parquet.gz"
    packed.write_bytes(gzip.compress(b"x"))
    with pytest.raises(DataError, match=r"t.parquet.gz' is a Parquet file compressed as a whole, which is not read"):
        textfile.check_text_file(str(packed), "train_file")
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", " "])
    with pytest.raises(DataError, match=r"empty.jsonl' has no text \(no record, or only empty ones\)"):
        textfile.check_text_file(empty, "train_file")


@pytest.mark.parametrize("kind, module, package", [
    ("parquet", "pyarrow.parquet", "pyarrow"), ("datasets", "datasets", "datasets"),
    ("jsonl:.zst", "zstandard", "zstandard")])
def test_a_missing_library_names_the_file_and_the_install_command(kind, module, package, tmp_path, monkeypatch):
    source = make_source(kind, tmp_path)
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(DataError) as caught:
        textfile.check_text_file(source, "train_file")
    message = str(caught.value)
    assert f"train_file {source!r} is " in message and f"read with the {package} package, which is not installed" \
        in message and 'pip install "lmkit[data]"' in message, message


def test_plain_text_imports_none_of_the_optional_libraries(tmp_path, plain):
    probe = ("import sys\n"
             "from lmkit.data.sources import resolve_sources\n"
             "from lmkit.data.textfile import check_text_file, count_words\n"
             "from lmkit.data.tokenizers import train_tokenizer\n"
             f"files = resolve_sources({plain!r})\n"
             "check_text_file(files[0]); count_words(files[0])\n"
             f"train_tokenizer('word', files, {str(tmp_path / 'tok')!r})\n"
             "print(sorted(m for m in ('pyarrow', 'datasets', 'zstandard') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=subprocess_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_sources_keep_their_options_across_ranks_and_folders(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_jsonl(shards / "a.jsonl", ["a"])
    save_dataset(shards / "saved", ["b"])
    found = resolve_sources(str(shards), "valid_file", text_field="body", dataset_split="validation")
    assert found == [str(shards / "a.jsonl"), str(shards / "saved")]  # the saved folder is one source
    assert all((s.text_field, s.text_column, s.dataset_split) == ("body", "text", "validation") for s in found)
    again = pickle.loads(pickle.dumps(found))
    assert [(str(s), s.options()) for s in again] == [(str(s), s.options()) for s in found]
    # A Source in a spec keeps its own options; a plain path gets the call's.
    mixed = resolve_sources([found[0], str(shards / "saved")], text_field="other")
    assert [s.text_field for s in mixed] == ["body", "other"]
    assert resolve_sources(str(shards / "*"))[1] == str(shards / "saved")  # a glob finds it too
    # A Source naming several paths (the run's test_file, given to lmkit evaluate) gives each its options.
    listed = resolve_sources(formats.Source(f"{shards / 'saved'},{shards / 'a.jsonl'}", text_field="x"))
    assert [(str(s), s.text_field) for s in listed] == [(str(shards / "a.jsonl"), "x"), (str(shards / "saved"), "x")]
    assert not set(vars(formats.Source("p"))) & set(dir(str))  # no option hides a str method (a path is split)


@pytest.mark.parametrize("cache", ["cache", "none"])
def test_load_run_data_reads_each_split_in_its_format_as_lmkit_train_does(tmp_path, cache):
    from lmkit import distributed as dist
    from lmkit.config import load_config
    from lmkit.data.pipeline import load_run_data

    dist.init(backend="local")
    splits = {"train": DOCUMENTS, "valid": DOCUMENTS[::-1], "test": DOCUMENTS[1:5]}
    plain = {name: write_plain(tmp_path / f"{name}.txt", docs) for name, docs in splits.items()}
    files = {"train_file": write_jsonl(tmp_path / "train.jsonl", splits["train"], field="body"),
             "valid_file": write_parquet(tmp_path / "valid.parquet", splits["valid"], column="content"),
             "test_file": save_dataset(tmp_path / "dd", splits["test"], column="content", splits=["test", "train"])}
    config = load_config("config_tiny_transformer", {
        "data": "text", **files, "text_field": "body", "text_column": "content", "tokenizer": "char",
        "data_cache": str(tmp_path / "cache") if cache == "cache" else "none"})
    lines = []
    data = load_run_data(config, str(tmp_path / "model"), log=lines.append)
    assert data.vocab.fingerprint() == train_tokenizer("char", plain["train"], str(tmp_path / "ref")).fingerprint()
    want = load_text_data(data.vocab, plain["train"], plain["valid"], plain["test"])
    for name in ("train", "valid", "test"):
        np.testing.assert_array_equal(getattr(data, name), getattr(want, name))
        assert data.words[name] == getattr(want, f"{name}_words")
    if cache == "cache":
        assert any(line.startswith("encoding train_file (") and "train.jsonl" in line for line in lines), lines
