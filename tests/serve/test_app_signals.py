"""``lmkit serve`` under load and stopped: a full queue is a 429 with Retry-After; SIGTERM during 8 streaming
requests lets them all finish, answers new ones with 503, and exits 0. (A server of its own: this module
stops it.)"""
import http.client
import json
import os
import signal
import threading
import time

from tests.serve.conftest import ServerProcess


def stream(port, max_tokens, first, out):
    """One streamed completion read to its end: its events' texts and finish reasons in ``out``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.request("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": max_tokens,
                                                              "temperature": 0, "stream": True}),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    events = []
    for line in response:
        line = line.decode().strip()
        if line.startswith("data: "):
            events.append(line[6:])
            first.set()
    out.append(events)


def post(port, body):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(response.read())


def test_a_full_queue_refuses_and_sigterm_lets_8_streams_finish_then_exits_0(run_dir):
    server = ServerProcess(run_dir, "--max_batch", "8", "--max_queue", "0", "--grace", "120",
                           env={"LMKIT_SERVE_STEP_DELAY": "0.05"})
    try:
        results, threads = [], []
        for _ in range(8):
            first = threading.Event()
            threads.append(threading.Thread(target=stream, args=(server.port, 60, first, results)))
            threads[-1].start()
            assert first.wait(60), server.output()  # each one is in its slot before the next
        status, headers, body = post(server.port, {"prompt": "a", "max_tokens": 5})
        assert status == 429 and headers.get("retry-after") == "1" and body["error"]["code"] == "queue_full"
        os.kill(server.proc.pid, signal.SIGTERM)
        time.sleep(0.5)
        status, headers, body = post(server.port, {"prompt": "a", "max_tokens": 5})
        assert status == 503 and body["error"]["code"] == "shutting_down"
        for t in threads:
            t.join(timeout=120)
        assert server.proc.wait(timeout=120) == 0, server.output()
    finally:
        server.stop()
    assert len(results) == 8
    for events in results:
        assert events[-1] == "[DONE]"
        finals = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
        assert finals[-1] == "length" and sum(len(json.loads(e)["choices"][0]["text"]) > 0 for e in events[:-1])
    assert "all requests finished" in server.output()
