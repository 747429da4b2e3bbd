"""python -m lmkit.launch (lmkit.distributed.launch): the plan of a native job's workers, their environment
and commands, core binding, signals passed on, and which worker the job's last line names when one fails."""
import json
import os
import re
import socket

import pytest

from lmkit.distributed import launch


def test_plan_spreads_workers_over_hosts_in_rank_order():
    workers = launch.plan("h1,h2", 4, port=5000)
    assert [(w.rank, w.host, w.port, w.local_rank, w.local_size) for w in workers] == [
        (0, "h1", 5000, 0, 2), (1, "h1", 5001, 1, 2), (2, "h2", 5000, 0, 2), (3, "h2", 5001, 1, 2)]
    slots = launch.plan("h1:3,h2:1", 4, port=7000)
    assert [(w.host, w.local_rank, w.local_size) for w in slots] == [
        ("h1", 0, 3), ("h1", 1, 3), ("h1", 2, 3), ("h2", 0, 1)]


def test_plan_on_this_host_picks_distinct_free_ports_that_no_outgoing_connection_takes():
    workers = launch.plan("127.0.0.1", 3)
    ports = [w.port for w in workers]
    low = launch._ephemeral_range()[0]
    # Below the kernel's ephemeral range: a busy machine's outgoing connections cannot take them before the
    # workers bind them (a native job once failed with "Address already in use" under load).
    assert len(set(ports)) == 3 and all(1024 <= p < low for p in ports)
    assert [w.local_rank for w in workers] == [0, 1, 2]
    held = socket.socket()
    held.bind(("", ports[0]))  # a port taken since: never picked while it is taken
    try:
        assert ports[0] not in launch._free_ports(200)
    finally:
        held.close()


@pytest.mark.parametrize("hosts, n, match", [
    ("h1,h2", 3, "cannot be spread evenly over 2 hosts"),
    ("h1:2,h2", 3, "give slots for every host or for none"),
    ("h1:2,h2:2", 3, "has 4 slots but --num_workers is 3"),
    ("h1:x", 1, "slots must be a positive integer"),
    ("", 1, "names no host"),
    ("h1", 0, "must be >= 1"),
])
def test_plan_rejects_what_does_not_fit(hosts, n, match):
    with pytest.raises(ValueError, match=match):
        launch.plan(hosts, n, port=5000)


def test_worker_env_is_a_tf_config_cluster():
    workers = launch.plan("h1,h2", 2, port=2222)
    env = launch.worker_env(workers[1], workers)
    assert json.loads(env["TF_CONFIG"]) == {"cluster": {"worker": ["h1:2222", "h2:2222"]},
                                            "task": {"type": "worker", "index": 1}}
    assert (env["LMKIT_BACKEND"], env["RANK"], env["LMKIT_LOCAL_RANK"], env["LMKIT_LOCAL_SIZE"]) == (
        "native", "1", "0", "1")
    cmd = launch.remote_command(workers[1], workers, ["python", "train.py", "--x", "a b"], "/srv/lm")
    assert cmd.startswith("cd /srv/lm && exec env TF_CONFIG=")
    assert cmd.endswith("python train.py --x 'a b'")


def test_other_hosts_get_the_settings_mpirun_x_would_pass():
    workers = launch.plan("h1,h2", 2, port=2222)
    environ = {"NCCL_SOCKET_IFNAME": "eth0", "TF_CPP_MIN_LOG_LEVEL": "1", "CUDA_VISIBLE_DEVICES": "0,1",
               "XLA_FLAGS": "--xla_gpu_autotune_level=2", "LMKIT_TF32": "0", "HOME": "/root",
               "MY_SETTING": "a b", "TF_CONFIG": "{\"stale\": 1}", "RANK": "9"}
    forwarded = launch.forwarded_env(environ, names=["MY_SETTING"])
    assert set(forwarded) == {"NCCL_SOCKET_IFNAME", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES",
                              "XLA_FLAGS", "LMKIT_TF32", "MY_SETTING", "TF_CONFIG"}
    cmd = launch.remote_command(workers[1], workers, ["python", "t.py"], "/srv", forwarded)
    assert "NCCL_SOCKET_IFNAME=eth0 " in cmd and "MY_SETTING='a b' " in cmd and "HOME=" not in cmd
    assert "XLA_FLAGS=--xla_gpu_autotune_level=2 " in cmd and "RANK=1 " in cmd and "RANK=9" not in cmd
    assert cmd.count("TF_CONFIG=") == 1 and "stale" not in cmd  # the worker's own wins


