"""Shared pytest set-up for lmkit."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# No TensorFloat-32 in tests: on Ampere or newer GPUs float32 matmuls would round to a
# 10-bit mantissa and miss the tests' float32 tolerances. cuBLAS and cuDNN read this
# variable in this process and in every subprocess a test starts (training keeps TF32).
os.environ["NVIDIA_TF32_OVERRIDE"] = "0"
# Encoded text goes to a cache of this test session (and of the processes it starts), never
# to the user's ~/.cache; tests of the cache give their own folders.
if "LMKIT_DATA_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["LMKIT_DATA_CACHE"] = tempfile.mkdtemp(prefix="lmkit-test-cache-")
    atexit.register(shutil.rmtree, os.environ["LMKIT_DATA_CACHE"], True)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


_PYTEST_PID = os.getpid()
_os_exit = os._exit


def _exit_outside_pytest(code: int) -> None:
    """``os._exit`` for the processes pytest forks; inside pytest's own process, a test failure.

    A test that reached a CLI's hard exit (``lmkit.cli.common._hard_exit``) in-process once ended a
    pytest-xdist worker without a word, and xdist then waited for it until CI's timeout.
    """
    if os.getpid() == _PYTEST_PID:
        raise AssertionError(f"os._exit({code}) inside the pytest process: run the command in a subprocess, "
                             "or patch lmkit.cli.common._hard_exit")
    _os_exit(code)


def pytest_configure(config):
    import tensorflow as tf

    os._exit = _exit_outside_pytest

    tf.config.experimental.enable_tensor_float_32_execution(False)  # TensorFlow's and XLA's switch
