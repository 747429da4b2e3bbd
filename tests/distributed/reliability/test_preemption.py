"""Preemption: a signal stops every rank at the same step boundary, rank 0 saves, every process
exits 75, and rerunning the same command ends with the variables of an uninterrupted run.

The runs are the real ``lmkit train`` on the generated corpus with dropout on.
``tests/scripts/faulty_ptb.py --fault kind=signal`` makes one rank signal
itself before a given step (a deterministic mid-epoch stop); the launcher
tests send the signal from outside, as a scheduler does.
"""
import json
import os
import re
import signal
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.distributed.reliability.support import (
    FAULTY,
    horovodrun_gloo_cmd,
    mpirun,
    run_streamed,
    tree_digest,
    write_config,
)

LMKIT = [sys.executable, "-m", "lmkit", "train"]
LAUNCH = [sys.executable, "-m", "lmkit.launch", "--hosts", "127.0.0.1", "--num_workers", "2", "--"]
STEPS = 64  # per epoch, global batch 8 x 10 steps on the corpus
PREEMPTED = 75


def flags(corpus, model_dir, config, epochs=2):
    return ["--config", config, "--data_path", corpus.data, "--model_dir", model_dir,
            "--num_epochs", str(epochs)]


def launchers(backend):
    """(command prefix for lmkit train, for the faulty example) of a backend."""
    if backend == "horovod":
        return mpirun(["-m", "lmkit", "train"]), mpirun([FAULTY])
    if backend == "native":
        return [*LAUNCH, *LMKIT, "--backend", "native"], [*LAUNCH, sys.executable, FAULTY]
    return [*LMKIT, "--backend", "local"], [sys.executable, FAULTY]


def final_variables(model_dir):
    ckpts = os.path.join(model_dir, "checkpoints")
    reader = tf.train.load_checkpoint(os.path.join(ckpts, sorted(os.listdir(ckpts))[-1], "ckpt"))
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith(("model/", "optimizer/"))]
    return {n: reader.get_tensor(n) for n in names}


def metas(model_dir):
    ckpts = os.path.join(model_dir, "checkpoints")
    return [json.load(open(os.path.join(ckpts, n, "meta.json"))) for n in sorted(os.listdir(ckpts))]


@pytest.fixture(scope="module")
def dropout_config(corpus, tmp_path_factory):
    return write_config(str(tmp_path_factory.mktemp("cfg") / "config_dropout.py"), corpus.vocab_size,
                        keep_prob=0.7, num_epochs=2)


@pytest.mark.parametrize("backend", [
    pytest.param("horovod", marks=[pytest.mark.horovod, pytest.mark.mpi]), "native", "local"])
def test_stop_inside_an_epoch_then_rerun_equals_an_uninterrupted_run(corpus, dropout_config, tmp_path,
                                                                     backend):
    train, faulty = launchers(backend)
    straight, stopped = str(tmp_path / "straight"), str(tmp_path / "stopped")
    out = run_streamed([*train, *flags(corpus, straight, dropout_config)], timeout=400)
    assert out.returncode == 0, out.output[-4000:]
    # Rank 1 (rank 0 in one process) is signalled in the middle of step 100 (36 steps into
    # epoch 2); its request rides with step 101's all-reduce, every rank reads the agreement
    # after starting step 102, and all stop after it.
    rank = 0 if backend == "local" else 1
    extra = ["--backend", "native"] if backend == "native" else []
    out = run_streamed([*faulty, "--fault", f"rank={rank},step=100,kind=signal", "--",
                        *flags(corpus, stopped, dropout_config), *extra], timeout=400)
    assert out.returncode == PREEMPTED, out.output[-4000:]
    assert out.count("preempted: stopped by ") == 1, out.output[-3000:]  # once, from rank 0
    assert re.search(r"preempted: stopped by (SIGTERM|a signal on another rank) at step 102 \(epoch 2, "
                     r"38 steps into it\); checkpoint \S+/ckpt-000000102; rerun", out.output), out.output[-3000:]
    last = metas(stopped)[-1]
    assert (last["step"], last["epoch"], last["steps_in_epoch"], last["stopped_by"]) == (
        102, 1, 38, "preemption")
    assert os.path.isfile(os.path.join(stopped, "checkpoints", "ckpt-000000102", "rnn_state.npz"))
    # The same command again finishes the run exactly as if nothing had happened.
    out = run_streamed([*train, *flags(corpus, stopped, dropout_config)], timeout=400)
    assert out.returncode == 0, out.output[-4000:]
    assert "38 steps into epoch 2" in out.output
    want, got = final_variables(straight), final_variables(stopped)
    assert want.keys() == got.keys() and len(want) > 4
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def slow_config(corpus, tmp_path_factory):
    """500 steps an epoch (a row per rank): a signal from outside lands inside an epoch."""
    return write_config(str(tmp_path_factory.mktemp("slow") / "config_slow.py"), corpus.vocab_size,
                        batch_size=2, num_steps=5, num_epochs=1, preemption_grace_seconds=60.0)


