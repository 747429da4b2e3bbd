"""``python -m lmkit.launch``: the launcher's command-line entry (it lives in :mod:`lmkit.distributed.launch`)."""

import sys

from lmkit.distributed.launch import main

if __name__ == "__main__":
    sys.exit(main())
