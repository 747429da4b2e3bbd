"""Runs the real PTB example with one fault injected from outside the library.

Used by ``tests/distributed/reliability``; nothing here is part of lmkit. The example's
``main`` runs unchanged through ``run_main``; this script only swaps in a
``Trainer`` subclass (or slows the checkpoint writer down) before it starts::

    mpirun -np 2 python tests/scripts/faulty_ptb.py --fault rank=1,step=3,kind=raise -- \
        --config cfg.py --data_path data --model_dir model --max_steps 20

Faults (``rank=R`` picks the rank that misbehaves, ``step=N`` the global
step before which it does):

* ``kind=raise``: raises ``RuntimeError``;
* ``kind=kill``: sends itself SIGKILL (no Python clean-up at all);
* ``kind=exit``: calls ``sys.exit(0)`` as a stray library call might;
* ``kind=hang``: sleeps for an hour in Python, never reaching the next collective;
* ``kind=signal``: sends itself SIGTERM (a scheduler's notice reaching one rank);
* ``kind=eval_raise``: raises inside rank 0's rank-0-only evaluation;
* ``kind=slow_save``: every checkpoint write after the first sleeps 600 s
  (the test kills the job there);
* ``kind=slow_test_eval``: rank 0's final (test) evaluation takes ``step``
  seconds longer, beating the watchdog every second as evaluation batches do;
* ``kind=truncate``: that rank trains on fewer ids than the others;
* ``kind=config``: that rank uses another learning rate than the others.

Every rank prints ``PID <pid> RANK <rank>`` first; with ``pid_dir=D`` in the
spec it also writes its pid to ``D/rank<R>.pid`` (written whole, then renamed),
which is what a test that signals one rank reads: the ranks' printed lines
share one pipe and may run together.
"""
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, ROOT)


def _parse(spec: str) -> dict:
    out = {"rank": 0, "step": 1, "kind": "raise"}
    for item in filter(None, spec.split(",")):
        key, value = item.split("=", 1)
        out[key] = int(value) if key in ("rank", "step") else value
    return out


def _write_pid(folder: str, rank: int) -> None:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank{rank}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def _install(fault: dict) -> None:
    import lmkit.train
    from lmkit.distributed.env import launcher_rank
    from lmkit.train import checkpoint as ckpt_module

    me = launcher_rank()
    kind = fault["kind"]
    base = lmkit.train.Trainer

    class FaultyTrainer(base):
        def train_step(self, *args):
            if (kind in ("raise", "kill", "exit", "hang", "signal") and me == fault["rank"]
                    and int(self.progress.global_step.numpy()) + 1 == fault["step"]):
                print(f"rank {me}: injecting {kind} before step {fault['step']}", flush=True)
                if kind == "raise":
                    raise RuntimeError(f"injected fault on rank {me} at step {fault['step']}")
                if kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if kind == "exit":
                    sys.exit(0)
                if kind == "hang":
                    time.sleep(3600)
                if kind == "signal":  # a scheduler's notice to this rank alone
                    os.kill(os.getpid(), signal.SIGTERM)
            return super().train_step(*args)

        def evaluate_loss(self, ids):
            if kind == "eval_raise" and me == fault["rank"]:
                print(f"rank {me}: injecting {kind}", flush=True)
                raise RuntimeError(f"injected fault in rank {me}'s evaluation")
            if kind == "slow_test_eval" and me == 0 and ids is getattr(self, "_fault_test_ids", None):
                print(f"rank {me}: injecting {kind} ({fault['step']} s)", flush=True)
                for _ in range(fault["step"]):
                    time.sleep(1)
                    self.watchdog.beat("an evaluation batch finished")
            return super().evaluate_loss(ids)

        def fit(self, train_ids, valid_ids=None, test_ids=None, *args, **kwargs):
            if kind == "truncate" and me == fault["rank"]:
                train_ids = train_ids[: len(train_ids) // 2]
            self._fault_test_ids = test_ids
            return super().fit(train_ids, valid_ids, test_ids, *args, **kwargs)

    if kind == "config" and me == fault["rank"]:
        def init(self, model, config, *args, **kwargs):
            base.__init__(self, model, config.replace(learning_rate=config.optimization.learning_rate * 2),
                          *args, **kwargs)
        FaultyTrainer.__init__ = init
    lmkit.train.Trainer = FaultyTrainer

    if kind == "slow_save":
        original = ckpt_module.CheckpointManager.save

        def slow_save(self, step, meta=None, files=None):
            if not self.all():  # the first checkpoint is written normally
                return original(self, step, meta, files)
            import tensorflow as tf
            write = tf.train.Checkpoint.write

            def slow_write(ckpt, prefix, options=None):
                out = write(ckpt, prefix, options)
                print(f"in the middle of saving step {step}", flush=True)
                time.sleep(600)  # the test kills the job here
                return out

            tf.train.Checkpoint.write = slow_write
            return original(self, step, meta, files)

        ckpt_module.CheckpointManager.save = slow_save


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--fault" or "--" not in argv:
        sys.exit("usage: faulty_ptb.py --fault rank=R,step=N,kind=K -- <lmkit train flags>")
    fault = _parse(argv[1])
    example_args = argv[argv.index("--") + 1:]
    from lmkit.cli.common import run_main
    from lmkit.distributed.env import launcher_rank
    print(f"PID {os.getpid()} RANK {launcher_rank()}", flush=True)
    if fault.get("pid_dir"):
        _write_pid(fault["pid_dir"], launcher_rank())
    _install(fault)
    from lmkit.cli.train import main as train_main
    run_main(lambda args: train_main(args, prog="faulty_ptb.py"), example_args)


if __name__ == "__main__":
    main()
