"""Chat templates (lmkit.hub.chat: render_chat, encode_chat; lmkit generate --chat, a conversation as generate()'s
prompt) against transformers' apply_chat_template."""
import json
import os
import shutil

import pytest

from lmkit.core.errors import UsageError
from lmkit.hub.chat import encode_chat, read_chat_template, render_chat
from tests.models.llama.test_convert import _lmkit, make_llama_folder

pytestmark = pytest.mark.transformers

# Qwen2's layout, with a system turn that defaults when none is given.
TEMPLATE = ("{% if messages[0]['role'] != 'system' %}{{ bos_token }}<|im_start|>system\nYou are helpful.<|im_end|>\n"
            "{% endif %}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
            "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
            "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("chat") / "llama")
    make_llama_folder(path, chat_template=TEMPLATE)
    return path


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_the_prompt_and_its_ids_equal_transformers(folder, system):
    from transformers import AutoTokenizer

    from lmkit.hub.tokenizer import read_tokenizer
    reference = AutoTokenizer.from_pretrained(folder)
    template = read_chat_template(folder)
    messages = template.messages("the cat sat on\nthe mat", system)
    text = render_chat(messages, template)
    assert text == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == render_chat(messages, folder)  # the folder's template, read from it
    assert text.startswith("<|endoftext|>" if system is None else "<|im_start|>system\nBe brief.")
    ids = encode_chat(read_tokenizer(folder), messages, template)
    expected = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    assert ids == list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert template.eos_token == "<|im_end|>"
    assert render_chat(messages, template, add_generation_prompt=False) == reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=False)


def test_a_template_in_tokenizer_config_is_read_and_errors_are_named(folder, tmp_path):
    legacy = str(tmp_path / "legacy")
    shutil.copytree(folder, legacy)
    os.remove(os.path.join(legacy, "chat_template.jinja"))
    config_path = os.path.join(legacy, "tokenizer_config.json")
    config = json.load(open(config_path))
    json.dump({**config, "chat_template": [{"name": "default", "template": TEMPLATE}]}, open(config_path, "w"))
    assert read_chat_template(legacy).render([{"role": "user", "content": "hi"}]) == \
        read_chat_template(folder).render([{"role": "user", "content": "hi"}])
    with pytest.raises(UsageError, match=r"the chat template refused the messages: unknown role tool"):
        render_chat([{"role": "tool", "content": "x"}], legacy)
    with pytest.raises(UsageError, match=r"message 0 = \{'role': 'user'\} must be a dict with a 'role' and a"):
        render_chat([{"role": "user"}], legacy)
    own = type("Chars", (), {"name": "char"})()  # one of lmkit's own tokenizers: no special tokens
    with pytest.raises(UsageError, match="encoded by its model's Hugging Face tokenizer, not by a char tokenizer"):
        encode_chat(own, [{"role": "user", "content": "hi"}], legacy)
    json.dump(config, open(config_path, "w"))
    with pytest.raises(UsageError, match=r"has no chat template \(neither chat_template\.jinja nor chat_template in "
                                         r"tokenizer_config\.json\)"):
        read_chat_template(legacy)


def test_generate_with_chat_stops_at_the_end_of_the_turn(folder):
    """A conversation as generate()'s prompt (lmkit generate --chat): laid out by the folder's template, encoded
    as transformers encodes it, ended by the template's end of turn; planned without building the model."""
    from lmkit.decoding.plan import plan_generation
    conversation = [{"role": "user", "content": "hi"}]
    plan = plan_generation(folder, [conversation])
    assert plan.settings.stop == ("<|im_end|>",)  # the template's eos_token ends the assistant's turn
    assert plan.settings.start_token is False  # the template writes the start token itself: none is put before it
    from transformers import AutoTokenizer
    expected = AutoTokenizer.from_pretrained(folder).apply_chat_template(conversation, tokenize=True,
                                                                         add_generation_prompt=True)
    assert plan.ids[0] == list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert plan_generation(folder, conversation).ids == plan.ids  # one conversation, or a list of them
    with pytest.raises(UsageError, match="a conversation is laid out by its model's chat template"):
        plan_generation((object(), object()), conversation)


def test_generate_with_chat_lays_out_the_turn(folder):
    res = _lmkit("generate", "--model_dir", folder, "--chat", "--system", "Be brief.", "--prompt", "the cat",
                 "--strategy", "greedy", "--max_new_tokens", "8", "--one_line")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nthe cat"
                                 "<|im_end|>\\n<|im_start|>assistant\\n"), res.stdout  # one sample: its text alone
    res = _lmkit("generate", "--model_dir", folder, "--system", "x", "--prompt", "the cat")
    assert res.returncode == 2 and "--system gives a chat's system turn; add --chat" in res.stderr


def test_generation_markers_render_as_their_content_and_a_template_file_takes_the_folders_tokens(folder, tmp_path):
    """transformers' {% generation %} ... {% endgeneration %} (its assistant masks) is no error: its body renders,
    whitespace control included; --chat_template FILE keeps the folder's special tokens."""
    marked = tmp_path / "marked.jinja"
    marked.write_text("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}A:{%- generation -%}\n"
                      "  {{ m['content'] }}!{% endgeneration %}{% else %}U:{{ m['content'] }}{% endif %}{% endfor %}")
    template = read_chat_template(folder, template_file=str(marked))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert template.render(messages, add_generation_prompt=False) == "<|endoftext|>U:hiA:yo!"
    with pytest.raises(UsageError, match=r"the chat template file '.*nothing.jinja' does not exist"):
        read_chat_template(folder, template_file=str(tmp_path / "nothing.jinja"))
