"""``lmkit serve`` end to end: the ``openai`` client against a real server (uvicorn, a free port).

One server for the module (a tiny trained run, a chat template, an API key,
8 slots): greedy completions and chats equal ``lmkit.generate``'s output
(the code of ``lmkit generate``) token for token, streamed and not, alone and
while 15 other requests with other settings run; a seeded sample too. Then
bad requests get OpenAI's errors, lm-evaluation-harness's loglikelihood
request reads back the model's own log-probabilities, and 500 mixed requests
(malformed, oversize, cut mid-stream, concurrent) leave the server answering
correctly with no slot taken.
"""
import concurrent.futures
import http.client
import json
import random
import re
import socket
import time

import numpy as np
import pytest

from tests.serve.conftest import ServerProcess, get

openai = pytest.importorskip("openai")

KEY = "test-key-123"
PROMPTS = ["the cat", "a dog ran", "blue sky and"]


@pytest.fixture(scope="module")
def server(run_dir, template_file):
    process = ServerProcess(run_dir, "--chat_template", template_file, "--api_key", KEY, "--max_batch", "8",
                            "--max_queue", "64", "--prefill_chunk", "4")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


_LOADED = {}


def reference(run_dir, prompt, max_new_tokens, **settings):
    """lmkit generate's continuation of ``prompt`` (text, or ids read without a start token)."""
    import lmkit
    from lmkit.decoding.source import load_generator
    run_dir = _LOADED.setdefault(run_dir, load_generator(run_dir))  # loaded once: its compiled loops kept
    options = dict(strategy="greedy") if not settings else dict(strategy="top_p", **settings)
    if not isinstance(prompt, str):
        options["start_token"] = False
    sample = lmkit.generate(run_dir, prompt if isinstance(prompt, str) else [prompt], max_new_tokens=max_new_tokens,
                            return_samples=True, **options)[0]
    return sample.continuation


def streamed_text(stream, chat=False):
    parts = []
    for event in stream:
        for choice in event.choices:
            parts.append((choice.delta.content or "") if chat else choice.text)
    return "".join(parts)


def chat_ids(run_dir, template_file, messages):
    """The ids the server feeds for ``messages``: the template's text, encoded by the run's tokenizer."""
    from lmkit.data.tokenizers import tokenizer_of_run
    from lmkit.hub.chat import ChatTemplate
    with open(template_file, encoding="utf-8") as f:
        text = ChatTemplate(f.read(), {}, template_file).render(messages)
    return tokenizer_of_run(run_dir).encode(text)


def test_models_health_and_metrics_answer(server, client):
    assert [m.id for m in client.models.list().data] == ["run"]
    assert get(server.url + "/health") == (200, '{"status":"ok"}')
    status, text = get(server.url + "/metrics")
    assert status == 200 and "lmkit_active_sequences 0" in text and "lmkit_time_to_first_token_seconds_bucket" in text
    status, page = get(server.url + "/")
    assert status == 200 and "<title>lmkit playground</title>" in page and "http" not in page.split("<script>")[1]


def test_greedy_completions_equal_lmkit_generate_streamed_and_not(run_dir, client):
    for prompt in PROMPTS:
        expected = reference(run_dir, prompt, 24)
        reply = client.completions.create(model="run", prompt=prompt, max_tokens=24, temperature=0)
        assert reply.choices[0].text == expected and reply.choices[0].finish_reason == "length"
        assert reply.usage.completion_tokens == 24
        stream = client.completions.create(model="run", prompt=prompt, max_tokens=24, temperature=0, stream=True)
        assert streamed_text(stream) == expected


def test_greedy_chat_equals_lmkit_generate_streamed_and_not(run_dir, template_file, client):
    messages = [{"role": "system", "content": "hi"}, {"role": "user", "content": "a cat"}]
    expected = reference(run_dir, chat_ids(run_dir, template_file, messages), 20)
    reply = client.chat.completions.create(model="run", messages=messages, max_tokens=20, temperature=0)
    assert reply.choices[0].message.content == expected and reply.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="run", messages=messages, max_tokens=20, temperature=0, stream=True)
    assert streamed_text(stream, chat=True) == expected