def test_launch_env_flag_forwards_named_variables(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("PYTHONPATH", "/opt/lib")
    assert launch.main(["--hosts", "h1,h2", "--num_workers", "2", "--port", "3000", "--dry_run",
                        "-x", "PYTHONPATH", "--", "python", "x.py"]) == 0
    out = capsys.readouterr().out
    assert out.count("NCCL_DEBUG=INFO") == 2 and out.count("PYTHONPATH=/opt/lib") == 2
    with pytest.raises(SystemExit) as exc:
        launch.main(["--hosts", "h1", "--num_workers", "1", "--env", "A=B", "--", "python", "x.py"])
    assert exc.value.code == 2
    assert "--env 'A=B' is not a variable name" in capsys.readouterr().err


def test_dry_run_prints_one_command_per_worker(capsys):
    assert launch.main(["--hosts", "h1,h2", "--num_workers", "2", "--port", "3000", "--dry_run",
                        "--", "python", "x.py"]) == 0
    out = capsys.readouterr().out
    assert out.count("env TF_CONFIG=") == 2 and "h2:3000" in out


def test_launch_returns_the_failing_workers_status(tmp_path):
    # Two local workers, one fails: the launcher stops the other and reports the failure.
    script = tmp_path / "w.py"
    script.write_text("import os, sys, time\n"
                      "sys.exit(7) if os.environ['RANK'] == '1' else time.sleep(60)\n")
    import sys
    assert launch.main(["--hosts", "127.0.0.1", "--num_workers", "2", "--", sys.executable,
                        str(script)]) == 7


def _ordered_exits(tmp_path, first_rank: str, first: str, then: str) -> str:
    """A worker script: rank ``first_rank`` runs ``first`` (its exit); the other rank waits until the
    launcher has reaped it (so its end was noted first), then runs ``then``."""
    script = tmp_path / "w.py"
    pid_file = str(tmp_path / "first.pid")
    script.write_text(
        "import os, sys, time\n"
        f"pid_file = {pid_file!r}\n"
        f"if os.environ['RANK'] == {first_rank!r}:\n"
        "    open(pid_file + '.tmp', 'w').write(str(os.getpid()))\n"
        "    os.replace(pid_file + '.tmp', pid_file)\n"
        f"    {first}\n"
        "while not os.path.exists(pid_file):\n"
        "    time.sleep(0.005)\n"
        "pid = open(pid_file).read()\n"
        "while os.path.exists('/proc/' + pid):  # until the launcher has reaped the first\n"
        "    time.sleep(0.005)\n"
        f"{then}\n")
    return str(script)


def _bystander_script(tmp_path):
    """Worker 1 exits 7; worker 0 exits 1 as soon as worker 1 is gone (as a collective would abort)."""
    return _ordered_exits(tmp_path, "1", "sys.exit(7)", "sys.exit(1)")


def test_launch_names_the_worker_that_failed_first_not_the_one_that_followed(tmp_path, capsys):
    # Worker 0 fails right after worker 1, as a bystander whose collective was aborted does:
    # the cause is worker 1, and the job's last line says so.
    import sys
    assert launch.main(["--hosts", "127.0.0.1", "--num_workers", "2", "--bind", "none", "--",
                        sys.executable, _bystander_script(tmp_path)]) == 7
    lines = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"\[launch\] the job failed: worker 1 of 2 \(on 127\.0\.0\.1, pid \d+\) failed first "
                        r"\(exit status 7; its own message above says why\); the other workers' errors after it "
                        r"follow from it", lines[-1]), lines
    assert not any("worker 0 of 2" in line for line in lines), lines


