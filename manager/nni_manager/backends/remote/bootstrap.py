"""Bootstrap one worker over SSH: find Python, install the agent, start and stop it.

Layout on the worker (all under the SSH user's home, umask 077, never /tmp):
  ~/.nni-agent/<version>-<hash>/lib          the agent, unpacked from the manager's wheel
  ~/.nni-agent/<version>-<hash>/deps-<py>    agent dependencies pip had to add (if any)
  ~/.nni-agent/run/<exp>/<agent>.{token,ca.crt,pid,manager,log,out}
      (.manager holds 127.0.0.1:<tunnel port>; the agent re-reads it before every redial, so
      a new tunnel port needs only a rewrite of that file, never a restart of the trials;
      .ca.crt is the experiment's CA: the agent speaks TLS through the tunnel and trusts only
      a hub with a certificate from it, so a local user who binds the tunnel port while the
      link is down gets neither its token nor its obedience)
  ~/nni-experiments/<exp>/agents/<agent>     the agent's work dir (trials, bundles, spool)
The fast path (agent installed, Python known good) is one probe command and one start.
"""
from __future__ import annotations

import io
import json
import logging
import re
import secrets
import shlex
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import paramiko

from nni_agent.compat import MIN_PYTHON, MIN_PYTHON_TEXT
from nni_manager.backends import agent_deps
from nni_manager.backends.agent_command import AgentCommand, Sh
from nni_manager.backends.agent_wheel import AGENT_MODULES, AgentWheel
from nni_manager.backends.base import BackendError
from nni_manager.ssh.commands import EXEC_TIMEOUT, home_path, run

log = logging.getLogger(__name__)
RUN_MARKER_ENV = "NNI_AGENT_REMOTE_RUN"
# import name -> distribution name, for the agent's requirements
MODULES = AGENT_MODULES


class BootstrapError(BackendError):
    """The agent cannot be installed or started on a machine; the message is for the user."""


@dataclass(frozen=True)
class AgentLaunch:
    """Everything that names one agent's process and files on its worker."""

    experiment_id: str
    agent_id: str
    tag: str  # install dir name
    python: str  # interpreter to run (as it reports sys.executable)
    python_version: str
    python_dir: str | None  # the machine's pythonPath, put in front of PATH like NNI does
    remote_port: int
    orphan_timeout: float
    env: dict[str, str] = field(default_factory=dict)

    @property
    def run_dir(self) -> str:
        return f".nni-agent/run/{self.experiment_id}"

    def run_file(self, suffix: str) -> str:
        return f"{self.run_dir}/{self.agent_id}.{suffix}"

    @property
    def work_dir(self) -> str:
        return f"nni-experiments/{self.experiment_id}/agents/{self.agent_id}"

    @property
    def marker(self) -> str:
        return f"{self.experiment_id}/{self.agent_id}"


def _script(name: str) -> bytes:
    return resources.files("nni_manager.backends.remote").joinpath(name).read_bytes()


# ------------------------------------------------------------------------------ probe

@dataclass
class Probe:
    home: str
    python: str | None = None
    python_version: str = ""
    installed_for: list[str] = field(default_factory=list)  # pythons the install was checked with
    running_pid: int | None = None  # an agent of this id already running (manager restart)
    running_port: int | None = None
    running_verifies_hub: bool = False  # it was started with --ca-file (older managers started agents without)
    rejected: list[str] = field(default_factory=list)

    @property
    def installed(self) -> bool:
        return self.python is not None and self.python in self.installed_for


def candidates(python_dir: str | None) -> list[str]:
    """NNI's order: pythonPath's python3/python when set (only those), else PATH's."""
    if python_dir:
        return [f"{python_dir.rstrip('/')}/python3", f"{python_dir.rstrip('/')}/python"]
    return ["python3", "python"]