def test_a_request_gets_its_own_tokens_while_15_others_with_other_settings_run(run_dir, client):
    greedy = reference(run_dir, "the cat", 30)
    sampled = reference(run_dir, "a dog ran", 30, temperature=0.8, top_p=0.9, seed=7)

    def other(k):
        settings = dict(temperature=[0, 0.5, 1.3][k % 3], top_p=[1.0, 0.8][k % 2], seed=k,
                        stop=["sky"] if k % 4 else None)
        stream = client.completions.create(model="run", prompt=PROMPTS[k % 3] * (1 + k % 3), max_tokens=10 + 3 * k,
                                           stream=bool(k % 2), **settings)
        return streamed_text(stream) if k % 2 else stream.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(max_workers=17) as pool:
        others = [pool.submit(other, k) for k in range(15)]
        time.sleep(0.2)  # they are running: the two below join the batch
        mine = pool.submit(lambda: client.completions.create(model="run", prompt="the cat", max_tokens=30,
                                                             temperature=0, stream=True))
        seeded = pool.submit(lambda: client.completions.create(model="run", prompt="a dog ran", max_tokens=30,
                                                               temperature=0.8, top_p=0.9, seed=7))
        assert streamed_text(mine.result()) == greedy
        assert seeded.result().choices[0].text == sampled
        assert all(isinstance(f.result(), str) for f in others)


def test_n_samples_with_a_seed_are_lmkit_generates_samples(run_dir, client):
    import lmkit
    from lmkit.decoding.source import load_generator
    generator = _LOADED.setdefault(run_dir, load_generator(run_dir))
    expected = [s.continuation for s in lmkit.generate(generator, "the cat", strategy="top_p", top_p=1.0,
                                                       temperature=0.9, seed=3, num_samples=3, max_new_tokens=16,
                                                       return_samples=True)]
    reply = client.completions.create(model="run", prompt="the cat", max_tokens=16, temperature=0.9, seed=3, n=3)
    assert [c.text for c in sorted(reply.choices, key=lambda c: c.index)] == expected


def test_a_stop_string_ends_the_reply_before_it(run_dir, client):
    full = reference(run_dir, "the cat", 30)
    stop = full[5:7]
    reply = client.completions.create(model="run", prompt="the cat", max_tokens=30, temperature=0, stop=[stop])
    assert reply.choices[0].text == full[:full.index(stop)] and reply.choices[0].finish_reason == "stop"