def test_launch_names_the_cause_even_when_the_bystanders_exit_reaches_it_first(tmp_path, capsys):
    # Under load the exit of a bystander (status 4: its collective was cancelled) can reach the
    # launcher before that of the worker that caused it: the cause is still the one named.
    import sys
    # Worker 1 dies 1 s after worker 0 was reaped: past the launcher's 0.2 s poll, well inside CAUSE_WAIT (5 s).
    script = _ordered_exits(tmp_path, "0", "sys.exit(4)", "time.sleep(1.0); os.kill(os.getpid(), 9)")
    assert launch.main(["--hosts", "127.0.0.1", "--num_workers", "2", "--bind", "none", "--",
                        sys.executable, script]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"\[launch\] the job failed: worker 1 of 2 \(on 127\.0\.0\.1, pid \d+\) failed first "
                        r"\(killed by SIGKILL; .*", lines[-1]), lines
    assert not any("worker 0 of 2" in line for line in lines), lines


def test_launch_names_a_bystander_when_no_cause_is_on_this_host(tmp_path, capsys, monkeypatch):
    # The worker that failed ran on another host: the local bystander is named, and says so.
    import sys
    monkeypatch.setattr(launch, "CAUSE_WAIT", 0.2)
    script = tmp_path / "w.py"
    script.write_text("import os, sys, time\n"
                      "sys.exit(4) if os.environ['RANK'] == '0' else time.sleep(60)\n")
    assert launch.main(["--hosts", "127.0.0.1", "--num_workers", "2", "--bind", "none", "--",
                        sys.executable, str(script)]) == 4
    lines = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"\[launch\] the job failed: worker 0 of 2 .* failed first \(exit status 4; it stopped "
                        r"because a worker of another host failed; .*", lines[-1]), lines


def test_launch_names_a_worker_killed_by_a_signal(tmp_path, capsys):
    # A worker killed from outside (the kernel's OOM killer) prints nothing itself.
    import sys
    script = tmp_path / "w.py"
    script.write_text("import os, signal, time\n"
                      "os.kill(os.getpid(), signal.SIGKILL) if os.environ['RANK'] == '1' else time.sleep(120)\n")
    assert launch.main(["--hosts", "127.0.0.1", "--num_workers", "2", "--", sys.executable, str(script)]) == 1
    err = capsys.readouterr().err
    assert re.search(r"^\[launch\] worker 1 of 2 \(on 127\.0\.0\.1, pid \d+\) failed \(killed by SIGKILL\); "
                     r"stopping the others$", err, re.MULTILINE), err
    assert re.search(r"^\[launch\] the job failed: worker 1 of 2 .* failed first \(killed by SIGKILL; a signal "
                     r"from outside, e\.g\. the kernel's when memory ran out\)", err, re.MULTILINE), err


def test_launch_blames_no_worker_for_a_status_every_rank_exits_with(tmp_path, capsys):
    # Bad input: every lmkit rank exits 2 after rank 0 printed why; the first exit seen means nothing.
    import sys
    assert launch.main(["--hosts", "127.0.0.1", "--num_workers", "2", "--", sys.executable, "-c",
                        "raise SystemExit(2)"]) == 2
    assert "failed first" not in capsys.readouterr().err


@pytest.mark.parametrize("count, cpus, expected", [
    (2, [0, 1], [[0], [1]]),
    (2, [4, 5, 6, 7], [[4, 5], [6, 7]]),
    (3, [0, 1, 2, 3, 4, 5, 6], [[0, 1], [2, 3], [4, 5]]),
    (4, [0, 1], [None, None, None, None]),  # fewer cores than workers: no binding
])
def test_core_sets_split_the_cores_like_mpirun(count, cpus, expected):
    assert launch.core_sets(count, cpus) == expected


