"""lmkit.data.example_cache: records encoded once into ids, weights and example offsets, memory-mapped after."""
import json
import os

import numpy as np
import pytest

from lmkit.data.chat import BadRecord, ChatEncoder
from lmkit.data.errors import DataError
from lmkit.data.example_cache import cached_examples, check_bad_records, encode_examples, open_cached_examples
from tests.data.test_chat import CONVERSATIONS, make_chat_folder


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return ChatEncoder.from_folder(make_chat_folder(str(tmp_path_factory.mktemp("chat") / "chatml"), "chatml"))


def _write(path, records):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def files(tmp_path):
    first = _write(tmp_path / "a.jsonl", [{"messages": m} for m in CONVERSATIONS] +
                   [{"prompt": "the cat", "completion": " sat"}])
    second = _write(tmp_path / "b.jsonl", [{"messages": CONVERSATIONS[1]}, {"text": "a dog ran"}])
    return [first, second]


def _same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.weights, b.weights)


def test_the_cache_holds_the_ids_and_weights_encoding_gives_and_is_reused(encoder, files, tmp_path):
    root = str(tmp_path / "cache")
    plain = encode_examples(encoder, files)
    assert plain.folder == "" and len(plain.examples) == len(CONVERSATIONS) + 3
    lines = []
    first = cached_examples(root, encoder, files, log=lines.append)
    assert not first.reused and any(line.startswith("encoding train_file") for line in lines)
    assert isinstance(first.examples.ids, np.memmap) and first.examples.ids.dtype == np.uint16
    _same(first.examples, plain.examples)
    assert first.report == plain.report and first.report.records == len(CONVERSATIONS) + 3
    again = open_cached_examples(root, encoder, files)
    assert again.reused and again.folder == first.folder
    _same(again.examples, plain.examples)
    names = sorted(os.listdir(first.folder))
    assert names == ["examples.bin", "ids.bin", "manifest.json", "tokenizer", "weights.bin"]
    manifest = json.load(open(os.path.join(first.folder, "manifest.json")))
    assert manifest["layout"] == "examples" and manifest["examples"] == len(plain.examples)
    _same(again.in_memory().examples, plain.examples)


def test_another_template_format_or_setting_is_another_folder(encoder, files, tmp_path):
    root = str(tmp_path / "cache")
    base = cached_examples(root, encoder, files).folder
    prompts = ChatEncoder(encoder.tokenizer, encoder.template, train_on_prompt=True)
    other = ChatEncoder(encoder.tokenizer, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    folders = {base, cached_examples(root, prompts, files).folder, cached_examples(root, other, files).folder,
               cached_examples(root, encoder, files[:1], data_format="chat", skip_bad_records=True).folder}
    assert len(folders) == 4
    assert open_cached_examples(root, ChatEncoder(encoder.tokenizer, encoder.template), files).folder == base
    with open(files[1], "a", encoding="utf-8") as f:  # an edited file
        f.write(json.dumps({"text": "more"}) + "\n")
    assert open_cached_examples(root, encoder, files) is None


def test_bad_records_stop_the_encoding_or_are_kept_out_and_named_later(encoder, tmp_path):
    root = str(tmp_path / "cache")
    path = _write(tmp_path / "bad.jsonl", [{"messages": CONVERSATIONS[0]}, {"messages": [{"role": "user",
                                                                                         "content": "hi"}]},
                                          {"prompt": "a"}, {"messages": CONVERSATIONS[1]}])
    with pytest.raises(BadRecord, match=r"train_file '.*bad.jsonl': record 2 \(line 2\): has no assistant turn"):
        cached_examples(root, encoder, [path])
    assert not os.path.isdir(root) or os.listdir(root) == []  # nothing left behind
    found = cached_examples(root, encoder, [path], skip_bad_records=True, what="valid_file")
    assert len(found.examples) == 2 and found.report.skipped == {"no assistant turn": 1, "no messages or prompt": 1}
    assert check_bad_records(found, True, "valid_file") is found
    reopened = open_cached_examples(root, encoder, [path])
    with pytest.raises(BadRecord, match=r"valid_file '.*bad.jsonl': record 2 \(line 2\): has no assistant turn: "
                                        r"nothing to train on; fix it, or pass --skip_bad_records"):
        check_bad_records(reopened, False, "valid_file")
    nothing = _write(tmp_path / "none.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DataError, match=r"has no example to train on \(1 bad ones skipped\)"):
        encode_examples(encoder, [nothing], skip_bad_records=True)


def test_a_broken_cache_folder_is_named_with_the_fix(encoder, files, tmp_path):
    root = str(tmp_path / "cache")
    folder = cached_examples(root, encoder, files).folder
    with open(os.path.join(folder, "weights.bin"), "ab") as f:
        f.write(b"\0")
    with pytest.raises(DataError, match=r"weights.bin holds .* bytes, but its manifest says .* delete the folder"):
        open_cached_examples(root, encoder, files)
