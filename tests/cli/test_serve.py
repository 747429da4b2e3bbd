"""``lmkit serve``'s flags: bad ones are one ``error:`` line and exit 2 (before the model loads); binding a
non-local address without a key warns."""
import sys

from tests.helpers import run


def test_bad_flags_exit_2_and_a_public_bind_without_a_key_warns(tmp_path):
    res = run([sys.executable, "-m", "lmkit", "serve", "--model_dir", str(tmp_path / "none")], timeout=300)
    assert res.returncode == 2 and "error: --model_dir" in res.stderr and "Traceback" not in res.stderr
    res = run([sys.executable, "-m", "lmkit", "serve", "--model_dir", str(tmp_path), "--port", "70000"], timeout=300)
    assert res.returncode == 2 and "--port 70000" in res.stderr
    res = run([sys.executable, "-m", "lmkit", "serve", "--model_dir", str(tmp_path), "--host", "0.0.0.0",
               "--max_batch", "0"], timeout=300)
    assert "warning: binding 0.0.0.0 without an API key" in res.stderr
    assert res.returncode == 2 and "--max_batch 0" in res.stderr and "Traceback" not in res.stderr