def _affinity_script(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("import os\n"
                      f"open(os.path.join({str(tmp_path)!r}, 'rank' + os.environ['RANK']), 'w').write(\n"
                      "    ','.join(map(str, sorted(os.sched_getaffinity(0)))))\n")
    return str(script)


def test_launch_binds_each_local_worker_to_its_share_of_the_cores(tmp_path):
    import sys
    assert launch.main(["--hosts", "127.0.0.1", "--num_workers", "2", "--", sys.executable,
                        _affinity_script(tmp_path)]) == 0
    every = sorted(os.sched_getaffinity(0))
    for rank, share in enumerate(launch.core_sets(2, every)):
        assert (tmp_path / f"rank{rank}").read_text() == ",".join(map(str, share or every))
    assert launch.main(["--hosts", "127.0.0.1", "--num_workers", "2", "--bind", "none", "--",
                        sys.executable, _affinity_script(tmp_path)]) == 0
    assert (tmp_path / "rank1").read_text() == ",".join(map(str, every))


def test_launch_starts_the_workers_of_other_hosts_through_the_rsh_agent(tmp_path):
    # The "agent" runs the command in a local shell, as ssh would on the other host.
    agent = tmp_path / "agent.sh"
    agent.write_text('#!/bin/sh\necho "$1" >> "$(dirname "$0")/hosts.txt"\nexec sh -c "$2"\n')
    agent.chmod(0o755)
    import sys
    assert launch.main(["--hosts", "127.0.0.1,remote-host", "--num_workers", "2", "--port", "3000",
                        "--rsh", str(agent), "--", sys.executable, _affinity_script(tmp_path)]) == 0
    assert (tmp_path / "hosts.txt").read_text().split() == ["remote-host"]
    assert (tmp_path / "rank0").exists() and (tmp_path / "rank1").exists()


def test_launch_puts_the_signal_handlers_back(tmp_path):
    # main is called in-process here: its forwarding handlers must not outlive it (a later
    # signal would go to workers that are gone instead of to whoever handles it now).
    import signal
    import sys
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    assert launch.main(["--num_workers", "1", "--port", "3000", "--", sys.executable, "-c", "pass"]) == 0
    assert {s: signal.getsignal(s) for s in before} == before


def test_launch_passes_a_notice_that_comes_while_the_workers_start_to_all_of_them(tmp_path, monkeypatch):
    import signal
    import subprocess
    import sys
    script = tmp_path / "w.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "got = []\n"
        "signal.signal(signal.SIGUSR1, lambda s, f: got.append('USR1'))\n"
        "deadline = time.time() + 20\n"
        "while not got and time.time() < deadline:\n"
        "    time.sleep(0.02)\n"
        f"open(os.path.join({str(tmp_path)!r}, 'rank' + os.environ['RANK']), 'w').write(','.join(got))\n"
        "sys.exit(75 if got else 0)\n")
    real_popen = subprocess.Popen
    started = []

    def popen_then_a_notice(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        if len(started) == 1:  # after the first worker, before the second
            os.kill(os.getpid(), signal.SIGUSR1)
        return proc

    monkeypatch.setattr(launch.subprocess, "Popen", popen_then_a_notice)
    code = launch.main(["--num_workers", "2", "--port", "3000", "--bind", "none", "--", sys.executable,
                        str(script)])
    # each worker got the notice once: through its handler, or before it had one (killed by it)
    for rank, proc in enumerate(started):
        assert ((tmp_path / f"rank{rank}").exists() and (tmp_path / f"rank{rank}").read_text() == "USR1"
                and proc.returncode == 75) or proc.returncode == -signal.SIGUSR1
    assert code in (75, 1)
