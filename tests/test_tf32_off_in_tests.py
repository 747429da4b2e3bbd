"""Tests run without TensorFloat-32 (tight float32 tolerances on Ampere or newer GPUs)."""
import os
import subprocess
import sys

import tensorflow as tf


def test_tf32_is_off_here_and_in_subprocesses():
    assert not tf.config.experimental.tensor_float_32_execution_enabled()
    assert os.environ["NVIDIA_TF32_OVERRIDE"] == "0"
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['NVIDIA_TF32_OVERRIDE'])"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "0"


def test_training_keeps_tf32_by_default():
    # lmkit itself never turns TF32 off: a fresh interpreter has it on after importing lmkit.
    env = {k: v for k, v in os.environ.items() if k != "NVIDIA_TF32_OVERRIDE"}
    code = ("import tensorflow as tf, lmkit.train, lmkit.distributed as d; d.init(backend='local'); "
            "print(tf.config.experimental.tensor_float_32_execution_enabled())")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip().splitlines()[-1] == "True"