def send_from_outside(cmd, sig, **kwargs):
    """Runs ``cmd`` and sends ``sig`` to it (the launcher) at its first progress line of training."""
    started, sent = [], []

    def on_line(line):
        if not sent and re.search(r"epoch 1/\d+ step \d+/\d+ ", line):  # horovodrun prefixes lines
            sent.append(time.monotonic())
            os.kill(started[0].pid, sig)
    out = run_streamed(cmd, timeout=400, on_line=on_line, on_start=started.append, **kwargs)
    return out, sent


def check_stopped_inside(out, model_dir, sent):
    """The stop fell inside an epoch, at the step the message names; returns seconds from the signal."""
    steps = int(re.search(r"(\d+) steps/epoch", out.output).group(1))
    match = re.search(r"preempted: stopped by \S+ at step (\d+) \(epoch (\d+), (\d+) steps into it\); "
                      r"checkpoint (\S+); rerun", out.output)
    assert match, out.output[-3000:]
    step, epoch, into, path = int(match.group(1)), int(match.group(2)), int(match.group(3)), match.group(4)
    assert step == (epoch - 1) * steps + into and 0 < into < steps  # inside the epoch, not at its end
    assert path.endswith(f"ckpt-{step:09d}") and metas(model_dir)[-1]["step"] == step
    return time.monotonic() - sent[0]


def wrapped(launcher_cmd):
    """``python -m lmkit.launch --NAME ARGS...`` for a launcher command ``[path/NAME, ARGS...]``."""
    return [sys.executable, "-m", "lmkit.launch", f"--{os.path.basename(launcher_cmd[0])}", *launcher_cmd[1:]]


def venv_path():
    """PATH with this interpreter's folder first (horovodrun lives there)."""
    return {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}


@pytest.mark.horovod
@pytest.mark.mpi
def test_launch_wrapping_mpirun_turns_term_into_a_preemption(corpus, slow_config, tmp_path):
    # SIGTERM to `python -m lmkit.launch --mpirun ...` (a container's main process, a user's
    # kill) becomes SIGUSR1 to mpirun, which forwards it at once: the ranks stop together with a
    # checkpoint inside the epoch and the job exits 75. (SIGTERM to mpirun itself aborts the
    # job: the ranks get SIGTERM odls_base_sigkill_timeout = 1 s later and SIGKILL 1 s after
    # that, and mpirun exits 1; measured in benchmarks/preemption.py.)
    model_dir = str(tmp_path / "m")
    out, sent = send_from_outside(wrapped(mpirun(["-m", "lmkit", "train", *flags(corpus, model_dir, slow_config, 1)])),
                                  signal.SIGTERM)
    assert out.returncode == PREEMPTED, out.output[-3000:]
    assert "[launch] SIGTERM: passing SIGUSR1 to Open MPI's launcher" in out.output
    assert check_stopped_inside(out, model_dir, sent) < 60


@pytest.mark.horovod
@pytest.mark.mpi
def test_launch_wrapping_horovodrun_turns_term_into_a_preemption(corpus, slow_config, tmp_path):
    # horovodrun over MPI runs mpirun under `sh -c`, which dies of SIGTERM without passing it
    # on; the wrapper finds the mpirun below it and sends it SIGUSR1.
    model_dir = str(tmp_path / "m")
    cmd = ["horovodrun", "-np", "2", "-H", "localhost:2", "--mpi-args=--oversubscribe",
           sys.executable, "-m", "lmkit", "train", *flags(corpus, model_dir, slow_config, 1)]
    out, sent = send_from_outside(wrapped(cmd), signal.SIGTERM, env=venv_path())
    assert out.returncode == PREEMPTED, out.output[-3000:]
    assert check_stopped_inside(out, model_dir, sent) < 60


@pytest.mark.horovod
def test_horovodrun_gloo_passes_term_to_the_ranks(corpus, slow_config, tmp_path):
    # horovodrun --gloo sends SIGTERM to its ranks at once (and SIGKILL 5 s later): the ranks
    # stop with a checkpoint. horovodrun's own status is not the ranks' 75: 1, or 0 when its
    # signal handler wins a race (1 round of 3 in benchmarks/preemption.py).
    model_dir = str(tmp_path / "m")
    cmd = horovodrun_gloo_cmd(2, ["-m", "lmkit", "train", *flags(corpus, model_dir, slow_config, 1)])
    out, sent = send_from_outside(cmd, signal.SIGTERM)
    assert out.returncode in (0, 1), out.output[-3000:]
    assert out.count("preempted: stopped by SIGTERM") == 1, out.output[-3000:]
    assert check_stopped_inside(out, model_dir, sent) < 60