def raw(server, method, path, body=b"", headers=None):
    """``(status, headers, JSON or text)`` of one request made by hand."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request(method, path, body=body, headers={"Authorization": f"Bearer {KEY}", **(headers or {})})
    response = connection.getresponse()
    data = response.read().decode("utf-8", "replace")
    connection.close()
    try:
        return response.status, dict(response.getheaders()), json.loads(data)
    except ValueError:
        return response.status, dict(response.getheaders()), data


def check_error(answer, status, param=None):
    code, _, body = answer
    assert code == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param


def test_bad_requests_get_openais_errors(server):
    post = lambda body, **h: raw(server, "POST", "/v1/completions", body, h)  # noqa: E731
    check_error(post(b"{not json"), 400)
    check_error(post(b'{"prompt": "a", "max_tokens": "5"}'), 400, "max_tokens")
    check_error(post(b'{"prompt": "a", "colour": 1}'), 400, "colour")
    check_error(post(b'{"prompt": "a", "max_tokens": 0}'), 400, "max_tokens")
    check_error(post(b'{"prompt": "a", "temperature": true}'), 400, "temperature")
    check_error(post('{"prompt": "caf\u00e9"}'.encode("latin-1")), 400)
    check_error(post(b'[1, 2]'), 400)
    code, _, body = post(json.dumps({"prompt": "the cat " * 20}).encode())
    check_error((code, _, body), 400, "prompt")
    assert re.search(r"\b161 tokens\b.*\b64\b", body["error"]["message"]), body
    check_error(post(b'{"prompt": "a", "model": "gpt-4"}'), 404, "model")
    check_error(post(json.dumps({"prompt": "a" * (1 << 20)}).encode()), 413)
    check_error(raw(server, "POST", "/v1/completions", b'{"prompt": "a"}', {"Authorization": "Bearer wrong"}), 401)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("GET", "/v1/models")
    assert connection.getresponse().status == 401
    check_error(raw(server, "POST", "/v1/chat/completions", b'{"messages": [{"role": "user"}]}'), 400, "messages")


def test_echo_and_logprobs_give_lm_eval_the_models_own_scores(run_dir, server):
    """lm-evaluation-harness's local-completions loglikelihood request and parser, on token ids."""
    from lmkit.decoding.source import load_generator
    generator = load_generator(run_dir)
    context, continuation = generator.tokenizer.encode("the cat"), generator.tokenizer.encode(" sat")
    body = {"model": "run", "prompt": [context + continuation], "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}
    code, _, reply = raw(server, "POST", "/v1/completions", json.dumps(body).encode())
    assert code == 200, reply
    choice = reply["choices"][0]
    scores = choice["logprobs"]["token_logprobs"][len(context):-1]  # lm-eval's parse_logprobs
    tops = choice["logprobs"]["top_logprobs"][len(context):-1]
    assert len(scores) == len(continuation) and all(len(t) == 1 for t in tops)
    ids = [generator.tokenizer.eos_id] + context + continuation  # the run reads a prompt after a line break
    logits, _ = generator.model(np.array([ids], np.int32), None)
    log_probs = logits.numpy()[0] - np.log(np.sum(np.exp(logits.numpy()[0]), axis=-1, keepdims=True))
    expected = [log_probs[len(context) + k, t] for k, t in enumerate(continuation)]
    np.testing.assert_allclose(scores, expected, atol=1e-4)
    assert choice["text"].startswith("the cat sat") and len(choice["logprobs"]["tokens"]) == len(ids)


def _cut_stream(server):
    """A streamed request whose client leaves after its first event."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    body = json.dumps({"prompt": "the cat", "max_tokens": 60, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    s.recv(200)
    s.close()
    return "cut"


def test_500_mixed_requests_leave_the_server_answering_with_no_slot_taken(run_dir, server, client):
    rng = random.Random(0)
    bad = [b"{", b'{"prompt": 5}', b'{"prompt": "a", "n": 99}', b'{"prompt": "a", "stop": [""]}',
           b'{"prompt": [99999]}', b"\xff\xfe", b'{"messages": []}', b'{"prompt": "a", "top_p": 0}']

    def one(k):
        kind = rng.choice(["valid", "valid", "stream", "bad", "big", "cut"]) if k >= 8 else "bad"
        if kind == "valid":
            return client.completions.create(model="run", prompt=rng.choice(PROMPTS), max_tokens=rng.randint(1, 8),
                                             temperature=rng.choice([0, 1.0]), seed=k).choices[0].finish_reason
        if kind == "stream":
            return streamed_text(client.completions.create(model="run", prompt="a", max_tokens=4, stream=True))
        if kind == "big":
            return raw(server, "POST", "/v1/completions", b'{"prompt": "' + b"a" * (1 << 20) + b'"}')[0]
        if kind == "cut":
            return _cut_stream(server)
        path = rng.choice(["/v1/completions", "/v1/chat/completions"])
        return raw(server, "POST", path, bad[k % len(bad)])[0]

    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        outcomes = list(pool.map(one, range(500)))
    assert len(outcomes) == 500
    assert {o for o in outcomes if isinstance(o, int)} <= {400, 413, 429}
    deadline = time.monotonic() + 60
    while "lmkit_active_sequences 0" not in get(server.url + "/metrics")[1] and time.monotonic() < deadline:
        time.sleep(0.2)
    metrics = get(server.url + "/metrics")[1]
    assert "lmkit_active_sequences 0" in metrics and "lmkit_queued_sequences 0" in metrics, metrics
    reply = client.completions.create(model="run", prompt="the cat", max_tokens=24, temperature=0)
    assert reply.choices[0].text == reference(run_dir, "the cat", 24)
