"""lmkit.data.records: whole records of JSON Lines (compressed too), Parquet, datasets folders and plain text."""
import gzip
import json

import pytest

from lmkit.data.errors import DataError
from lmkit.data.formats import Source
from lmkit.data.records import read_records

RECORDS = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
           {"prompt": "a", "completion": "b"},
           {"messages": [{"role": "user", "content": "ü\nx"}, {"role": "assistant", "content": "z"}]}]


def _jsonl(records):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def test_json_lines_plain_and_compressed_give_each_object_named_by_record_and_line(tmp_path):
    plain = tmp_path / "chat.jsonl"
    plain.write_text("\ufeff" + _jsonl(RECORDS[:1]) + "\n  \n" + _jsonl(RECORDS[1:]), encoding="utf-8")
    packed = tmp_path / "chat.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, packed):
        got = list(read_records(path))
        assert [r for _, r in got] == RECORDS
        assert [w for w, _ in got] == ["record 1 (line 1)", "record 2 (line 4)", "record 3 (line 5)"]


def test_a_line_that_is_not_a_json_object_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(_jsonl(RECORDS[:1]) + "[1, 2]\n")
    with pytest.raises(DataError, match=r"valid_file '.*bad.jsonl': record 2 \(line 2\) is a JSON list, not an "
                                        r"object"):
        list(read_records(path, "valid_file"))


def test_parquet_rows_come_as_dicts_with_their_nested_messages(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    path = tmp_path / "chat.parquet"
    table = pa.Table.from_pylist([{"messages": RECORDS[0]["messages"], "id": 1},
                                  {"messages": RECORDS[2]["messages"], "id": 2}])
    pq.write_table(table, path, row_group_size=1)
    assert list(read_records(path)) == [("record 1", {"messages": RECORDS[0]["messages"], "id": 1}),
                                        ("record 2", {"messages": RECORDS[2]["messages"], "id": 2})]
    (tmp_path / "fake.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"train_file '.*fake.parquet' is not a Parquet file"):
        list(read_records(tmp_path / "fake.parquet"))
    (tmp_path / "chat.parquet.gz").write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(DataError, match=r"is a Parquet file compressed as a whole, which is not read"):
        list(read_records(tmp_path / "chat.parquet.gz"))


def test_a_datasets_folder_gives_the_split_the_source_names(tmp_path):
    datasets = pytest.importorskip("datasets")
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(RECORDS[1:2]),
                                   "validation": datasets.Dataset.from_list([{"prompt": "c", "completion": "d"}])})
    splits.save_to_disk(str(tmp_path / "ds"))
    assert [r for _, r in read_records(tmp_path / "ds")] == RECORDS[1:2]
    assert [r for _, r in read_records(Source(tmp_path / "ds", dataset_split="validation"))] == \
        [{"prompt": "c", "completion": "d"}]
    with pytest.raises(DataError, match=r"no 'test' split"):
        list(read_records(Source(tmp_path / "ds", dataset_split="test")))


def test_plain_text_gives_each_line_as_a_text_record(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"one line\r\n\ntwo\n")
    assert list(read_records(path)) == [("record 1 (line 1)", {"text": "one line"}),
                                        ("record 2 (line 3)", {"text": "two"})]
    path.write_bytes(b"ok\n\xff\n")
    with pytest.raises(DataError, match=r"record 2 \(line 2\) is not UTF-8"):
        list(read_records(path))
