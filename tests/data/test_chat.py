"""lmkit.data.chat: records as ids and loss weights; the assistant's tokens found by rendering prefixes, against
transformers' assistant masks on two templates with {% generation %} markers (the transformers-marked tests)."""
import json
import os
import random
import re

import numpy as np
import pytest

from lmkit.core.errors import UsageError
from lmkit.data.chat import (
    BadRecord,
    ChatEncoder,
    check_messages,
    encode_conversation,
    find_format,
    read_examples,
)
from lmkit.data.errors import DataError
from lmkit.data.records import read_records

# Qwen2's layout (ChatML), a default system turn; the assistant's answer, its <|im_end|> and the line break after
# it inside the generation block (what an assistant turn adds when the conversation is rendered through it).
CHATML = ("{% if messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
          "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
          "{% generation %}{{ m['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
          "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Llama 3's layout: <|begin_of_text|>, headers, trimmed contents each ended by <|eot_id|>.
LLAMA3 = ("{{ bos_token }}{% for m in messages %}"
          "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}"
          "{% if m['role'] == 'assistant' %}{%- generation -%}{{ m['content'] | trim + '<|eot_id|>' }}"
          "{%- endgeneration -%}{% else %}{{ m['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
STYLES = {"chatml": (CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|endoftext|>", "<|im_end|>"),
          "llama3": (LLAMA3, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                              "<|eot_id|>"], "<|begin_of_text|>", "<|eot_id|>")}
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "fast", "blue", "sky", "über", "42", "!", "user",
         "assistant", "system", "what", "is", "why"]
CONVERSATIONS = [
    [{"role": "user", "content": "the cat sat"}, {"role": "assistant", "content": "on a mat!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what is blue"},
     {"role": "assistant", "content": "the sky"}, {"role": "user", "content": "\nwhy"},
     {"role": "assistant", "content": " über 42\n\nfast"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "dog ran"}, {"role": "user", "content": "!"},
     {"role": "assistant", "content": "cat"}, {"role": "user", "content": "the mat"}],
    [{"role": "system", "content": "You are a dog."}, {"role": "user", "content": "sat?"},
     {"role": "assistant", "content": "  ran fast  "}, {"role": "assistant", "content": "again"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "\n\nthe cat"}],  # merges with the prompt
]


def strip_markers(template):
    return re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template)


def tiny_tokenizer(special, seed=0):
    """A byte-level BPE trained on a few words, with ``special`` tokens."""
    from tokenizers import ByteLevelBPETokenizer
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(300)]
    lines += ["the\n\n\ncat"] * 50  # a token of three line breaks
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines, vocab_size=320, min_frequency=1, special_tokens=special)
    return bpe._tokenizer