def probe_command(python_dir: str | None, tag: str, launch_files: AgentLaunch | None) -> str:
    version = "import sys; sys.stdout.write('%d.%d.%d %s\\n' % (sys.version_info[:3] + (sys.executable,)))"
    lines = ['echo "HOME	$HOME"']
    for c in candidates(python_dir):
        q = shlex.quote(c)
        found = f"[ -x {q} ] && [ -f {q} ]" if "/" in c else f"command -v {q} >/dev/null 2>&1"
        lines.append(  # the candidate is printed as an argument, never expanded inside a string
            f"if {found}; then printf 'PY\\t%s\\t%s\\n' {q} \"$({q} -c {shlex.quote(version)} 2>&1 | head -c 300 "
            f"| tr '\\n\\t' '  ')\"; else printf 'PY\\t%s\\t(not found)\\n' {q}; fi"
        )
    lines.append(f"cat {home_path(f'.nni-agent/{tag}/pythons')} 2>/dev/null | sed 's/^/INSTALLED	/'")
    if launch_files is not None:
        pid, where = home_path(launch_files.run_file("pid")), home_path(launch_files.run_file("manager"))
        lines.append(
            f"p=$(cat {pid} 2>/dev/null) && [ -n \"$p\" ] && grep -q nni_agent /proc/$p/cmdline 2>/dev/null "
            f"&& echo \"RUNNING	$p	$(cat {where} 2>/dev/null)	"
            f"$(tr '\\0' ' ' </proc/$p/cmdline | grep -q -e --ca-file && echo verifies)\""
        )
    lines.append("true")
    return "\n".join(lines)


def parse_probe(text: str) -> Probe:
    probe = Probe(home="")
    for line in text.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "HOME":
            probe.home = rest
        elif kind == "INSTALLED":
            probe.installed_for.append(rest)
        elif kind == "RUNNING":
            pid, _, rest = rest.partition("\t")
            where, _, verifies = rest.partition("\t")  # where: 127.0.0.1:<port>
            port = where.strip().rpartition(":")[2]
            probe.running_pid, probe.running_port = int(pid), int(port) if port.isdigit() else None
            probe.running_verifies_hub = verifies.strip() == "verifies"
        elif kind == "PY" and probe.python is None:
            cand, _, answer = rest.partition("\t")
            m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+) (\S.*)", answer.strip())
            if m is None:
                probe.rejected.append(f"{cand}: {answer.strip() or 'no output'}")
            elif (int(m[1]), int(m[2])) < MIN_PYTHON:
                probe.rejected.append(f"{cand}: Python {m[1]}.{m[2]}.{m[3]} is older than {MIN_PYTHON_TEXT}")
            else:
                probe.python, probe.python_version = m[4].strip(), f"{m[1]}.{m[2]}"
    return probe


def probe(client: paramiko.SSHClient, python_dir: str | None, tag: str, launch_files: AgentLaunch | None) -> Probe:
    rc, out, err = run(client, probe_command(python_dir, tag, launch_files))
    result = parse_probe(out)
    if rc != 0 or not result.home:
        raise BootstrapError(f"probing the worker failed (exit {rc}): {err.strip()[-300:]}")
    if result.python is None:
        where = f"pythonPath {python_dir}" if python_dir else "PATH (set pythonPath to choose another Python)"
        raise BootstrapError(
            f"no Python >= {MIN_PYTHON_TEXT} found in {where}; tried: {'; '.join(result.rejected)}"
        )
    return result


# ------------------------------------------------------------------------------ install

def install(client: paramiko.SSHClient, found: Probe, wheel: AgentWheel, wheelhouse: Path | None = None,
            where: str = "") -> None:
    """Upload the wheel by SFTP, unpack it, check the dependencies; add missing ones with the
    worker's pip, else ship wheels the manager resolves for the worker's Python (agent_deps)."""
    target = f"{found.home}/.nni-agent/{wheel.tag}"
    rc, _, err = run(client, f"umask 077 && mkdir -p {home_path(f'.nni-agent/{wheel.tag}')}")
    if rc != 0:
        raise BootstrapError(f"cannot create {target}: {err.strip()[-300:]}")
    remote_wheel = f"{target}/.upload-{secrets.token_hex(4)}-{wheel.path.name}"  # homes may be shared
    try:
        with client.open_sftp() as sftp:
            sftp.put(str(wheel.path), remote_wheel)
    except (OSError, paramiko.SSHException) as e:
        raise BootstrapError(f"uploading the agent wheel to {remote_wheel} failed: {e}") from None
    reqs = _requirements_by_module(wheel)
    result = _worker_install(client, found, target, reqs, remote_wheel)
    shipped = ""
    if not result["ok"] and "python" not in result["missing"]:
        try:
            shipped = ship_dependencies(client, found, target, reqs, result, wheelhouse, where)
        except agent_deps.DependencyError as e:
            shipped = f" (and the manager has no wheels for it: {e})"
        else:
            result = _worker_install(client, found, target, reqs, "-", f"{target}/{shipped}")
            shipped = " (even with the dependencies the manager shipped)"
    if not result["ok"]:
        missing = "; ".join(e if m == "versions" else f"{m} ({e})" for m, e in result["missing"].items())
        pip = f"; `pip install` could not add them: {result['pip_error']}" if result["pip_error"] else ""
        wanted = " ".join(shlex.quote(r) for r in sorted(set(reqs.values())))
        what = ("has versions of the agent's dependencies it does not support" if "versions" in result["missing"]
                else "cannot import the agent's dependencies")
        raise BootstrapError(
            f"{found.python} {what}: {missing}{pip}{shipped}. Fix: install them for "
            f"that Python (`{found.python} -m pip install --user {wanted}`), or point pythonPath at a Python "
            f"that has them"
        )


