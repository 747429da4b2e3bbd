"""``lmkit train`` and ``lmkit evaluate`` on conversations, in subprocesses: a bad record is one line naming the
file and the record (exit 2, no traceback, also under mpirun), or counted and skipped; conversations too long
are counted; a folder without a chat template names --chat_template; evaluate scores per assistant token."""
import concurrent.futures
import json
import sys

import pytest

from tests.cli.test_cli_bad_input import check_one_error
from tests.data.test_chat import CONVERSATIONS
from tests.helpers import mpirun_cmd, run, subprocess_env
from tests.train.chat_support import make_qwen2_folder

LMKIT = [sys.executable, "-m", "lmkit"]
SMALL = ["--set", "num_steps=63", "--set", "batch_size=2", "--max_steps", "1", "--set", "dropout=0.0"]
LONG = {"role": "user", "content": " ".join(["the cat sat on a mat"] * 20)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    out = {"folder": make_qwen2_folder(str(root / "qwen2")), "bare": make_qwen2_folder(str(root / "bare"), "")}
    good = [{"messages": m} for m in CONVERSATIONS] + [{"messages": [LONG, {"role": "assistant", "content": "a"}]}]
    bad = good[:1] + [{"messages": [{"role": "robot", "content": "x"}]}] + good[1:]
    for name, records in (("good", good), ("bad", bad)):
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        out[name] = str(path)
    return out


def _train(files, model_dir, train_file, *flags, folder="folder"):
    return ["train", "--init_from", files[folder], "--train_file", files[train_file], "--model_dir", model_dir,
            "--data_cache", "none", *SMALL, *flags]


@pytest.mark.horovod  # one of the runs is under mpirun, on Horovod
def test_bad_records_stop_the_run_in_one_line_or_are_skipped_and_counted(files, tmp_path):
    cmds = [LMKIT + _train(files, str(tmp_path / "bad"), "bad"),
            LMKIT + _train(files, str(tmp_path / "skip"), "bad", "--skip_bad_records", "--packing"),
            LMKIT + _train(files, str(tmp_path / "bare"), "good", folder="bare"),
            mpirun_cmd(2, ["-m", "lmkit", *_train(files, str(tmp_path / "bad2"), "bad")])]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        bad, skip, bare, two = pool.map(lambda cmd: run(cmd, timeout=300, env=subprocess_env()), cmds)
    check_one_error(bad, r"train_file '\S+/bad\.jsonl': record 2 \(line 2\): turn 1 has the unknown role 'robot'; "
                         r"roles are system, user, assistant; fix it, or pass --skip_bad_records")
    check_one_error(two, r"train_file '\S+/bad\.jsonl': record 2 \(line 2\): turn 1 has the unknown role 'robot'")
    assert skip.returncode == 0, skip.stdout[-2000:] + skip.stderr[-3000:]
    assert "train_file: skipped 1 of 7 records (1 unknown role)" in skip.stdout, skip.stdout[-3000:]
    assert "train_file: 1 examples are longer than 64 tokens: 0 cut at the end, 1 dropped" in skip.stdout
    assert "examples packed" in skip.stdout
    check_one_error(bare, r"a conversation is rendered with the model's chat template, and \S+/bare has none; "
                          r"pass --chat_template FILE")


def test_evaluate_scores_a_chat_file_per_assistant_token(files):
    res = run(LMKIT + ["evaluate", "--model_dir", files["folder"], "--text_file", files["good"], "--num_steps", "63",
                       "--json", "--data_cache", "none"], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert report["records"] == 6 and report["examples"] == 5 and report["weighted_tokens"] > 10
    assert 3.0 < report["loss_per_token"] < 8.0  # a random model's: about ln(320)
    assert "1 examples are longer than 64 tokens" in res.stderr
