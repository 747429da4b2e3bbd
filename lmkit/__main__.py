"""``python -m lmkit COMMAND ...``: the same as the ``lmkit`` command."""

from lmkit.cli import main

if __name__ == "__main__":
    main()
