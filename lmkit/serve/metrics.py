"""The server's counters, written as Prometheus text (``GET /metrics``).

    lmkit_requests_total{status="200"} 12             requests answered, by HTTP status
    lmkit_prompt_tokens_total / lmkit_generation_tokens_total
    lmkit_active_sequences / lmkit_queued_sequences    now, in slots and waiting
    lmkit_time_to_first_token_seconds                  a histogram (_bucket, _sum, _count)
    lmkit_generation_tokens_per_second                 over the last 10 seconds
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Deque, Dict, Tuple

__all__ = ["Metrics"]

#: The time-to-first-token histogram's upper bounds, in seconds.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Seconds the tokens-per-second gauge looks back.
RATE_WINDOW = 10.0


class Metrics:
    """Counters shared by the HTTP side and the engine's thread (a lock guards them).

    Args:
      counts: a function that gives ``(sequences in slots, sequences waiting)`` when the metrics are read.
    """

    def __init__(self, counts: Callable[[], Tuple[int, int]] = lambda: (0, 0)) -> None:
        self.counts = counts
        self.lock = threading.Lock()
        self.requests: Dict[str, int] = collections.Counter()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft_buckets = [0] * len(TTFT_BUCKETS)
        self.ttft_sum, self.ttft_count = 0.0, 0
        self.recent: Deque[Tuple[float, int]] = collections.deque()  # (time, tokens)

    def request(self, status: int) -> None:
        with self.lock:
            self.requests[str(status)] += 1

    def prompt(self, tokens: int) -> None:
        with self.lock:
            self.prompt_tokens += tokens

    def tokens(self, count: int) -> None:
        now = time.monotonic()
        with self.lock:
            self.generation_tokens += count
            self.recent.append((now, count))
            while self.recent and self.recent[0][0] < now - RATE_WINDOW:
                self.recent.popleft()

    def first_token(self, seconds: float) -> None:
        with self.lock:
            self.ttft_sum += seconds
            self.ttft_count += 1
            for i, bound in enumerate(TTFT_BUCKETS):
                if seconds <= bound:
                    self.ttft_buckets[i] += 1

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        with self.lock:
            return sum(c for t, c in self.recent if t >= now - RATE_WINDOW) / RATE_WINDOW

    def render(self) -> str:
        """The Prometheus text exposition of every counter."""
        active, queued = self.counts()
        rate = self.tokens_per_second()
        with self.lock:
            lines = ["# HELP lmkit_requests_total Requests answered, by HTTP status.",
                     "# TYPE lmkit_requests_total counter"]
            lines += [f'lmkit_requests_total{{status="{s}"}} {n}' for s, n in sorted(self.requests.items())]
            lines += _gauge("lmkit_prompt_tokens_total", "counter", "Prompt tokens read.", self.prompt_tokens)
            lines += _gauge("lmkit_generation_tokens_total", "counter", "Tokens generated.", self.generation_tokens)
            lines += _gauge("lmkit_active_sequences", "gauge", "Sequences in slots now.", active)
            lines += _gauge("lmkit_queued_sequences", "gauge", "Sequences waiting for a slot.", queued)
            lines += _gauge("lmkit_generation_tokens_per_second", "gauge",
                            f"Tokens generated per second over the last {RATE_WINDOW:g} s.", round(rate, 3))
            lines += ["# HELP lmkit_time_to_first_token_seconds From a request's arrival to its first token.",
                      "# TYPE lmkit_time_to_first_token_seconds histogram"]
            lines += [f'lmkit_time_to_first_token_seconds_bucket{{le="{b:g}"}} {n}'
                      for b, n in zip(TTFT_BUCKETS, self.ttft_buckets)]
            lines += [f'lmkit_time_to_first_token_seconds_bucket{{le="+Inf"}} {self.ttft_count}',
                      f"lmkit_time_to_first_token_seconds_sum {self.ttft_sum:.6f}",
                      f"lmkit_time_to_first_token_seconds_count {self.ttft_count}"]
        return "\n".join(lines) + "\n"


def _gauge(name: str, kind: str, text: str, value: float) -> list:
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
