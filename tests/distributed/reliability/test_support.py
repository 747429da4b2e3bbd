"""The streamed runner of the reliability tests fails fast when the test's own callback fails."""
import sys

import pytest

from tests.distributed.reliability.support import run_streamed


def test_a_failing_line_callback_ends_the_job_at_once_and_names_the_error():
    def on_line(line):
        if "ready" in line:
            raise KeyError(1)  # as a lookup of a rank's pid that never arrived would

    # The callback's error, not the timeout's "still ran after": the job was ended at the error.
    with pytest.raises(AssertionError, match=r"on_line callback failed \(KeyError\(1\)\)"):
        run_streamed([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"],
                     timeout=100, on_line=on_line)


def test_the_runner_reports_the_exit_code_and_the_output():
    out = run_streamed([sys.executable, "-c", "print('one'); print('two'); raise SystemExit(3)"], timeout=100)
    assert out.returncode == 3 and out.output.splitlines() == ["one", "two"]
