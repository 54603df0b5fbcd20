"""`run --detach` writes its log (which holds the WebUI's URL, with its token on a non-loopback
--bind) in the experiment's own 0700 directory, never through a file or link someone else put in a
shared experimentWorkingDirectory. Real `nni-manager` processes; the other user is uid 65534."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.experiment.fixtures import code_dir, make_config, processes_under  # noqa: F401 (fixtures)

CLI = [sys.executable, "-m", "nni_manager"]
NOBODY = 65534


def _cli(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(home)})


def _stop(home: Path, exp_id: str, root: Path) -> None:
    if _cli(home, "stop", exp_id, cwd=root).returncode != 0:  # never leave a background manager behind
        for proc in processes_under(root):
            proc.kill()


def test_the_detached_log_is_private_and_no_planted_file_is_followed(make_config, tmp_path: Path) -> None:  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    shared = tmp_path / "exps"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o1777)  # a shared working directory, as /tmp is
    exp_id = "detach01"
    victim = tmp_path / "planted-by-other"
    victim.write_text("")
    (shared / f"{exp_id}.log").symlink_to(victim)  # where the log went before, planted by another user
    if os.getuid() == 0:
        os.chown(victim, NOBODY, NOBODY)
        os.lchown(shared / f"{exp_id}.log", NOBODY, NOBODY)
    config = make_config(experimentWorkingDirectory=str(shared), maxTrialNumber=1, trialConcurrency=1)
    started = _cli(home, "run", str(config), "--detach", "--port", "0", "--experiment-id", exp_id, cwd=tmp_path)
    try:
        assert started.returncode == 0, started.stderr
        log = Path(re.search(r"^output: (\S+)$", started.stdout, re.M).group(1))
        assert log.parent == shared / exp_id, log
        assert "WebUI: " in log.read_text()
        assert stat.S_IMODE(os.stat(log.parent).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(log).st_mode) == 0o600
        assert victim.read_text() == "", "the log went into a file another user planted"
    finally:
        _stop(home, exp_id, tmp_path)


@pytest.mark.skipif(os.getuid() != 0, reason="needs to make a directory owned by another uid")
def test_an_experiment_directory_someone_else_made_is_refused_in_one_line(make_config, tmp_path: Path) -> None:  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    shared = tmp_path / "exps"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    planted = shared / "detach02"
    planted.mkdir(mode=0o777)
    os.chown(planted, NOBODY, NOBODY)
    config = make_config(experimentWorkingDirectory=str(shared), maxTrialNumber=1, trialConcurrency=1)
    started = _cli(home, "run", str(config), "--detach", "--port", "0", "--experiment-id", "detach02", cwd=tmp_path)
    try:
        assert started.returncode != 0
        lines = started.stderr.strip().splitlines()
        assert len(lines) == 1 and "not a directory of yours" in lines[0], started.stderr
        assert not list(planted.iterdir())
    finally:
        _stop(home, "detach02", tmp_path)
