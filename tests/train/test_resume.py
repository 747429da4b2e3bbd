"""When to save, stop or end (Boundaries, the same on every rank), and the checkpoints a run restores."""
import threading

import numpy as np
import pytest
import tensorflow as tf


class _Flags:
    """A step's agreed [stop, save, end], recording the thread that reads it (on a GPU, the read that waits)."""

    def __init__(self, stop, save, reads):
        self.values, self.reads = np.array([stop, save, 0.0], np.float32), reads

    def __array__(self, *args, **kwargs):
        self.reads.append(threading.current_thread().name)
        return self.values


class _Watcher:
    requested = False


@pytest.mark.parametrize("lag,background", [(1, False), (2, True), (3, True)])
def test_several_processes_decide_on_each_steps_flags_lag_steps_later(lag, background):
    """Every rank decides on step s's agreed flags after step s + lag started (the same step on every rank),
    read on a thread of their own when asked; the epoch's end decides on every flag not decided yet."""
    from lmkit.train.resume import Boundaries

    reads = []
    boundaries = Boundaries(_Watcher(), every_steps=0, every_minutes=0.0, lag=lag, background=background)
    asked = {3: (0.0, 1.0), 6: (1.0, 0.0)}  # a save asked at step 3, a stop at step 6
    decided = {}
    for step in range(1, 9):
        actions = boundaries.after_step(_Flags(*asked.get(step, (0.0, 0.0)), reads), step)
        if actions:
            decided[step] = actions
    assert decided == {3 + lag: ["save"], 6 + lag: ["stop"]} if 6 + lag <= 8 else {3 + lag: ["save"]}
    tail = boundaries.flush()
    assert tail == ([] if 6 + lag <= 8 else ["stop"])
    assert boundaries.flush() == []
    boundaries.close()
    assert len(reads) == 8
    assert all(name.startswith("lmkit-flags") for name in reads) if background else \
        all(name == threading.current_thread().name for name in reads)
    with pytest.raises(ValueError, match="lag 0 must be >= 1"):
        Boundaries(_Watcher(), 0, 0.0, lag=0)


def test_every_steps_saves_are_decided_at_once_whatever_the_lag():
    from lmkit.train.resume import Boundaries

    boundaries = Boundaries(_Watcher(), every_steps=4, every_minutes=0.0, lag=2, background=True)
    saves = [step for step in range(1, 10) if boundaries.after_step(np.zeros(3, np.float32), step) == ["save"]]
    boundaries.close()
    assert saves == [4, 8]


class _Control:
    should_save = should_stop = False


def test_a_stop_comes_before_an_end_and_an_end_before_a_save():
    from lmkit.train.resume import Boundaries

    boundaries = Boundaries(_Watcher(), every_steps=0, every_minutes=0.0, lag=1)
    decided = [boundaries.after_step(np.array(flags, np.float32), step) for step, flags in enumerate(
        [(0, 1, 1), (1, 1, 1), (0, 1, 0), (0, 0, 0), (0, 0, 0.5)], start=1)]
    assert decided == [[], ["end"], ["stop"], ["save"], []]
    assert boundaries.flush() == ["end"]  # the last step's: averaged over 2 ranks, one asked


def test_a_callbacks_requests_are_sent_once_with_the_next_step():
    from lmkit.train.resume import Boundaries

    control = _Control()
    boundaries = Boundaries(_Watcher(), every_steps=0, every_minutes=0.0, control=control)
    assert boundaries.flags() == (0.0, 0.0, 0.0)
    control.should_save = True
    assert boundaries.flags() == (0.0, 1.0, 0.0) and not control.should_save
    control.should_stop = True
    assert boundaries.flags() == (0.0, 0.0, 1.0) and not control.should_stop
    assert boundaries.flags() == (0.0, 0.0, 0.0)  # a pulse: the step's all-reduce carries it


def test_a_loop_of_ones_own_restores_the_newest_checkpoint_and_its_position(tmp_path):
    """Checkpointer.for_run + restore_latest: the parts examples/lm_ptb_distributed.py resumes with."""
    from lmkit import distributed as dist
    from lmkit.train import Progress
    from lmkit.train.resume import Checkpointer

    dist.init()
    variable = tf.Variable([1.0, 2.0])
    module = tf.Module()
    module.weights = variable
    progress = Progress(seed=3)
    lines = []
    checkpoints = Checkpointer.for_run(str(tmp_path), module, tf.Module(), progress, keep=2, log=lines.append)
    assert checkpoints.restore_latest([variable], None, seed=3)[0] is None  # nothing yet: nothing read
    progress.global_step.assign(7)
    progress.steps_in_epoch.assign(7)
    state = tf.constant([[0.5, 0.25]])  # one row of a carried state
    path = checkpoints.save(state, {"saved_by": "schedule"})
    assert path.endswith("ckpt-000000007") and lines == [f"saved checkpoint {path}"]
    variable.assign([0.0, 0.0])
    progress.global_step.assign(0)
    again = Checkpointer.for_run(str(tmp_path), module, tf.Module(), progress)
    found, position = again.restore_latest([variable], tf.zeros([1, 2]), seed=3)
    assert found == path and int(progress.global_step.numpy()) == 7
    assert variable.numpy().tolist() == [1.0, 2.0] and position.steps_in_epoch == 7
    np.testing.assert_array_equal(position.state.numpy(), state.numpy())
    assert Checkpointer.for_run(None, module, tf.Module(), progress).manager is None  # no folder: nothing kept


def test_a_preempted_run_says_where_it_stopped_and_what_to_do():
    from lmkit import distributed as dist
    from lmkit.core.errors import PreemptedError
    from lmkit.train import Progress
    from lmkit.train.resume import preempted

    class Watcher:
        signal_name, stopped_calls = "SIGTERM", []

        def stopped(self):
            self.stopped_calls.append(True)

    dist.init()
    progress = Progress(seed=1)
    progress.global_step.assign(102)
    progress.epoch.assign(1)
    progress.steps_in_epoch.assign(38)
    watcher = Watcher()
    error = preempted(watcher, progress, "/runs/m/checkpoints/ckpt-000000102")
    assert isinstance(error, PreemptedError) and error.exit_code == 75 and watcher.stopped_calls == [True]
    assert str(error) == ("stopped by SIGTERM at step 102 (epoch 2, 38 steps into it); checkpoint "
                          "/runs/m/checkpoints/ckpt-000000102; rerun the same command to continue from there")
    progress.steps_in_epoch.assign(0)
    watcher.signal_name = None
    assert "stopped by a signal on another rank at step 102 (the end of epoch 1)" in str(
        preempted(watcher, progress, None))
