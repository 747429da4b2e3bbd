"""A model trained from scratch with a pretrained tokenizer (``--tokenizer hf:FOLDER_OR_NAME``): the ids are the
``tokenizers`` library's, the tokenizer lives in the run folder (generate and resume need no source folder), the
model's vocab_size follows the documented rule, and export writes it back for ``transformers.AutoTokenizer``.

The tokenizer is a small GPT-2-style byte-level BPE trained in the test with ``tokenizers``; no network.
"""
import json
import os
import random
import shutil
import sys

import pytest
from tokenizers import ByteLevelBPETokenizer, Tokenizer

from lmkit.core.errors import UsageError
from lmkit.data.errors import DataError
from lmkit.data.tokenizers import load_tokenizer, train_tokenizer
from tests.helpers import run

LMKIT = [sys.executable, "-m", "lmkit"]
END = "<|endoftext|>"
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "fast", "blue", "sky", "über", "naïve", "42", "!"]
TINY = ["--set", "model='gpt2'", "--set", "hidden_size=32", "--set", "ffn_dim=64", "--set", "num_layers=1",
        "--set", "num_heads=2", "--set", "batch_size=4", "--set", "num_steps=16", "--set", "max_positions=64",
        "--set", "learning_rate=0.01", "--set", "optimizer='adam'", "--set", "optimizer_params={}",
        "--set", "warmup_epochs=0.0", "--set", "model.dropout=0.0"]


def documents(count=40, seed=0):
    """Documents of one to three lines of words."""
    rng = random.Random(seed)
    return ["\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(rng.randint(1, 3)))
            for _ in range(count)]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A corpus whose documents are separated by ``<|endoftext|>`` lines (as TinyStories' text files are), and
    the same BPE saved both ways lmkit reads: ``tokenizer.json``, and GPT-2's ``vocab.json`` + ``merges.txt``."""
    root = tmp_path_factory.mktemp("hf_tokenizer")
    docs = documents()
    text = f"\n{END}\n".join(docs) + "\n"
    corpus = root / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=300, min_frequency=1, special_tokens=[END])
    (root / "json").mkdir()
    bpe.save(str(root / "json" / "tokenizer.json"))
    (root / "gpt2_files").mkdir()
    bpe.save_model(str(root / "gpt2_files"))  # vocab.json, merges.txt
    reference = Tokenizer.from_file(str(root / "json" / "tokenizer.json"))
    return {"root": root, "corpus": str(corpus), "text": text, "docs": docs, "reference": reference,
            "folders": {"json": str(root / "json"), "gpt2_files": str(root / "gpt2_files")}}


def run_data(corpus, tokenizer, model_dir, cache, vocab_size=None):
    """``load_run_data`` of a tiny config with ``tokenizer``; the log lines too."""
    from lmkit import distributed as dist
    from lmkit.config import load_config
    from lmkit.train.run_data import load_run_data
    dist.init(backend="local")
    overrides = {"data": "text", "train_file": corpus, "tokenizer": tokenizer, "data_cache": cache}
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    config = load_config("config_tiny_transformer", overrides)
    lines = []
    return load_run_data(config, model_dir, log=lines.append), lines


@pytest.mark.parametrize("layout", ["json", "gpt2_files"])
@pytest.mark.parametrize("cache", ["none", "cache"])
def test_the_ids_are_the_tokenizers_librarys_with_the_end_of_text_between_documents(made, layout, cache, tmp_path):
    folder = made["folders"][layout]
    data, lines = run_data(made["corpus"], f"hf:{folder}", str(tmp_path / "run"),
                           "none" if cache == "none" else str(tmp_path / "cache"))
    reference = made["reference"]
    expected = reference.encode(made["text"]).ids
    assert [int(i) for i in data.train] == expected
    end, newline = reference.token_to_id(END), reference.token_to_id("Ċ")
    assert data.vocab.bos_id == end and data.vocab.eos_id == newline
    # The documents, one after the other, each followed by its line break, <|endoftext|> and a line break.
    stream, start = list(expected), 0
    for doc in made["docs"]:
        ids = reference.encode(doc + "\n").ids
        assert stream[start:start + len(ids)] == ids
        start += len(ids)
        if start < len(stream):
            assert stream[start:start + 2] == [end, newline]
            start += 2
    assert start == len(stream) and stream.count(end) == len(made["docs"]) - 1
    # config_tiny_transformer's vocab_size (65) is below the tokenizer's 300: the model takes 300, and says so.
    assert data.config.model["vocab_size"] == 300
    assert any(f"tokenizer: hf:{folder}, 300 ids" in line and "the model's vocab_size is the tokenizer's 300, not "
               "the config's 65" in line for line in lines), lines


