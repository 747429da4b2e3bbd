"""What a preemption costs: steps lost, time from the signal to the exit, per launcher.

    python benchmarks/preemption.py --rounds 3

Each round trains the tiny LSTM of the reliability tests on a generated
PTB-format corpus (2 ranks where the launcher has them; 1 row per rank and
5 steps a window, so an epoch lasts a few seconds) and, at the first
progress line, sends the signal a scheduler would send to what it started:

* ``local``: SIGTERM to the one process;
* ``native``: SIGTERM to ``python -m lmkit.launch`` (2 workers);
* ``mpirun``: SIGUSR1 to ``mpirun -np 2``, which Open MPI forwards at once;
* ``mpirun_term``: SIGTERM to ``mpirun -np 2`` (Open MPI sends the ranks
  SIGCONT, SIGTERM ``odls_base_sigkill_timeout`` = 1 s later, SIGKILL 1 s
  after that: whether the checkpoint is written is a race, recorded);
* ``launch_mpirun``: SIGTERM to ``python -m lmkit.launch --mpirun -np 2 ...``;
* ``launch_horovodrun``: SIGTERM to ``python -m lmkit.launch --horovodrun -np 2 ...``;
* ``horovodrun_gloo``: SIGTERM to ``horovodrun --gloo -np 2`` (it passes
  SIGTERM to the ranks and SIGKILLs them 5 s later).

Measured: the step the rank-0 log showed when the signal went, the step the
job stopped at (its checkpoint), the steps done after the signal (they are in
the checkpoint: the work lost is the steps after the last checkpoint, 0
here), the seconds from the signal to the launcher's exit, and the exit
status. Writes ``benchmarks/results/preemption.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._common import command_line  # noqa: E402
from tests.distributed.reliability.support import horovodrun_gloo_cmd, mpirun, run_streamed, write_config, write_corpus  # noqa: E402

LAUNCHERS = {
    "local": (lambda args: [sys.executable, "-m", "lmkit", "train", "--backend", "local", *args],
              signal.SIGTERM),
    "native": (lambda args: [sys.executable, "-m", "lmkit.launch", "--hosts", "127.0.0.1", "--num_workers",
                             "2", "--", sys.executable, "-m", "lmkit", "train", "--backend", "native", *args],
               signal.SIGTERM),
    "mpirun": (lambda args: mpirun(["-m", "lmkit", "train", *args]), signal.SIGUSR1),
    "mpirun_term": (lambda args: mpirun(["-m", "lmkit", "train", *args]), signal.SIGTERM),
    "launch_mpirun": (lambda args: [sys.executable, "-m", "lmkit.launch", "--mpirun",
                                    *mpirun(["-m", "lmkit", "train", *args])[1:]], signal.SIGTERM),
    "launch_horovodrun": (lambda args: [sys.executable, "-m", "lmkit.launch", "--horovodrun", "-np", "2",
                                        "-H", "localhost:2", "--mpi-args=--oversubscribe", sys.executable,
                                        "-m", "lmkit", "train", *args], signal.SIGTERM),
    "horovodrun_gloo": (lambda args: horovodrun_gloo_cmd(2, ["-m", "lmkit", "train", *args]), signal.SIGTERM),
}


def one_round(name: str, folder: str, config: str, data: str) -> Dict[str, Any]:
    make, sig = LAUNCHERS[name]
    model_dir = os.path.join(folder, f"{name}-{time.monotonic_ns()}")
    started, sent = [], []

    def on_line(line: str) -> None:
        found = re.search(r"epoch 1/\d+ step (\d+)/\d+ ", line)  # horovodrun prefixes its lines
        if found and not sent:
            sent.append((time.monotonic(), int(found.group(1))))
            os.kill(started[0].pid, sig)

    out = run_streamed(make(["--config", config, "--data_path", data, "--model_dir", model_dir,
                             "--num_epochs", "3"]), timeout=600, on_line=on_line, on_start=started.append)
    ended = time.monotonic()
    stop = re.search(r"preempted: stopped by \S+ at step (\d+)", out.output)
    if not sent:
        raise SystemExit(f"{name}: training never started (status {out.returncode}):\n{out.output[-3000:]}")
    if stop is None and name != "mpirun_term":  # the one launcher that may kill the ranks first
        raise SystemExit(f"{name}: no preemption seen (status {out.returncode}):\n{out.output[-3000:]}")
    return {"exit_status": out.returncode, "signal": signal.Signals(sig).name,
            "checkpoint_written": stop is not None,
            "step_at_signal": sent[0][1], "stopped_at_step": int(stop.group(1)) if stop else None,
            "steps_after_signal": int(stop.group(1)) - sent[0][1] if stop else None,
            "seconds_signal_to_exit": round(ended - sent[0][0], 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "results", "preemption.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")  # horovodrun
    with tempfile.TemporaryDirectory() as folder:
        vocab = write_corpus(os.path.join(folder, "data"))
        config = write_config(os.path.join(folder, "config_slow.py"), vocab, batch_size=2, num_steps=5)
        rounds: Dict[str, List[Dict[str, Any]]] = {n: [] for n in args.launchers.split(",")}
        for r in range(args.rounds):  # alternate the launchers: the machine is shared
            for name in rounds:
                rounds[name].append(one_round(name, folder, config, os.path.join(folder, "data")))
                print(f"round {r + 1} {name}: {rounds[name][-1]}", flush=True)
    summary = {name: {"median_seconds_signal_to_exit": statistics.median(x["seconds_signal_to_exit"] for x in runs),
                      "max_steps_after_signal": max((x["steps_after_signal"] for x in runs
                                                     if x["steps_after_signal"] is not None), default=None),
                      "checkpoints_written": f"{sum(x['checkpoint_written'] for x in runs)}/{len(runs)}",
                      "exit_statuses": sorted({x["exit_status"] for x in runs})}
               for name, runs in rounds.items()}
    result = {"benchmark": "preemption", "command": command_line(), "rounds": rounds, "summary": summary,
              "note": "steps_after_signal are saved in the checkpoint the job stops with: none is lost"}
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
