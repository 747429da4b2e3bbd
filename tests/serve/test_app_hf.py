"""``lmkit serve`` on a tiny Hugging Face GPT-2 folder: greedy completions and chats equal transformers' greedy
output and ``lmkit generate``'s (``--chat``), through the ``openai`` client. (A server of its own.)"""
import importlib.util
import os

import pytest

from tests.serve.conftest import ServerProcess

if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("compares with transformers on PyTorch (main environment only)", allow_module_level=True)
openai = pytest.importorskip("openai")
pytestmark = pytest.mark.transformers

TEMPLATE = ("{% for m in messages %}<|endoftext|>{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
PROMPTS = ["the cat sat", "über naïve dog ran fast on a", "blue"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests.models.gpt2.test_convert import make_gpt2_folder
    path = str(tmp_path_factory.mktemp("serve-gpt2") / "tiny")
    make_gpt2_folder(path)
    with open(os.path.join(path, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(TEMPLATE)
    return path


@pytest.fixture(scope="module")
def client(folder):
    server = ServerProcess(folder)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    server.stop()


def test_greedy_replies_equal_transformers_and_lmkit_generate(folder, client):
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    import lmkit
    from tests.helpers import decidable_greedy
    reference = GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        row = decidable_greedy(reference, input_ids=torch.tensor([ids]), max_new_tokens=12,
                               stop_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)[0]
        new = [t for t in row[len(ids):] if t != tokenizer.eos_token_id]
        expected = tokenizer.decode(ids + new)[len(tokenizer.decode(ids)):]
        reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
        assert reply.choices[0].text == expected
        streamed = "".join(e.choices[0].text for e in client.completions.create(
            model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True))
        assert streamed == expected
        assert expected == lmkit.generate(folder, prompt, strategy="greedy", max_new_tokens=12,
                                          return_samples=True)[0].continuation
    messages = [{"role": "user", "content": "the cat sat"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    sample = lmkit.generate(folder, [list(ids)], strategy="greedy", max_new_tokens=10, start_token=False,
                            return_samples=True)[0]
    assert chat.choices[0].message.content == sample.continuation