def make_chat_folder(folder, style, template=None, via_transformers=False):
    """A tokenizer folder with a chat template (``style``'s, or ``template``; "" for none), saved by
    transformers' PreTrainedTokenizerFast or by tokenizers alone."""
    default, special, bos, eos = STYLES[style]
    template = default if template is None else template
    os.makedirs(folder, exist_ok=True)
    backend = tiny_tokenizer(special)
    if via_transformers:
        from transformers import PreTrainedTokenizerFast
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos)
        if template:
            tokenizer.chat_template = template
        tokenizer.save_pretrained(folder)
        return folder
    backend.save(os.path.join(folder, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({**config, **({"chat_template": template} if template else {})}, f)
    return folder


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    return make_chat_folder(str(tmp_path_factory.mktemp("chat") / "chatml"), "chatml")


# ------------------------------------------------------------------ against transformers
@pytest.mark.transformers
@pytest.mark.parametrize("style", sorted(STYLES))
def test_the_weights_equal_transformers_assistant_masks_with_and_without_markers(tmp_path, style):
    from transformers import AutoTokenizer
    folder = make_chat_folder(str(tmp_path / style), style, via_transformers=True)
    reference = AutoTokenizer.from_pretrained(folder)
    bare = make_chat_folder(str(tmp_path / "bare"), style, strip_markers(STYLES[style][0]), via_transformers=True)
    assert "{% endgeneration" not in open(os.path.join(bare, "chat_template.jinja")).read()
    eos_id = reference.convert_tokens_to_ids(STYLES[style][3])
    for messages in CONVERSATIONS:
        expected = reference.apply_chat_template(messages, return_assistant_tokens_mask=True, return_dict=True,
                                                 tokenize=True)
        ids, weights = encode_conversation(folder, messages)
        assert ids.dtype == np.int32 and list(ids) == list(expected["input_ids"])
        assert list(weights) == list(expected["assistant_masks"]), messages
        assert sum(expected["assistant_masks"]) > 0
        # every end of an assistant turn weighs 1, every other end of turn 0
        ends = np.flatnonzero(ids == eos_id)
        assert sorted(weights[ends]) == sorted(int(m["role"] == "assistant") for m in
                                               ([{"role": "system"}] if style == "chatml" and
                                                messages[0]["role"] != "system" else []) + messages)
        bare_ids, bare_weights = encode_conversation(bare, messages)  # no markers: the same weights in lmkit
        assert list(bare_ids) == list(ids) and list(bare_weights) == list(weights)


@pytest.mark.transformers
def test_the_generation_markers_render_as_transformers_renders_them(tmp_path):
    from transformers import AutoTokenizer

    from lmkit.hub.chat import read_chat_template
    for style in STYLES:
        folder = make_chat_folder(str(tmp_path / style), style, via_transformers=True)
        reference = AutoTokenizer.from_pretrained(folder)
        for messages in CONVERSATIONS:
            for prompt in (False, True):
                assert read_chat_template(folder).render(messages, add_generation_prompt=prompt) == \
                    reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)


# ------------------------------------------------------------------ lmkit alone
def test_a_conversation_weighs_the_assistants_tokens_and_its_end_of_turn(chatml):
    messages = CONVERSATIONS[1]
    ids, weights = encode_conversation(chatml, messages)
    tokenizer = ChatEncoder.from_folder(chatml).tokenizer.hf
    assert list(ids) == tokenizer.encode(ChatEncoder.from_folder(chatml).template.render(messages, False),
                                         add_special_tokens=False).ids
    trained = tokenizer.decode([int(i) for i, w in zip(ids, weights) if w], skip_special_tokens=False)
    assert trained == "the sky<|im_end|>\n über 42\n\nfast<|im_end|>\n"
    assert weights.dtype == np.uint8
    # the generation prompt (<|im_start|>assistant\n) is scaffolding: weight 0
    start = tokenizer.token_to_id("<|im_start|>")
    assert not weights[ids == start].any()
    all_ids, all_weights = encode_conversation(chatml, messages, train_on_prompt=True)
    assert list(all_ids) == list(ids) and all_weights.all()


def test_a_tokenizer_and_a_template_object_give_what_the_folder_gives(chatml):
    from tokenizers import Tokenizer

    from lmkit.hub.chat import read_chat_template
    raw = Tokenizer.from_file(os.path.join(chatml, "tokenizer.json"))
    for template in (read_chat_template(chatml), CHATML):
        ids, weights = encode_conversation(raw, CONVERSATIONS[0], template=template)
        expected = encode_conversation(chatml, CONVERSATIONS[0])
        assert list(ids) == list(expected[0]) and list(weights) == list(expected[1])


def test_a_template_that_rewrites_earlier_turns_is_named_with_the_turn(tmp_path):
    # Drops the reasoning (<think>...</think>) of every assistant turn but the last, as Qwen3's does.
    rewriting = CHATML.replace("m['content'] + '<|im_end|>\\n'",
                               "(m['content'] if loop.last else m['content'].split('</think>')[-1]) + "
                               "'<|im_end|>\\n'")
    folder = make_chat_folder(str(tmp_path / "qwen3"), "chatml", rewriting)
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>cat</think>dog"},
                {"role": "user", "content": "b"}, {"role": "assistant", "content": "<think>sky</think>blue"}]
    with pytest.raises(BadRecord, match=r"turn 2 \(assistant\): the chat template renders the conversation up to "
                                        r"this turn otherwise than the start of the whole conversation"):
        encode_conversation(folder, messages)
    assert encode_conversation(folder, messages[:2])[1].any()  # one assistant turn: nothing rewritten
    assert encode_conversation(folder, messages, train_on_prompt=True)[1].all()


