"""lmkit.train.chat_data: when a run's records are examples, the encoder of its model folder, each split encoded
once (into the data cache or not: the same examples), cut to the context, and what the log says."""
import json

import numpy as np
import pytest

from lmkit import distributed as dist
from lmkit.config import TrainConfig
from lmkit.core.errors import UsageError
from lmkit.data.chat import BadRecord
from lmkit.train.chat_data import chat_encoder, hf_chat_encoder, wants_examples
from lmkit.train.run_data import load_run_data
from tests.data.test_chat import CHATML, CONVERSATIONS
from tests.train.chat_support import make_qwen2_folder


@pytest.fixture(scope="module", autouse=True)
def _local():
    dist.init(backend="local")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_qwen2_folder(str(tmp_path_factory.mktemp("qwen2") / "qwen2"))


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _config(folder, train_file, **data):
    return TrainConfig.from_dict(dict(
        model=dict(name="llama", vocab_size=320, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                   max_positions=64, init_scale=0.02, dropout=0.0),
        data=dict(kind="text", train_file=train_file, tokenizer="hf", batch_size=2, num_steps=63, **data),
        optimization=dict(learning_rate=0.1, max_grad_norm=1.0, max_steps=1),
        checkpoints=dict(init_from=folder)))


def test_records_with_messages_or_a_prompt_are_examples_and_others_a_stream(tmp_path):
    chats = _jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATIONS[0]}])
    texts = _jsonl(tmp_path / "t.jsonl", [{"text": "the cat"}])
    data = TrainConfig.from_dict(dict(model="gpt2", vocab_size=50, hidden_size=16, num_layers=1, init_scale=0.02,
                                      dropout=0.0, batch_size=2, num_steps=8, learning_rate=0.1, max_grad_norm=1.0,
                                      max_steps=1, data="text", train_file=texts)).data
    assert wants_examples(data, [chats], True) and not wants_examples(data, [texts], True)
    for forced in (dict(data_format="text"), dict(packing=True)):
        assert wants_examples(type(data).from_dict({**data.to_dict(), **forced}), [texts], True)
    with pytest.raises(UsageError, match=r"data_format = 'messages' is not one of chat, completion, text"):
        wants_examples(type(data).from_dict({**data.to_dict(), "data_format": "messages"}), [texts], True)


def test_the_encoder_takes_the_folders_template_or_the_file_given(folder, tmp_path):
    from lmkit.data.tokenizers import load_tokenizer, train_tokenizer
    train_tokenizer("hf", "x", str(tmp_path / "run"), source=folder)
    tokenizer = load_tokenizer(str(tmp_path / "run"))
    config = _config(folder, "x.jsonl")
    assert chat_encoder(config, tokenizer).encode_messages(CONVERSATIONS[0]).weights.any()
    other = tmp_path / "other.jinja"
    other.write_text(CHATML.replace("You are a helpful assistant.", "Be brief."))
    replaced = chat_encoder(_config(folder, "x.jsonl", chat_template=str(other)), tokenizer)
    assert replaced.template.render(CONVERSATIONS[0][:1], True).startswith("<|im_start|>system\nBe brief.")
    assert replaced.template.special_tokens["eos_token"] == "<|im_end|>"  # the folder's special tokens
    with pytest.raises(UsageError, match=r"chat_template '.*missing.jinja' does not exist; give a Jinja file"):
        chat_encoder(_config(folder, "x.jsonl", chat_template=str(tmp_path / "missing.jinja")), tokenizer)
    word = type("Word", (), {"name": "word"})()
    with pytest.raises(UsageError, match=r"encoded with a pretrained model's tokenizer, not lmkit's 'word': pass "
                                         r"--init_from"):
        chat_encoder(config, word)
    assert hf_chat_encoder(folder, tokenizer).template is not None


def test_a_run_reads_the_same_examples_with_and_without_the_cache_and_logs_what_it_left_out(folder, tmp_path):
    long = {"role": "user", "content": " ".join(["the cat sat on a mat"] * 20)}
    answer = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "dog"}]
    train = _jsonl(tmp_path / "train.jsonl", [{"messages": m} for m in CONVERSATIONS] +
                   [{"messages": CONVERSATIONS[0][:1]}, {"prompt": "the cat", "completion": " sat on a mat"},
                    {"messages": [long, answer[1]]}, {"messages": answer + [long]}])  # dropped; cut
    valid = _jsonl(tmp_path / "valid.jsonl", [{"messages": CONVERSATIONS[1]}])
    runs = {}
    for cache in ("none", str(tmp_path / "cache")):
        lines = []
        config = _config(folder, train, valid_file=valid, skip_bad_records=True, data_cache=cache)
        data = load_run_data(config, str(tmp_path / f"run-{len(runs)}"), log=lines.append)
        runs[cache] = data
        text = "\n".join(lines)
        assert "train_file: skipped 1 of 9 records (1 no assistant turn)" in text, text
        assert "train_file: 2 examples are longer than 64 tokens: 1 cut at the end, 1 dropped" in text, text
        assert "train_file: 9 records -> 7 examples" in text and "valid_file: 1 records -> 1 examples" in text
        assert data.vocab.name == "hf" and data.config.data.num_steps == 63
    plain, cached = runs.values()
    assert isinstance(cached.train.ids, np.memmap) and len(plain.train) == len(cached.train) == 7
    for a, b in zip(plain.train, cached.train):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.weights, b.weights)
    assert max(plain.train.lengths) == 64
    with pytest.raises(BadRecord, match=r"train_file '.*train.jsonl': record 6 \(line 6\): has no assistant turn"):
        load_run_data(_config(folder, train, data_cache=str(tmp_path / "cache")), str(tmp_path / "run-x"),
                      log=lambda line: None)


def test_a_conversation_without_a_template_names_chat_template(tmp_path):
    bare = make_qwen2_folder(str(tmp_path / "bare"), template="")
    train = _jsonl(tmp_path / "train.jsonl", [{"prompt": "a", "completion": "b"}, {"messages": CONVERSATIONS[0]}])
    with pytest.raises(UsageError, match=r"a conversation is rendered with the model's chat template, and .*bare "
                                         r"has none; pass --chat_template FILE"):
        load_run_data(_config(bare, train, data_cache="none"), str(tmp_path / "run"), log=lambda line: None)
    template = tmp_path / "chat.jinja"
    template.write_text(CHATML)
    data = load_run_data(_config(bare, train, data_cache="none", chat_template=str(template)), str(tmp_path / "r2"),
                         log=lambda line: None)
    assert len(data.train) == 2
