"""Probe runs for the native-backend tests (each run is a subprocess with a timeout).

All runs train the tiny LSTM of ``tests/scripts/train_probe.py`` on a
496-id stream: 10 BPTT windows (of 6 steps) per epoch of a global batch of 8
rows, so a checkpoint lands every 10 steps (at the end of each epoch).
"""
import json
import os
import signal
import subprocess
import sys
from typing import Dict, List, Sequence

import numpy as np

from tests.helpers import ROOT, subprocess_env

PROBE = os.path.join(ROOT, "tests", "scripts", "train_probe.py")
IDS = 496
EPOCH = 10  # steps per epoch
FIRST_LEG = 50  # steps of the native run (5 epochs; its last checkpoint is at step 50)
REFERENCE_STEPS = FIRST_LEG + 2 * EPOCH  # the one-process reference goes on two more epochs


class Run:
    """What each process of one probe run wrote (``rank[r]`` -> arrays, ``meta[r]`` -> json)."""

    def __init__(self, prefix: str, processes: int) -> None:
        self.prefix = prefix
        self.rank = [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(processes)]
        self.meta = []
        for r in range(processes):
            with open(f"{prefix}.rank{r}.json") as f:
                self.meta.append(json.load(f))

    @property
    def losses(self) -> np.ndarray:
        return self.rank[0]["losses"]

    def arrays(self, r: int = 0, kinds: Sequence[str] = ("var", "slot")) -> Dict[str, np.ndarray]:
        return {k: v for k, v in self.rank[r].items() if k.startswith(tuple(kinds))}


def probe_cmd(prefix: str, backend: str, *extra: str, replicas: int = 0) -> List[str]:
    cmd = [sys.executable, PROBE, "--out", prefix, "--backend", backend, "--ids", str(IDS), *extra]
    if replicas:
        cmd += ["--num_replicas", str(replicas)]
    return cmd


def run_all(cmds: Sequence[Sequence[str]], timeout: float = 400) -> None:
    """Runs the commands side by side; each must exit 0 before ``timeout`` (else all are killed)."""
    procs = [subprocess.Popen(list(c), cwd=ROOT, env=subprocess_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
             for c in cmds]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        raise
    for cmd, p, (out, err) in zip(cmds, procs, outputs):
        assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{out[-2000:]}\n{err[-5000:]}"