def test_a_folder_without_a_template_names_chat_template_and_still_encodes_completions(tmp_path):
    folder = make_chat_folder(str(tmp_path / "plain"), "chatml", template="")
    with pytest.raises(UsageError, match=r"has no chat template .* give one with --chat_template FILE"):
        encode_conversation(folder, CONVERSATIONS[0])
    template_file = tmp_path / "chat.jinja"
    template_file.write_text(CHATML)
    assert encode_conversation(folder, CONVERSATIONS[0], template=str(template_file))[1].any()
    with pytest.raises(UsageError, match=r"the chat template file '.*missing.jinja' does not exist"):
        encode_conversation(folder, CONVERSATIONS[0], template=str(tmp_path / "missing.jinja"))
    encoder = ChatEncoder.from_folder(folder)
    example = encoder.encode_record({"prompt": "the cat", "completion": " sat"})
    tokenizer = encoder.tokenizer.hf
    assert tokenizer.decode([int(i) for i in example.ids], skip_special_tokens=False) == \
        "the cat sat<|endoftext|>"
    prompt_ids = tokenizer.encode("the cat", add_special_tokens=False).ids
    assert list(example.weights) == [0] * len(prompt_ids) + [1] * (len(example.ids) - len(prompt_ids))


def test_a_text_record_weighs_every_id_and_ends_with_the_end_id(chatml):
    encoder = ChatEncoder.from_folder(chatml)
    example = encoder.encode_record({"text": "the dog ran"})
    assert example.weights.all() and example.ids[-1] == encoder.end_id
    assert encoder.tokenizer.hf.token_to_id("<|endoftext|>") == encoder.end_id


@pytest.mark.parametrize("record, fmt", [({"messages": []}, "chat"), ({"prompt": "", "completion": "x"}, "completion"),
                                         ({"text": "x", "id": 3}, "text"), ({"messages": [], "text": "x"}, "chat")])
def test_the_format_is_found_from_the_fields(record, fmt):
    assert find_format(record) == fmt
    assert find_format(record, fmt) == fmt


def test_a_record_without_the_formats_field_is_named():
    with pytest.raises(BadRecord, match=r"has no 'messages' \(a conversation\) or 'prompt' and 'completion'; "
                                        r"fields present: 'answer', 'question'"):
        find_format({"question": "a", "answer": "b"})
    with pytest.raises(BadRecord, match=r"has no field 'messages' \(data_format 'chat'\)"):
        find_format({"prompt": "a"}, "chat")
    with pytest.raises(DataError, match=r"data_format 'json' is not one of chat, completion, text"):
        find_format({"text": "a"}, "json")


@pytest.mark.parametrize("messages, reason, pattern", [
    ([{"role": "user"}], "message without role or content", r"turn 1 is not a message with a role and a content"),
    ([{"content": "x"}], "message without role or content", r"turn 1 is not a message"),
    ([{"role": "user", "content": "a"}, {"role": "tool", "content": "x"}], "unknown role",
     r"turn 2 has the unknown role 'tool'; roles are system, user, assistant"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": " \n"}], "empty assistant turn",
     r"turn 2 is an empty assistant turn"),
    ([{"role": "system", "content": "a"}, {"role": "user", "content": "b"}], "no assistant turn",
     r"has no assistant turn"),
    ([{"role": "user", "content": ["a"]}], "message without role or content", r"content that is not a string"),
    ("hi", "no messages or prompt", r"'messages' that are not a list of messages"),
])
def test_each_bad_conversation_gets_its_reason(messages, reason, pattern):
    with pytest.raises(BadRecord, match=pattern) as caught:
        check_messages(messages)
    assert caught.value.reason == reason