def test_lmkit_launch_forwards_term(corpus, slow_config, tmp_path):
    model_dir = str(tmp_path / "m")
    out, sent = send_from_outside([*LAUNCH, *LMKIT, "--backend", "native",
                                   *flags(corpus, model_dir, slow_config, 1)], signal.SIGTERM)
    assert out.returncode == PREEMPTED, out.output[-3000:]
    assert check_stopped_inside(out, model_dir, sent) < 60


def test_sigkill_during_the_preemption_save_keeps_the_previous_checkpoint(corpus, model_copy):
    ckpts = os.path.join(model_copy, "checkpoints")
    assert os.listdir(ckpts) == ["ckpt-000000064"]  # one finished epoch
    previous = tree_digest(os.path.join(ckpts, "ckpt-000000064"))
    started, sent = [], []  # the Python process itself (no launcher in between)

    def on_line(line):
        if re.search(r"epoch 2/2 step \d+/64", line) and not sent:
            sent.append(True)
            os.kill(started[0].pid, signal.SIGTERM)  # the scheduler's notice
        if "in the middle of saving step" in line:
            os.kill(started[0].pid, signal.SIGKILL)  # the machine goes before the save is done

    flags_ = ["--config", corpus.config, "--data_path", corpus.data, "--model_dir", model_copy,
              "--num_epochs", "2"]
    out = run_streamed([sys.executable, FAULTY, "--fault", "kind=slow_save", "--", *flags_], timeout=300,
                       on_line=on_line, on_start=started.append)
    assert out.returncode == -signal.SIGKILL, out.output[-4000:]
    leftovers = sorted(os.listdir(ckpts))
    assert leftovers[0] == "ckpt-000000064" and re.fullmatch(r"ckpt-\d+\.tmp-\d+", leftovers[1]), leftovers
    assert tree_digest(os.path.join(ckpts, "ckpt-000000064")) == previous
    # The rerun continues from the last complete checkpoint.
    out = run_streamed([*LMKIT, "--backend", "local", *flags_], timeout=300)
    assert out.returncode == 0, out.output[-4000:]
    assert re.search(r"resumed from \S+/ckpt-000000064 \(epoch 1, step 64\)", out.output)
    assert sorted(os.listdir(ckpts)) == ["ckpt-000000064", "ckpt-000000128"]


@pytest.mark.parametrize("backend", [
    pytest.param("horovod", marks=[pytest.mark.horovod, pytest.mark.mpi]), "native"])
def test_with_device_prefetch_the_ranks_stop_two_steps_after_the_agreement(corpus, tmp_path, backend):
    # With device_prefetch each rank reads the agreed flags on a thread of its own and decides on them two
    # steps after the step that carried them (lmkit.train.resume.Boundaries): a signal in step 100 rides
    # with step 101's all-reduce, and every rank stops after step 103, with one checkpoint of that step.
    config = write_config(str(tmp_path / "config_prefetch.py"), corpus.vocab_size, num_epochs=2, device_prefetch=2)
    _, faulty = launchers(backend)
    model_dir = str(tmp_path / "stopped")
    extra = ["--backend", "native"] if backend == "native" else []
    out = run_streamed([*faulty, "--fault", "rank=1,step=100,kind=signal", "--",
                        *flags(corpus, model_dir, config), *extra], timeout=400)
    assert out.returncode == PREEMPTED, out.output[-4000:]
    assert out.count("preempted: stopped by ") == 1, out.output[-3000:]
    assert re.search(r"preempted: stopped by a signal on another rank at step 103 \(epoch 2, 39 steps into it\); "
                     r"checkpoint \S+/ckpt-000000103; rerun", out.output), out.output[-3000:]
    last = metas(model_dir)[-1]
    assert (last["step"], last["epoch"], last["steps_in_epoch"], last["stopped_by"]) == (103, 1, 39, "preemption")


