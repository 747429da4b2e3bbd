"""The playground page in a real browser: Debian's Chromium driven by Playwright. The page loads, a typed
message streams a reply, and the reply equals the API's greedy answer."""
import json
import os
import urllib.request

import pytest

from tests.serve.conftest import ServerProcess

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason="no /usr/bin/chromium (scripts/setup.sh installs it)")


def test_a_typed_message_streams_the_apis_greedy_reply(run_dir, template_file):
    server = ServerProcess(run_dir, "--chat_template", template_file)
    try:
        body = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 20, "temperature": 0,
                "top_p": 1, "seed": 0}
        request = urllib.request.Request(server.url + "/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            expected = json.loads(r.read())["choices"][0]["message"]["content"]
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"])
            try:
                page = browser.new_page()
                page.goto(server.url + "/")
                page.wait_for_function("document.getElementById('model').textContent.includes('context 64')")
                page.fill("#max_tokens", "20")
                page.fill("#prompt", "the cat")
                page.press("#prompt", "Enter")
                page.wait_for_selector(".msg.assistant[data-done='true'], .msg.error[data-done='true']", timeout=120000)
                assert page.locator(".msg.error").count() == 0, page.locator(".msg.error").inner_text()
                assert page.locator(".msg.user").inner_text() == "the cat"
                assert page.locator(".msg.assistant").text_content() == expected
                assert "tokens/s" in page.locator("#status").inner_text()
            finally:
                browser.close()
    finally:
        server.stop()