def _records(made, kind, folder):
    """The documents as one record each, in ``kind`` (jsonl, parquet or a datasets folder)."""
    if kind == "jsonl":
        path = folder / "docs.jsonl"
        path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in made["docs"]), encoding="utf-8")
        return str(path)
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"text": made["docs"]}), str(folder / "docs.parquet"), row_group_size=7)
        return str(folder / "docs.parquet")
    import datasets
    datasets.Dataset.from_dict({"text": made["docs"]}).save_to_disk(str(folder / "docs"))
    return str(folder / "docs")


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "datasets"])
@pytest.mark.parametrize("cache", ["none", "cache"])
def test_records_are_documents_each_ended_by_the_end_of_text_id(made, kind, cache, tmp_path):
    """A record is a document: its ids (a line break inside it is the newline's id), then <|endoftext|>'s id,
    as nanoGPT's data preparation writes them; the end of the source ends a line (the newline's id)."""
    source = _records(made, kind, tmp_path)
    data, _ = run_data(source, f"hf:{made['folders']['json']}", str(tmp_path / "run"),
                       "none" if cache == "none" else str(tmp_path / "cache"))
    reference = made["reference"]
    end, newline = reference.token_to_id(END), reference.token_to_id("Ċ")
    expected = [i for doc in made["docs"] for i in reference.encode(doc).ids + [end]] + [newline]
    assert [int(i) for i in data.train] == expected
    assert any("\n" in doc for doc in made["docs"]) and newline in expected[:-1]
    # Words as a line's: each document's words, one for each <|endoftext|> and line break (as for an eos) and
    # one for the last line's end.
    assert data.words["train"] == sum(len(doc.split()) + 1 + doc.count("\n") for doc in made["docs"]) + 1


def test_lmkits_own_tokenizers_end_a_record_with_their_end_of_line_id(made, tmp_path):
    """No document_end: a record ends as a line of a plain file does (the same ids as the text, one document a
    line), with or without the cache."""
    from lmkit.data.formats import documents_for
    from lmkit.data.text import load_text_data
    source = _records({"docs": ["one two", "three\nfour"]}, "jsonl", tmp_path)
    plain = tmp_path / "docs.txt"
    plain.write_text("one two\nthree\nfour\n", encoding="utf-8")
    tokenizer = train_tokenizer("char", str(plain), str(tmp_path / "tok"))
    assert tokenizer.document_end is None and documents_for(tokenizer, [source]) == [source]
    for cache in (None, str(tmp_path / "cache")):
        ids = load_text_data(tokenizer, source, cache_dir=cache).train
        assert [int(i) for i in ids] == [int(i) for i in load_text_data(tokenizer, str(plain)).train]


def test_a_larger_vocab_size_pads_and_a_resumed_run_needs_no_source_folder(made, tmp_path):
    source = str(tmp_path / "tokenizer")
    shutil.copytree(made["folders"]["json"], source)
    run_dir = str(tmp_path / "run")
    data, lines = run_data(made["corpus"], f"hf:{source}", run_dir, "none", vocab_size=320)
    assert data.config.model["vocab_size"] == 320  # nanoGPT's padding: ids 300..319 never in the data
    assert int(data.train.max()) < 300
    assert any("keeps the config's vocab_size = 320: ids 300..319 are padding" in line for line in lines), lines
    shutil.rmtree(source)
    again, _ = run_data(made["corpus"], f"hf:{source}", run_dir, "none", vocab_size=320)  # from the run folder
    assert [int(i) for i in again.train] == [int(i) for i in data.train]
    assert load_tokenizer(run_dir).options["source"] == source
    # Another tokenizer asked of the same run folder is refused, naming both.
    with pytest.raises(DataError, match=r"holds a hf tokenizer with options .* but a hf tokenizer with options "):
        train_tokenizer(f"hf:{made['folders']['gpt2_files']}", made["corpus"], run_dir)


