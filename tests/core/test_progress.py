"""lmkit.core.progress: the progress lines of long work outside training, on a fake clock."""
from lmkit.core import progress


def test_a_line_every_few_seconds_with_the_rate_and_the_time_left(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    lines = []
    update = progress.rate_progress(lines.append, "encoding train_file", 8e6, unit="MB", scale=1e6, digits=1,
                                    every=2.0)
    clock[0] = 101.0
    update(1e6)
    assert lines == []  # work that ends within `every` says nothing
    clock[0] = 102.0
    update(2e6)
    assert lines == ["encoding train_file: 2.0/8.0 MB, 1.0 MB/s, about 6 s left"]
    clock[0] = 103.0
    update(3e6)
    assert len(lines) == 1  # not again until 2 s after the last line
    clock[0] = 104.0
    update(8e6, final=True)
    assert lines[-1] == "encoding train_file: 8.0/8.0 MB, 2.0 MB/s"


def test_counts_without_a_scale():
    lines = []
    update = progress.rate_progress(lines.append, "evaluating t.txt", 4096, unit="tokens", every=0.0)
    update(1024)
    assert lines[0].startswith("evaluating t.txt: 1024/4096 tokens, ") and lines[0].endswith(" s left")