def test_bad_records_are_named_with_the_file_and_the_record_or_counted_and_skipped(chatml, tmp_path):
    path = tmp_path / "chat.jsonl"
    records = [{"messages": CONVERSATIONS[0]}, {"messages": [{"role": "user", "content": "a"}]},
               {"prompt": "a", "completion": "b"}, {"question": "x"},
               {"messages": [{"role": "bot", "content": "a"}]}, {"messages": CONVERSATIONS[2]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records[:3]) + "\n" +
                    "".join(json.dumps(r) + "\n" for r in records[3:]))
    encoder = ChatEncoder.from_folder(chatml)
    with pytest.raises(BadRecord, match=r"^train_file '.*chat.jsonl': record 2 \(line 2\): has no assistant turn: "
                                        r"nothing to train on; fix it, or pass --skip_bad_records"):
        read_examples(read_records(path), encoder, source=str(path))
    examples, report = read_examples(read_records(path), encoder, source=str(path), skip_bad_records=True)
    assert len(examples) == 3 and report.records == 6
    assert report.skipped == {"no assistant turn": 1, "no messages or prompt": 1, "unknown role": 1}
    assert report.lines("train_file") == ["train_file: skipped 3 of 6 records (1 no assistant turn, 1 no messages "
                                          "or prompt, 1 unknown role)"]
    _, report = read_examples(read_records(path), encoder, source=str(path), data_format="chat", skip_bad_records=True)
    assert report.skipped == {"no assistant turn": 1, "no messages or prompt": 2, "unknown role": 1}


def test_a_template_that_fails_on_a_prefix_is_a_bad_record(tmp_path):
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}" + CHATML
    folder = make_chat_folder(str(tmp_path / "strict"), "chatml", strict)
    with pytest.raises(BadRecord, match=r"turn 1: .*the chat template refused the messages: user first") as caught:
        encode_conversation(folder, [{"role": "assistant", "content": "hi"}])
    assert caught.value.reason == "chat template error"


def test_an_answer_that_merges_with_the_generation_prompt_counts_as_the_assistants(chatml):
    encoder = ChatEncoder.from_folder(chatml)
    tokenizer = encoder.tokenizer.hf
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "\n\nthe cat"}]
    example = encoder.encode_messages(messages)
    whole = encoder.template.render(messages, False)
    encoding = tokenizer.encode(whole, add_special_tokens=False)
    boundary = len(encoder.template.render(messages[:1], True))
    straddling = [i for i, (s, e) in enumerate(encoding.offsets) if s < boundary < e]
    assert straddling and example.weights[straddling[0]] == 1  # "\n\n\n" holds the prompt's "\n" and the answer's
    assert encoder.merged_boundaries == 1


def test_a_source_holds_examples_when_its_first_record_has_messages_or_a_prompt(tmp_path):
    from lmkit.data.chat import holds_examples
    for name, record, expected in (("chat.jsonl", {"messages": CONVERSATIONS[0]}, True),
                                   ("pairs.jsonl", {"prompt": "a", "completion": "b"}, True),
                                   ("text.jsonl", {"text": "the cat"}, False)):
        path = tmp_path / name
        path.write_text(json.dumps(record) + "\n" + json.dumps({"text": "x"}) + "\n")
        assert holds_examples(str(path)) is expected, name
    plain = tmp_path / "plain.txt"
    plain.write_text('{"messages": []}\n')  # plain text is never records
    assert not holds_examples(str(plain))
    (tmp_path / "empty.jsonl").write_text("")
    assert not holds_examples(str(tmp_path / "empty.jsonl"))


def test_records_encode_one_at_a_time_into_a_tally(chatml):
    from lmkit.data.chat import Tally, encode_records
    encoder = ChatEncoder.from_folder(chatml)
    records = [("record 1", {"messages": CONVERSATIONS[4]}), ("record 2", {"messages": CONVERSATIONS[0][:1]}),
               ("record 3", {"text": "a cat"})]
    tally = Tally()
    examples = encode_records(records, encoder, tally, source="x.jsonl", skip_bad_records=True)
    assert tally.records == 0  # nothing read before it is asked for
    assert len(list(examples)) == 2 and tally.records == 3
    assert tally.first_bad == ("x.jsonl", "record 2", "has no assistant turn: nothing to train on",
                               "no assistant turn")
    assert tally.report().skipped == {"no assistant turn": 1} and tally.report().merged_boundaries == 1


def test_the_encoders_identity_follows_its_template_and_settings(chatml):
    encoder = ChatEncoder.from_folder(chatml)
    same = ChatEncoder.from_folder(chatml)
    assert encoder.identity() == same.identity() and encoder.identity()["template"]["special"]["eos_token"]
    assert ChatEncoder(encoder.tokenizer, CHATML).identity() != encoder.identity()  # no special tokens
    assert ChatEncoder.from_folder(chatml, train_on_prompt=True).identity() != encoder.identity()
    assert ChatEncoder(encoder.tokenizer).identity()["template"] is None
