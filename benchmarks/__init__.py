"""lmkit's benchmarks: scripts that write JSON results and PNG plots (see docs/performance.md).

Run them as scripts (``.venv/bin/python benchmarks/train_throughput.py``); the
package only lets them share ``benchmarks._common``.
"""

__all__: list = []
