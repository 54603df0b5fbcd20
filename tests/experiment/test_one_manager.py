"""One experiment, one manager (issue 32, item 1): a second `resume` / `run --experiment-id` /
`view` of an experiment whose manager still runs is refused in one line naming that manager's pid
and WebUI (exit 2, as nnictl), and touches nothing: the first manager goes on serving, and every
trial's status and metrics in the store stay as they were. Real `nni-manager` processes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from nni_manager.store import Store
from tests.support.experiment.fixtures import BUILTIN_TUNERS, processes_under

CLI = [sys.executable, "-m", "nni_manager"]

# x 1 and 2 succeed at once; x 3 and 4 run until stopped: a store with ended and running trials
MIXED = """
    import time
    import nni_agent as nni
    p = nni.get_next_parameter()
    nni.report_intermediate_result(p["x"])
    if p["x"] >= 3:
        time.sleep(300)
    nni.report_final_result(p["x"] * 10)
"""


def cli(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(home), **BUILTIN_TUNERS})  # the subject is the lock


def _status(url: str) -> str:
    with urllib.request.urlopen(url + "api/v1/nni/check-status", timeout=10) as response:
        return json.loads(response.read())["status"]


def _snapshot(directory: Path) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    store = Store.open_readonly(directory)
    try:
        statuses = {t.id: t.status.value for t in store.trials()}
        metrics = sorted((m["trial_id"], m["type"], str(m["data"])) for m in store.metrics())
    finally:
        store.close()
    return statuses, metrics


def test_second_manager_is_refused_and_touches_nothing(make_config, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "code" / "mixed.py").write_text(textwrap.dedent(MIXED))
    config = make_config("mixed.py")
    started = cli(home, "run", str(config), "--detach", "--port", "0", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    exp_id = re.search(r"experiment (\w+) runs in the background \(pid (\d+)\)", started.stdout).group(1)
    url = re.search(r"^WebUI: (\S+)$", started.stdout, re.M).group(1)
    directory = tmp_path / "exps" / exp_id
    try:
        deadline = time.monotonic() + 90
        while True:
            statuses, metrics = _snapshot(directory) if (directory / "experiment.db").is_file() else ({}, [])
            if sorted(statuses.values()) == ["RUNNING", "RUNNING", "SUCCEEDED", "SUCCEEDED"] and len(metrics) >= 6:
                break
            assert time.monotonic() < deadline, f"never 2 ended and 2 running trials: {statuses}"
            time.sleep(0.3)
        before = _snapshot(directory)
        manager_pid = json.loads((home / "nni-experiments" / ".experiment").read_text())[exp_id]["pid"]
        log_before = (directory / "detach.log").read_bytes()

        attempts = [("resume", exp_id), ("resume", exp_id, "--detach", "--port", "0"),
                    ("run", str(config), "--experiment-id", exp_id, "--no-webui"),
                    ("run", str(config), "--experiment-id", exp_id, "--detach"), ("view", exp_id, "--port", "0")]
        for attempt in attempts:
            refused = cli(home, *attempt, cwd=tmp_path)
            assert refused.returncode == 2, (attempt, refused.stdout, refused.stderr)
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in refused.stderr, (attempt, refused.stderr)
            assert f"experiment {exp_id} is already running" in lines[0], lines[0]
            assert f"pid {manager_pid}" in lines[0] and url.rstrip("/") in lines[0], lines[0]
            assert f"nni-manager stop {exp_id}" in lines[0], lines[0]

        assert _status(url) in ("RUNNING", "NO_MORE_TRIAL")  # the first manager still runs and serves
        assert _snapshot(directory) == before  # no trial rewritten, no metric lost or added
        assert (directory / "detach.log").read_bytes() == log_before  # nothing appended to its log
        listed = cli(home, "list", cwd=tmp_path)
        assert exp_id in listed.stdout and url.rstrip("/") in listed.stdout, listed.stdout  # still listed
    finally:
        stopped = cli(home, "stop", exp_id, cwd=tmp_path)
        if stopped.returncode != 0:
            for proc in processes_under(tmp_path):
                proc.kill()
    assert stopped.returncode == 0, stopped.stderr
    assert processes_under(tmp_path) == []
    # once it is stopped, the lock is free again: resume works (the two sleeping trials were cancelled by stop)
    resumed = cli(home, "resume", exp_id, "--plain", "--no-webui", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    after = _snapshot(directory)[0]
    assert sorted(after.values()).count("SUCCEEDED") >= 2 and all(after[t] == "SUCCEEDED" for t in before[0]
                                                                   if before[0][t] == "SUCCEEDED")