def _worker_install(client: paramiko.SSHClient, found: Probe, target: str, reqs: dict[str, str], remote_wheel: str,
                    shipped_dir: str = "") -> dict[str, Any]:
    command = (f"umask 077 && cd && {shlex.quote(found.python or 'python3')} - {shlex.quote(remote_wheel)} "
               f"{shlex.quote(target)} {shlex.quote(json.dumps(reqs))}"
               + (f" {shlex.quote(shipped_dir)}" if shipped_dir else ""))
    rc, out, err = run(client, command, stdin=_script("worker_install.py"))
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BootstrapError(f"installing the agent into {target} failed (exit {rc}): {err.strip()[-500:]}") from None
    return result


def worker_python(report: dict[str, Any]) -> agent_deps.WorkerPython:
    """The worker's Python as worker_install.py reports it (version, machine, C library)."""
    m = re.fullmatch(r"glibc (\d+)\.(\d+).*", str(report.get("libc", "")))
    major, minor = report["python"]
    return agent_deps.WorkerPython((int(major), int(minor)), str(report["machine"]),
                                   (int(m[1]), int(m[2])) if m else None)


def ship_dependencies(client: paramiko.SSHClient, found: Probe, target: str, reqs: dict[str, str],
                      report: dict[str, Any], wheelhouse: Path | None, where: str = "") -> str:
    """Resolve wheels for the worker's Python and upload them by SFTP into a fresh directory
    under `target`; returns its name (worker_install.py unpacks it into deps-<pyver>). No wheels:
    DependencyError, said on the console (`where`: the machine's Python)."""
    wheels = agent_deps.resolve(worker_python(report), wheelhouse, requirements=sorted(set(reqs.values())),
                                where=where or f"{found.python}")
    name = f".wheels-{secrets.token_hex(4)}"
    try:
        with client.open_sftp() as sftp:
            sftp.mkdir(f"{target}/{name}", 0o700)
            for f in wheels.files:
                sftp.put(str(f), f"{target}/{name}/{f.name}")
    except (OSError, paramiko.SSHException) as e:
        raise BootstrapError(f"uploading the agent's dependencies to {target}/{name} failed: {e}") from None
    log.info("shipped %d wheels (%d bytes) of the agent's dependencies to %s for %s", len(wheels.files),
             wheels.size, target, worker_python(report).key)
    return name


def _requirements_by_module(wheel: AgentWheel) -> dict[str, str]:
    by_dist = {re.split(r"[<>=!~; ]", r, maxsplit=1)[0].lower(): r.split(";")[0].strip() for r in wheel.requirements}
    return {mod: by_dist.get(dist, dist) for mod, dist in MODULES.items()}


# ------------------------------------------------------------------------------ start / stop

def start_command(launch: AgentLaunch) -> str:
    """Shell that stores the token read from stdin (0600) and starts the agent detached, through
    the boot step (the version checks; the agent and its deps-<py> on the path)."""
    lib = f".nni-agent/{launch.tag}"
    env = {RUN_MARKER_ENV: launch.marker, **launch.env}
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    if launch.python_dir:
        assigns = f'PATH={shlex.quote(launch.python_dir)}:"$PATH" ' + assigns
    rf = launch.run_file
    command = AgentCommand(
        agent_id=launch.agent_id, manager_file=Sh(home_path(rf("manager"))), work_dir=Sh(home_path(launch.work_dir)),
        token_file=Sh(home_path(rf("token"))), tls=True, ca_file=Sh(home_path(rf("ca.crt"))),
        orphan_timeout=launch.orphan_timeout, log_file=Sh(home_path(rf("log"))),
        paths=(Sh(home_path(f"{lib}/lib")), Sh(home_path(f"{lib}/deps-{launch.python_version}"))),
        where="the worker")
    argv = command.line(launch.python, Sh(home_path(f"{lib}/lib/nni_agent/boot.py")))
    return "\n".join([
        "umask 077",
        f"mkdir -p {home_path(launch.run_dir)} {home_path(launch.work_dir)} || exit 1",
        f"cat > {home_path(rf('token'))} || exit 1",
        f"echo 127.0.0.1:{launch.remote_port} > {home_path(rf('manager'))}",
        f"cd {home_path(launch.work_dir)} || exit 1",
        f"{assigns} setsid {argv} </dev/null >>{home_path(rf('out'))} 2>&1 &",
        f"echo $! > {home_path(rf('pid'))}",
        "echo $!",
    ])