# ---------------------------------------------------------------- signals outside training (lmkit.core.preemption)
def test_sigterm_during_the_final_test_evaluation_keeps_the_checkpoint_and_the_rerun_finishes(corpus, tmp_path):
    # After training wrote its last checkpoint, rank 0 evaluates the test split (held there by the faulty
    # example): a signal then stops the command with 75 too (it took SIGTERM's default action, 143), the
    # checkpoint stays, and the same command again evaluates and writes the results.
    model_dir = str(tmp_path / "m")
    started, sent = [], []

    def on_line(line):
        if "injecting slow_test_eval" in line and not sent:
            sent.append(True)
            os.kill(started[0].pid, signal.SIGTERM)

    out = run_streamed([sys.executable, FAULTY, "--fault", "kind=slow_test_eval,step=600", "--",
                        *flags(corpus, model_dir, corpus.config, 1)], timeout=300, on_line=on_line,
                       on_start=started.append)
    assert out.returncode == PREEMPTED, out.output[-4000:]
    assert out.count("preempted: ") == 1 and "Traceback" not in out.output, out.output[-4000:]
    assert ("preempted: stopped by SIGTERM while finishing after training (the test split's evaluation, "
            "results.json); the trained model's last checkpoint is kept; rerun the same command to continue"
            ) in out.output, out.output[-4000:]
    assert [m["step"] for m in metas(model_dir)] == [STEPS]
    assert not os.path.exists(os.path.join(model_dir, "results.json"))
    out = run_streamed([*LMKIT, "--backend", "local", *flags(corpus, model_dir, corpus.config, 1)], timeout=300)
    assert out.returncode == 0, out.output[-4000:]
    assert re.search(r"resumed from \S+/ckpt-000000064 \(epoch 1, step 64\)", out.output), out.output[-3000:]
    assert "Test perplexity" in out.output
    results = json.load(open(os.path.join(model_dir, "results.json")))
    assert results["global_step"] == STEPS and results["test_perplexity"] > 1


@pytest.fixture(scope="module")
def big_text(tmp_path_factory):
    """12 MB of text: seconds of encoding with the char tokenizer in one process (under the 16 MB from
    which the cache encodes with a pool), so a signal at its first line falls inside it."""
    import random
    rng = random.Random(0)
    words = [f"w{i}" for i in range(400)]
    block = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(4000)) + "\n"
    path = str(tmp_path_factory.mktemp("text") / "train.txt")
    with open(path, "w") as f:
        f.write(block * ((12 << 20) // len(block)))
    return path


def start_up_flags(big_text, tmp_path):
    """lmkit train on ``big_text`` through a data cache (char tokenizer, a tiny transformer)."""
    return ["--config", "config_transformer", "--train_file", big_text, "--tokenizer", "char", "--data_cache",
            str(tmp_path / "cache"), "--model_dir", str(tmp_path / "m"), "--max_steps", "3",
            *[arg for key in ("hidden_size=16", "ffn_dim=32", "num_layers=1", "num_heads=2", "batch_size=4",
                              "num_steps=8", "max_positions=16") for arg in ("--set", key)]]


def signal_while_encoding(cmd):
    """Runs ``cmd`` and sends SIGTERM to it (the launcher) when rank 0 starts encoding the corpus."""
    started, sent = [], []

    def on_line(line):
        if line.startswith("encoding train_file (") and not sent:
            sent.append(True)
            os.kill(started[0].pid, signal.SIGTERM)

    out = run_streamed(cmd, timeout=300, on_line=on_line, on_start=started.append)
    assert sent, out.output[-4000:]
    return out


def check_stopped_at_start_up(out, signal_name, tmp_path):
    assert out.returncode == PREEMPTED, out.output[-4000:]
    assert out.count("preempted: ") == 1 and "Traceback" not in out.output, out.output[-4000:]
    assert (f"preempted: stopped by {signal_name} while encoding train_file into the data cache; nothing is lost "
            in out.output), out.output[-4000:]
    cache, checkpoints = tmp_path / "cache", tmp_path / "m" / "checkpoints"
    assert [n for n in os.listdir(cache) if not n.startswith("tokenizer-")] == []  # no .tmp-*, no token folder
    assert not checkpoints.is_dir() or not os.listdir(checkpoints)


@pytest.mark.horovod
@pytest.mark.mpi
def test_launch_wrapping_mpirun_stops_every_rank_during_start_up(big_text, tmp_path):
    # SIGTERM to `python -m lmkit.launch --mpirun ...` while rank 0 encodes the corpus into the data cache and
    # rank 1 waits for it in a broadcast (in C, where its Python handler cannot run): rank 0 stops, removes
    # its half-written cache folder and sends its stop to rank 1 through that broadcast; both exit 75
    # (the job ended with 138 before: SIGUSR1's default action).
    out = signal_while_encoding(wrapped(mpirun(["-m", "lmkit", "train", *start_up_flags(big_text, tmp_path)])))
    assert "[launch] SIGTERM: passing SIGUSR1 to Open MPI's launcher" in out.output
    check_stopped_at_start_up(out, "SIGUSR1", tmp_path)


def test_lmkit_launch_native_stops_every_worker_during_start_up(big_text, tmp_path):
    # The native backend's start-up (TensorFlow's coordination service) takes SIGTERM for itself: the signal
    # was lost and the job trained on. (TensorFlow may log the broadcast's end as an aborted RingGather.)
    out = signal_while_encoding([*LAUNCH, *LMKIT, "--backend", "native", *start_up_flags(big_text, tmp_path)])
    check_stopped_at_start_up(out, "SIGTERM", tmp_path)
