"""What a job's agent leaves behind: nothing. The REST platforms' boot line makes a private 0700
directory (the token, the CA, the work directory, the unpacked agent) in the job's TMPDIR, which
may be a scratch disk that outlives the job; the agent removes it when it exits. A directory
that is not this user's private one is never removed (--remove-at-exit names a path, and a typo'd
or shared path must not cost anyone their files)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from nni_manager.backends.rest_jobs import agent_boot


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_boot_line_s_private_directory_goes_with_the_agent(tmp_path: Path) -> None:
    """The whole boot line under sh, with the job's TMPDIR a scratch directory: the agent finds no
    manager, gives up after its orphan timeout (exit 3) and leaves the scratch directory as it was."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    lines = agent_boot(hub_address=f"127.0.0.1:{_closed_port()}", agent_id="a",
                       token_lines=['printf "%s" tok > "$NNI_AGENT_DIR/token"'], tls=False, ca_lines=[],
                       orphan_timeout=1, single_trial=True, env={}, image="img")
    script = "set -eu\n" + "\n".join(lines) + "\n"
    assert "--remove-at-exit" in lines[-1]
    env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "TMPDIR": str(scratch), "HOME": str(tmp_path)}
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 3, (out.returncode, out.stderr[-2000:])
    assert "unreachable" in out.stderr or "orphan" in out.stderr, out.stderr[-2000:]
    assert list(scratch.iterdir()) == []


def _agent(port: int, tmp_path: Path, remove: Path, work: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nni_agent", "--manager", f"127.0.0.1:{port}", "--agent-id", "a",
                           "--token-file", str(tmp_path / "token"), "--work-dir", str(work),
                           "--orphan-timeout", "0.5", "--remove-at-exit", str(remove)],
                          capture_output=True, text=True, timeout=120)


def test_only_the_agent_s_own_job_directory_is_removed(tmp_path: Path) -> None:
    """--remove-at-exit removes only this user's 0700 `nni-agent.*` directory holding the agent's
    --work-dir: one others may read (0755) or a link is left; a directory of another name (a home,
    also 0700) or one that does not hold --work-dir is refused at start in one line."""
    port = _closed_port()
    (tmp_path / "token").write_text("tok")
    job = tmp_path / "nni-agent.abc123"
    job.mkdir(mode=0o700)
    shared = tmp_path / "nni-agent.shared"
    shared.mkdir()
    shared.chmod(0o755)
    link = tmp_path / "nni-agent.link"
    link.symlink_to(job)
    for where in (shared, link):
        out = _agent(port, tmp_path, where, where / "work")
        assert out.returncode == 3, out.stderr[-2000:]
    assert (shared / "work").is_dir() and link.is_symlink() and (job / "work").is_dir()
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    for where, work in ((home, home / "work"), (job, tmp_path / "elsewhere")):
        out = _agent(port, tmp_path, where, work)
        assert out.returncode == 1 and out.stderr.strip().splitlines() == [
            f"nni-agent: --remove-at-exit {where} must be the agent's own nni-agent.XXXXXX directory (mktemp -d) "
            f"holding --work-dir {work}: nothing else is removed"], out.stderr
    assert home.is_dir() and job.is_dir()
    out = _agent(port, tmp_path, job, job / "work")
    assert out.returncode == 3, out.stderr[-2000:]
    assert not job.exists()


def test_a_failed_boot_removes_the_private_directory_too(tmp_path: Path) -> None:
    """The boot step fails in one line (here: the shipped wheel is missing) before any agent runs:
    it removes the directory the agent would have, so a failed start leaves no token behind."""
    import nni_agent.boot as boot

    private = tmp_path / "nni-agent.xyz789"
    private.mkdir(mode=0o700)
    (private / "token").write_text("tok")
    wheel = "nni_agent-0-py3-none-any.whl"
    out = subprocess.run([sys.executable, boot.__file__, "--wheel", str(tmp_path / wheel), "--unpack-to",
                          str(private / "agent"), "--sha256", f"{wheel}={'0' * 64}", "--", "--agent-id", "a",
                          "--remove-at-exit", str(private)], capture_output=True, text=True, timeout=60)
    assert out.returncode == boot.FAILED and out.stderr.startswith(f"nni-agent: the shipped file {wheel} is missing")
    assert not private.exists()


def test_a_job_without_python_leaves_nothing_either(tmp_path: Path) -> None:
    """The boot line's shell finds no Python (exit 127, one line): its private directory, token
    already written, goes with the shell."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    lines = agent_boot(hub_address="127.0.0.1:1", agent_id="a", token_lines=['printf "%s" tok > "$NNI_AGENT_DIR/token"'],
                       tls=False, ca_lines=[], orphan_timeout=1, single_trial=True, env={}, image="img")
    empty = tmp_path / "bin"
    empty.mkdir()
    for tool in ("mktemp", "rm"):  # what the line needs besides Python
        (empty / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                 text=True).stdout.strip())
    out = subprocess.run(["/bin/sh", "-c", "set -eu\n" + "\n".join(lines) + "\n"], capture_output=True, text=True,
                         env={"PATH": str(empty), "TMPDIR": str(scratch)}, timeout=60)
    assert out.returncode == 127 and "has no python3 or python on PATH" in out.stderr, out.stderr
    assert list(scratch.iterdir()) == []