def point_agent(client: paramiko.SSHClient, launch: AgentLaunch) -> None:
    """Tell a running agent its tunnel moved to `launch.remote_port`: its next redial reads it."""
    where = home_path(launch.run_file("manager"))
    tmp = home_path(launch.run_file("manager.tmp"))
    rc, _, err = run(client, f"umask 077; echo 127.0.0.1:{launch.remote_port} > {tmp} && mv -f {tmp} {where}")
    if rc != 0:
        raise BootstrapError(f"cannot update the agent's manager address: {err.strip()[-300:]}")


def deliver_ca(client: paramiko.SSHClient, launch: AgentLaunch, ca_certificate: bytes) -> None:
    """Put the experiment's CA certificate (public) beside the token, by SFTP, atomically: the
    agent verifies the hub with it before it sends anything."""
    rc, _, err = run(client, f"umask 077 && mkdir -p {home_path(launch.run_dir)}")
    if rc != 0:
        raise BootstrapError(f"cannot create ~/{launch.run_dir}: {err.strip()[-300:]}")
    try:
        with client.open_sftp() as sftp:
            home = sftp.normalize(".")
            final = f"{home}/{launch.run_file('ca.crt')}"
            tmp = f"{final}.{secrets.token_hex(4)}.tmp"
            sftp.putfo(io.BytesIO(ca_certificate), tmp)
            sftp.posix_rename(tmp, final)
    except (OSError, paramiko.SSHException) as e:
        raise BootstrapError(f"uploading the experiment's CA certificate to ~/{launch.run_file('ca.crt')} "
                             f"failed: {e}") from None


def start_agent(client: paramiko.SSHClient, launch: AgentLaunch, token: str, ca_certificate: bytes) -> int:
    """Start the agent; it trusts only a hub whose certificate `ca_certificate` issued."""
    if not ca_certificate:
        raise BootstrapError("the hub has no TLS certificate: a remote agent must be able to verify the hub "
                             "before it sends its token (the loopback hub serves the experiment's CA)")
    deliver_ca(client, launch, ca_certificate)
    rc, out, err = run(client, start_command(launch), stdin=token.encode())
    if rc != 0 or not out.strip().isdigit():
        raise BootstrapError(f"starting the agent failed (exit {rc}): {err.strip()[-300:] or out.strip()[-300:]}")
    return int(out.strip())


def agent_alive(client: paramiko.SSHClient, launch: AgentLaunch, timeout: float = EXEC_TIMEOUT) -> tuple[bool, str]:
    """Whether the agent process runs; when not, the tail of its output for the error."""
    pid, out = home_path(launch.run_file("pid")), home_path(launch.run_file("out"))
    rc, text, _ = run(client, f"p=$(cat {pid}) && grep -q nni_agent /proc/$p/cmdline 2>/dev/null && echo ALIVE "
                              f"|| tail -c 1500 {out} 2>/dev/null", timeout=timeout)
    return text.startswith("ALIVE"), text.strip()


def stop_agent(client: paramiko.SSHClient, launch: AgentLaunch, grace: float) -> dict[str, object]:
    """Terminate the agent and every process it started (trial outputs stay)."""
    command = (f"cd && {shlex.quote(launch.python)} - {shlex.quote(launch.marker)} {grace:g} "
               f"{home_path(launch.run_file('token'))}")
    rc, out, err = run(client, command, stdin=_script("worker_stop.py"), timeout=grace + 30)
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BootstrapError(f"stopping the agent failed (exit {rc}): {err.strip()[-300:]}") from None

