"""Helpers shared by the benchmarks: machine facts, statistics, JSON and plots.

Nothing here imports TensorFlow or PyTorch, so a benchmark can set thread
counts before either framework starts.
"""

from __future__ import annotations

import ast
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = [
    "REPO",
    "RESULTS_DIR",
    "command_line",
    "intervals_union",
    "load_average",
    "machine_info",
    "median_ratio",
    "package_version",
    "ratio_spread",
    "save_figure",
    "summarize",
    "write_json",
]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO, "benchmarks", "results")


def command_line() -> str:
    """The command that started this process, relative to the repository."""
    argv = [os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]
    return " ".join(shlex.quote(a) for a in [".venv/bin/python"] + argv)


def load_average() -> List[float]:
    """The 1, 5 and 15 minute load averages (other jobs share this host)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> Optional[float]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2 ** 20, 1)
    except OSError:
        pass
    return None


def machine_info(**versions: Optional[str]) -> Dict[str, Any]:
    """Where and when a result was measured.

    Args:
      **versions: framework versions to record (None values are dropped).

    Returns:
      A JSON-able dict: host CPU count and model, memory, load, Python and
      the given versions, and the UTC time.
    """
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "load_average_at_start": load_average(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "utc_time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **({"gpus": _gpus()} if _gpus() else {}),
        **{k: v for k, v in versions.items() if v is not None},
    }


def _gpus() -> List[str]:
    """The NVIDIA GPUs of this host with their memory (``nvidia-smi``), or [] without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def package_version(name: str) -> Optional[str]:
    """The installed version of the distribution ``name``, or None."""
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def parse_overrides(items: Sequence[str]) -> Dict[str, Any]:
    """``--set KEY=VALUE`` items -> config overrides; each value a Python literal (``40``, ``True``, ``"fp16"``).

    Raises:
      ValueError: an item without ``=`` or whose value is not a literal.
    """
    overrides: Dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: give KEY=VALUE, e.g. --set num_steps=512")
        try:
            overrides[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"--set {item!r}: {value!r} is not a Python literal (quote strings: "
                             f"--set precision='\"mixed_bfloat16\"')") from None
    return overrides


def summarize(values: Sequence[float]) -> Dict[str, float]:
    """Median, min, max and count of repeated measurements."""
    values = list(values)
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def write_json(path: str, payload: Dict[str, Any]) -> str:
    """Writes ``payload`` (indented, sorted keys) atomically; returns the path."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path


def intervals_union(intervals: Iterable[Tuple[float, float]]) -> float:
    """Total length covered by ``(start, end)`` intervals, overlaps counted once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def idle_gaps(intervals: Iterable[Tuple[float, float]]) -> List[float]:
    """The idle stretches between ``(start, end)`` intervals (overlaps merged), in order."""
    gaps, end = [], None
    for start, stop in sorted(intervals):
        if end is not None and start > end:
            gaps.append(start - end)
        end = stop if end is None else max(end, stop)
    return gaps


def median_ratio(numerators: Iterable[float], denominators: Iterable[float]) -> float:
    """Median of the per-round ratios (each round measured back to back)."""
    ratios = [a / b for a, b in zip(numerators, denominators) if b > 0]
    return statistics.median(ratios) if ratios else float("nan")


def ratio_spread(numerators: Sequence[float], denominators: Sequence[float]) -> Dict[str, Any]:
    """The ratio of two columns measured round by round: of the medians, and per round
    (median, min, max and every round's), so a reader sees how far one run can be trusted."""
    rounds = [a / b for a, b in zip(numerators, denominators) if b > 0]
    return {"of_medians": round(statistics.median(numerators) / statistics.median(denominators), 3),
            "median_of_rounds": round(statistics.median(rounds), 3) if rounds else float("nan"),
            "min_of_rounds": round(min(rounds), 3) if rounds else float("nan"),
            "max_of_rounds": round(max(rounds), 3) if rounds else float("nan"),
            "rounds": [round(r, 3) for r in rounds]}


def save_figure(fig: Any, path: str) -> str:
    """Writes a matplotlib figure to ``path`` (PNG) and closes it; returns ``path``."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
