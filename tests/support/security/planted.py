"""Another real user of a shared place, and the code it plants there (tests/security/test_shipped_code.py).

`other_user` is a second local account (useradd, as root; its commands run with setpriv). What it
plants is a real wheel whose modules, when anything imports them, write a marker file and stop:
the tests assert the marker never appears, so "nothing planted runs" is a fact about processes,
not about log lines.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PLANTED_MODULE = '''import os
open(%r, "w").write("planted code ran as uid %%d" %% os.getuid())
raise ImportError("planted")
'''


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int

    def run(self, script: str, *args: str) -> None:
        """Python `script` as this user (the stock Python, a clean environment)."""
        done = subprocess.run(["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                               "/usr/bin/python3", "-c", script, *args], capture_output=True, text=True, cwd="/",
                              env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout=120)
        assert done.returncode == 0, done.stderr


def _users_tool(*argv: str) -> subprocess.CompletedProcess[str]:
    """useradd / userdel, retried while another test holds /etc/passwd's lock."""
    for _ in range(50):
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
        if done.returncode != 10 and "lock" not in done.stderr:  # 10: cannot lock the password file
            return done
        time.sleep(0.2)
    return done


@pytest.fixture(scope="module")
def other_user() -> Iterator[OtherUser]:
    if os.geteuid() != 0:
        pytest.skip("a second local user can be created only as root")
    if not (shutil.which("useradd") and shutil.which("userdel") and shutil.which("setpriv")
            and os.path.exists("/usr/bin/python3")):
        pytest.skip("useradd, userdel, setpriv and /usr/bin/python3 are needed for a second local user")
    name = f"nniplant{os.getpid() % 10_000_000}"
    made = _users_tool("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name)
    assert made.returncode == 0, made.stderr
    entry = pwd.getpwnam(name)
    try:
        yield OtherUser(name, entry.pw_uid, entry.pw_gid)
    finally:
        _users_tool("userdel", name)


def planted_wheel(path: Path, marker: Path, modules: tuple[str, ...] = ("google", "grpc", "psutil", "nni_agent")
                  ) -> Path:
    """A wheel at `path` whose every module in `modules` writes `marker` when imported."""
    with zipfile.ZipFile(path, "w") as zf:
        for m in modules:
            zf.writestr(f"{m}/__init__.py", PLANTED_MODULE % str(marker))
        zf.writestr("nni_agent/__main__.py", PLANTED_MODULE % str(marker))
    return path


@pytest.fixture
def shared_dir() -> Iterator[Callable[[str], Path]]:
    """Makes directories every local user may write (a group's shared working directory), outside
    any 0700 parent (pytest's tmp_path is one), and removes them after the test."""
    import tempfile

    made: list[Path] = []

    def make(prefix: str) -> Path:
        d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        made.append(d)
        d.chmod(0o777)
        return d

    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)
