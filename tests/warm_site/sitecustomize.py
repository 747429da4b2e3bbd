"""Put on ``PYTHONPATH`` by ``tests.warm.rank_env``: an Open MPI rank that can start warm does.

Python imports this module at start-up, before the command's own code, in each process whose
``PYTHONPATH`` names this folder. It does nothing in a process that is not an Open MPI rank of a
test; ``tests.warm.become_rank`` returns at once in a rank that must start cold.
"""
import os

if os.environ.get("LMKIT_TEST_WARM_SOCKET") and "OMPI_COMM_WORLD_RANK" in os.environ:
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_lmkit_test_warm", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "warm.py"))
    _warm = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_warm)
    _warm.become_rank()  # returns only when the rank starts cold
    del _spec, _warm, importlib
