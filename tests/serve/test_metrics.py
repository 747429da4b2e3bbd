"""The Prometheus text: requests by status, tokens, slots, time to first token and tokens per second."""
from lmkit.serve.metrics import Metrics


def test_the_metrics_render_as_prometheus_text():
    metrics = Metrics(lambda: (3, 2))
    metrics.request(200)
    metrics.request(200)
    metrics.request(429)
    metrics.prompt(7)
    metrics.tokens(50)
    metrics.first_token(0.2)
    text = metrics.render()
    for line in ('lmkit_requests_total{status="200"} 2', 'lmkit_requests_total{status="429"} 1',
                 "lmkit_prompt_tokens_total 7", "lmkit_generation_tokens_total 50", "lmkit_active_sequences 3",
                 "lmkit_queued_sequences 2", "lmkit_generation_tokens_per_second 5.0",
                 'lmkit_time_to_first_token_seconds_bucket{le="0.1"} 0',
                 'lmkit_time_to_first_token_seconds_bucket{le="0.25"} 1', "lmkit_time_to_first_token_seconds_count 1"):
        assert line in text.splitlines(), line
