"""The agent's reaper, subreaper and tree kill, with real processes."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from nni_agent.process import MARKER_ENV, child_reaper, kill_tree, make_subreaper, spawn_shell, tree_members
from tests.support.agent.trialkit import PY, run, wait_until

LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper is Linux-only")


def _spawn(tmp_path: Path, command: str, marker: str = "k/t") -> int:
    return spawn_shell(command, cwd=tmp_path, env={**os.environ, MARKER_ENV: marker},
                       stdout=tmp_path / "out", stderr=tmp_path / "err")


def test_exit_status_reaches_the_registered_future(tmp_path: Path) -> None:
    async def body() -> list[int]:
        reaper = child_reaper()
        assert child_reaper() is reaper  # one per loop
        pids = [_spawn(tmp_path, f"exit {i}") for i in range(5)]
        futures = [reaper.wait_for(pid) for pid in pids]
        return [os.waitstatus_to_exitcode(s) for s in await asyncio.gather(*futures)]

    assert run(body) == [0, 1, 2, 3, 4]


def test_status_of_a_child_reaped_before_registration_is_kept(tmp_path: Path) -> None:
    async def body() -> int:
        reaper = child_reaper()
        pid = _spawn(tmp_path, "exit 9")
        await wait_until(lambda: pid in reaper._unclaimed, what="the reaper to collect the child")
        return os.waitstatus_to_exitcode(await reaper.wait_for(pid))

    assert run(body) == 9


@LINUX_ONLY
def test_orphaned_grandchild_is_adopted_and_reaped(tmp_path: Path) -> None:
    pidfile = tmp_path / "gc.pid"

    async def body() -> int:
        reaper = child_reaper()
        assert make_subreaper()
        pid = _spawn(tmp_path, f"(sleep 1 & echo $! > {pidfile}) ; exit 0")
        await reaper.wait_for(pid)
        await wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
        grandchild = int(pidfile.read_text())
        assert psutil.Process(grandchild).ppid() == os.getpid()  # adopted by us, not by init
        await wait_until(lambda: not psutil.pid_exists(grandchild), what="the orphan to be reaped")
        return grandchild

    run(body)


def test_kill_tree_escalates_to_sigkill(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"

    async def body() -> None:
        reaper = child_reaper()
        pid = _spawn(tmp_path, f"{PY} -c \"{code}\" & {PY} -c \"{code}\" & wait")
        exit_status = reaper.wait_for(pid)
        await wait_until(lambda: (tmp_path / "out").read_bytes().count(b"up") == 2)
        assert len(tree_members(pid, "k/t")) == 3
        await kill_tree(pid, "k/t", signal.SIGTERM, 0.2)
        assert tree_members(pid, "k/t") == []
        await exit_status

    run(body)


def test_kill_tree_leaves_unmarked_processes_alone(tmp_path: Path) -> None:
    async def body() -> None:
        reaper = child_reaper()
        ours = _spawn(tmp_path, "sleep 60", marker="k/ours")
        other = _spawn(tmp_path, "sleep 60", marker="k/other")
        await kill_tree(ours, "k/ours", signal.SIGTERM, 1.0)
        await reaper.wait_for(ours)
        assert psutil.Process(other).status() != psutil.STATUS_ZOMBIE
        await kill_tree(other, "k/other", signal.SIGTERM, 1.0)
        await reaper.wait_for(other)

    run(body)


def test_a_simple_command_replaces_its_shell_and_the_rest_run_as_written() -> None:
    from nni_agent.process import shell_line

    assert shell_line("python3 train.py --lr 0.1") == "exec python3 train.py --lr 0.1"
    assert shell_line("  python3 'my dir/t.py' $ARGS") == "exec   python3 'my dir/t.py' $ARGS"
    assert shell_line("python3 -c 'import a; a.run() > 1'") == "exec python3 -c 'import a; a.run() > 1'"  # quoted
    for command in ("cd sub && python3 t.py", "python3 t.py; echo done", "python3 t.py | tee log",
                    "python3 t.py > out", "LR=1 python3 t.py", "exit 3", "export A=1", "(python3 t.py)",
                    "python3 t.py &", "echo `date`", "python3 a.py\npython3 b.py", "if true; then :; fi", "",
                    "echo a\\\nb"):
        assert shell_line(command) == command, command


def test_a_simple_trial_command_is_the_trial_process_and_failures_keep_the_shells_words(tmp_path: Path) -> None:
    async def body() -> tuple[str, int, int]:
        reaper = child_reaper()
        pid = _spawn(tmp_path, f"{PY} -c 'import time; time.sleep(30)'")
        proc = psutil.Process(pid)  # becomes the trial itself (without exec: a /bin/sh waiting for it)
        await wait_until(lambda: proc.cmdline()[:1] == [PY], what="the shell to exec the trial")  # name() is cached
        name = Path(proc.cmdline()[0]).name
        os.kill(pid, signal.SIGTERM)
        killed = os.waitstatus_to_exitcode(await reaper.wait_for(pid))
        missing = os.waitstatus_to_exitcode(await reaper.wait_for(_spawn(tmp_path, "no-such-program-xyz --flag")))
        return name, killed, missing

    name, killed, missing = run(body)
    assert name.startswith("python") and killed == -signal.SIGTERM
    assert missing == 127 and "no-such-program-xyz: not found" in (tmp_path / "err").read_text()
