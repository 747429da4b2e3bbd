"""The commands' shared plumbing: --set values, the model folder check, a closed output."""
import subprocess
import sys

import pytest

from lmkit.cli.common import check_model_dir, parse_overrides
from lmkit.core.errors import UsageError


def test_set_reads_python_literals_and_bare_words():
    assert parse_overrides(["batch_size=40", "optimization.optimizer=adam", "model.attention_blocks=4",
                            "optimizer_params={'beta1': 0.9}", "init_from=a=b", " seed =3"]) == {
        "batch_size": 40, "optimization.optimizer": "adam", "model.attention_blocks": 4,
        "optimizer_params": {"beta1": 0.9}, "init_from": "a=b", "seed": 3}
    with pytest.raises(UsageError, match=r"--set 'batch_size' is not KEY=VALUE; e.g. --set batch_size=40"):
        parse_overrides(["batch_size"])


def test_a_model_dir_without_a_run_is_named(tmp_path):
    with pytest.raises(UsageError, match="holds no config.json"):
        check_model_dir(str(tmp_path))


def test_a_closed_output_ends_a_command_quietly_with_the_sigpipe_status():
    # `lmkit generate ... | head`: the reader leaves; no traceback, status 141 as after SIGPIPE.
    code = ("from lmkit.cli.common import OutputClosed, run_main\n"
            "def main(argv):\n"
            "    print('one line', flush=True)\n"
            "    raise OutputClosed()\n"
            "run_main(main, [])\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 141 and res.stdout == "one line\n" and res.stderr == ""