def test_a_folder_without_a_tokenizer_is_one_clear_error(made, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    run_dir = tmp_path / "run"
    with pytest.raises(DataError, match=rf"{empty} holds no tokenizer: neither tokenizer.json nor vocab.json \+ "
                                        r"merges.txt .* tokenizer.save_pretrained\(folder\)"):
        train_tokenizer(f"hf:{empty}", made["corpus"], str(run_dir))
    assert not run_dir.exists()  # nothing half-made
    with pytest.raises(UsageError, match=r"--tokenizer hf:\./no/such/folder: \./no/such/folder is not a folder; "
                                         r"pass a folder with tokenizer.json .* or a Hugging Face Hub name"):
        train_tokenizer("hf:./no/such/folder", made["corpus"], str(run_dir))


def test_a_hub_name_downloads_the_tokenizer_files_alone(made, tmp_path, monkeypatch):
    """``hf:<name>`` goes through huggingface_hub's snapshot_download, asking for no weights; a failed download
    is one message naming the flag and the way around it (no network in tests: the download is replaced)."""
    import huggingface_hub

    from lmkit.hub.download import TOKENIZER_FILES
    asked = []

    def download(repo_id, allow_patterns):
        asked.append((repo_id, allow_patterns))
        if repo_id == "owner/missing":
            raise OSError("404 Client Error: Repository Not Found")
        return made["folders"]["gpt2_files"]

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    tokenizer = train_tokenizer("hf:owner/tiny", made["corpus"], str(tmp_path / "run"))
    assert asked == [("owner/tiny", TOKENIZER_FILES)]
    assert not any("safetensors" in name for name in TOKENIZER_FILES)
    assert tokenizer.options["source"] == "owner/tiny"  # the name, not the download's folder
    assert tokenizer.encode("the cat sat") == made["reference"].encode("the cat sat").ids
    with pytest.raises(UsageError, match=r"--tokenizer hf:owner/missing: could not download 'owner/missing' from "
                                         r"the Hugging Face Hub \(OSError: 404 .*\); .* pass --tokenizer hf:DIR"):
        train_tokenizer("hf:owner/missing", made["corpus"], str(tmp_path / "other"))


def _lmkit(*args, timeout=300):
    res = run([*LMKIT, *args], timeout=timeout)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res


@pytest.mark.transformers
def test_train_from_scratch_generate_resume_and_export_without_the_source_folder(made, tmp_path):
    """lmkit train --tokenizer hf:FOLDER (2 steps, vocab_size padded to 320), the folder then removed: lmkit
    generate and a resumed run read the run's own copy, and lmkit export writes a tokenizer that
    transformers.AutoTokenizer reads with the same ids."""
    from transformers import AutoTokenizer
    source, run_dir, out = str(tmp_path / "tokenizer"), str(tmp_path / "run"), str(tmp_path / "exported")
    shutil.copytree(made["folders"]["gpt2_files"], source)
    train = ["train", "--train_file", made["corpus"], "--model_dir", run_dir, "--tokenizer", f"hf:{source}",
             "--data_cache", "none", *TINY, "--set", "vocab_size=320"]
    res = _lmkit(*train, "--max_steps", "2")
    assert f"tokenizer: hf:{source}, 300 ids" in res.stdout
    shutil.rmtree(source)
    res = _lmkit("generate", "--model_dir", run_dir, "--prompt", "the cat", "--strategy", "sample", "--seed", "0",
                 "--max_new_tokens", "12", "--num_samples", "2")
    assert res.stdout.startswith("[0.0] the cat") and "[0.1] the cat" in res.stdout
    _lmkit(*train, "--max_steps", "3")  # resumed from step 2
    with open(os.path.join(run_dir, "results.json"), encoding="utf-8") as f:
        assert json.load(f)["checkpoint"].endswith("ckpt-000000003")
    _lmkit("export", "--model_dir", run_dir, "--output", out)
    assert {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"} <= set(os.listdir(out))
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    end = made["reference"].token_to_id(END)
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (320, end, end)
    reference = AutoTokenizer.from_pretrained(out)
    for text in (made["text"], "the cat sat\n" + END + "\nüber naïve 42 !", "  two  spaces"):
        assert reference(text)["input_ids"] == made["reference"].encode(text).ids
    assert reference.decode(made["reference"].encode("über naïve 42 !").ids) == "über naïve 42 !"


def test_generation_never_picks_the_padded_ids(made, tmp_path):
    """A model with more ids than its tokenizer (a quarter of them padding): those ids name no text (decoding one
    is an error), so sampling never chooses them; an untrained model would pick one in 60 draws but for 1e-7."""
    from lmkit import decoding
    from lmkit.models import build_model
    tokenizer = train_tokenizer(f"hf:{made['folders']['json']}", made["corpus"], str(tmp_path / "run"))
    model = build_model(dict(model="gpt2", vocab_size=400, hidden_size=16, num_layers=1, num_heads=2, ffn_dim=32,
                             max_positions=32, init_scale=0.001))
    prompt = tokenizer.encode("the cat")
    samples = decoding.generate(model, [prompt], tokenizer=tokenizer, max_new_tokens=20,
                                sampler=decoding.get_sampler("sample"), seed=0, num_samples=3, return_samples=True)
    assert [len(s.ids) for s in samples] == [len(prompt) + 20] * 3
    assert max(max(s.ids) for s in samples) < tokenizer.vocab_size == 300
    with pytest.raises(DataError, match="id 350 is out of range for the hf tokenizer of 300 ids"):
        tokenizer.decode([350])


@pytest.mark.transformers
@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_a_llama_or_gemma_from_scratch_exports_its_pretrained_tokenizer(made, family, tmp_path):
    """The other families' exports of a model trained from scratch write the pretrained tokenizer too:
    AutoTokenizer gives the tokenizers library's ids, <|endoftext|> is the start and end id, and
    transformers' model reads the ids with lmkit's logits."""
    import numpy as np
    import tensorflow as tf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmkit.hub.converters import converter_for
    from lmkit.hub.export import export_new
    from lmkit.models import build_model
    tokenizer = train_tokenizer(f"hf:{made['folders']['json']}", made["corpus"], str(tmp_path / "run"))
    extra = dict(head_dim=8, num_kv_heads=1) if family == "gemma" else {}
    model = build_model(dict(model=family, vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=1,
                             num_heads=2, ffn_dim=32, max_positions=32, **extra))
    tf.random.set_seed(3)
    for v in model.trainable_variables:  # logits well away from zero
        v.assign_add(tf.random.normal(v.shape, stddev=0.2))
    out = str(tmp_path / "hf")
    export_new(converter_for(family), model, tokenizer, out)
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    end = made["reference"].token_to_id(END)
    assert (config["model_type"], config["bos_token_id"], config["eos_token_id"]) == (family, end, end)
    text = "the cat sat\nüber naïve 42 !"
    ids = AutoTokenizer.from_pretrained(out)(text)["input_ids"]
    assert ids == made["reference"].encode(text).ids == tokenizer.encode(text)
    with torch.no_grad():
        theirs = AutoModelForCausalLM.from_pretrained(out).eval()(torch.tensor([ids])).logits.numpy()[0]
    np.testing.assert_allclose(model(tf.constant([ids]))[0].numpy()[0], theirs, atol=1e-4, rtol=1e-4)
