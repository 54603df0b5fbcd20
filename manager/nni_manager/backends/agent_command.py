"""The agent's command line, built one way for every backend.

Every platform starts the agent through the same boot step, nni_agent/boot.py: it finds nothing
itself but checks the Python version and the dependencies' versions, verifies every shipped file
against the sha256 this command line carries, puts the agent (and shipped dependencies) on the
agent's own path (never the trials') and execs the agent, and turns every failure into one line
that becomes the trial's or the environment's message. `AgentCommand` holds the agent's own
arguments (`nni-agent --help`) and the boot step's, and renders them as a process's argv
(`argv`) or as POSIX sh (`shell`: finds the interpreter as NNI does, `pythonPath`'s python3 or
python, else PATH's python3, else python). Values are literals, quoted here; an `Sh` value is a
shell word the backend wrote (a variable the job's own shell expands) and goes in verbatim.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import nni_agent.boot

BOOT_FILE = Path(nni_agent.boot.__file__)


# What a dry run shows for a digest not computed yet (the wheel is built at start): 64 characters,
# as the boot step's --sha256 takes, and nothing shaped like a secret
DRY_RUN_SHA256 = "<sha256, computed at start>".ljust(64, ".")


class Sh(str):
    """A shell word written by a backend (e.g. `"$NNI_AGENT_DIR/token"`), used verbatim in `shell()`.
    Never built from a config value."""


@lru_cache(maxsize=1)
def boot_source() -> str:
    """boot.py's text (a ConfigMap carries it as a file)."""
    return BOOT_FILE.read_text()


@lru_cache(maxsize=1)
def inline_source() -> str:
    """boot.py without its module docstring, for platforms where it travels inline (`python -c`)."""
    text = boot_source()
    if text.startswith('"""'):
        text = text[text.index('"""', 3) + 3:].lstrip("\n")
    return text


def _word(value: str) -> str:
    return value if isinstance(value, Sh) else shlex.quote(value)


@dataclass(frozen=True)
class AgentCommand:
    """One agent's command line: the agent's arguments and its boot step's."""

    agent_id: str
    manager: str = ""  # --manager HOST:PORT or unix:PATH
    manager_file: str = ""  # --manager-file: the address, re-read before every redial
    token_file: str = ""  # empty: the token comes in NNI_AGENT_TOKEN
    relay_token_file: str = ""  # --relay-token-file: the hub is behind a relay that wants the relay token
    work_dir: str = ""
    orphan_timeout: float = 0.0
    ca_file: str = ""  # --ca-file: TLS, trusting only this CA
    tls: bool = False  # --tls (ca_file implies it; remote says both)
    single_trial: bool = False
    log_file: str = ""
    remove_at_exit: str = ""  # --remove-at-exit: the job's private directory (mktemp -d), gone with the agent
    # the boot step (nni_agent/boot.py)
    python: str = ""  # the interpreter (a path, or a name on PATH); empty: found as `python_dir` says
    python_dir: str = ""  # pythonPath as a directory: its python3, else its python; empty: PATH's
    paths: tuple[str, ...] = field(default=())  # put first on the agent's path (agent lib, deps, wheel)
    wheel: str = ""  # unpack this wheel ...
    unpack_to: str = ""  # ... here, once, and put it on the path
    parts: tuple[str, ...] = field(default=())  # dirs of shipped dependency wheels in pieces ...
    deps_to: str = ""  # ... joined and unpacked here, once, and put on the path
    # (file name or `cp311/<file name>`, sha256) of every shipped file: the boot step runs none
    # whose digest differs (see agent_deps.digests)
    sha256: tuple[tuple[str, str], ...] = field(default=())
    where: str = ""  # whose Python, for the failure line: "the image python:3.8", "the compute node"

    def __post_init__(self) -> None:  # one line, whatever a config's image name holds
        object.__setattr__(self, "where", " ".join(self.where.split()))
    message_file: str = ""  # also write a failure line here (a pod's /dev/termination-log)
    agent_id_env: str = ""  # "{agent}" in the agent's arguments becomes this variable's value

    def agent_args(self) -> list[str]:
        """The arguments `nni_agent.cli.parse_args` reads."""
        args = ["--manager-file", self.manager_file] if self.manager_file else ["--manager", self.manager]
        args += ["--agent-id", self.agent_id]
        if self.token_file:
            args += ["--token-file", self.token_file]
        if self.relay_token_file:
            args += ["--relay-token-file", self.relay_token_file]
        if self.work_dir:
            args += ["--work-dir", self.work_dir]
        if self.tls:
            args.append("--tls")
        if self.ca_file:
            args += ["--ca-file", self.ca_file]
        args += ["--orphan-timeout", f"{self.orphan_timeout:g}"]
        if self.single_trial:
            args.append("--single-trial")
        if self.log_file:
            args += ["--log-file", self.log_file]
        if self.remove_at_exit:
            args += ["--remove-at-exit", self.remove_at_exit]
        return args

    def boot_args(self) -> list[str]:
        """The boot step's options (boot.py `Boot`), before `--`."""
        args: list[str] = []
        for p in self.paths:
            args += ["--path", p]
        if self.wheel and self.unpack_to:
            args += ["--wheel", self.wheel, "--unpack-to", self.unpack_to]
        if self.parts and self.deps_to:
            for p in self.parts:
                args += ["--parts", p]
            args += ["--deps-to", self.deps_to]
        for name, digest in self.sha256:
            args += ["--sha256", f"{name}={digest}"]
        if self.where:
            args += ["--where", self.where]
        if self.message_file:
            args += ["--message-file", self.message_file]
        if self.agent_id_env:
            args += ["--agent-id-env", self.agent_id_env]
        return args

    def argv(self, python: str, boot_file: str | Path = BOOT_FILE) -> list[str]:
        """A process's argv: `python boot.py <boot options> -- <agent arguments>`."""
        return [python, boot_file if isinstance(boot_file, str) else str(boot_file), *self.boot_args(), "--",
                *self.agent_args()]

    def line(self, python: str, boot_file: str) -> str:
        """`argv` as one line of sh, for a boot file already on the worker."""
        return " ".join(_word(w) for w in self.argv(python, boot_file))

    def candidates(self) -> list[str]:
        if self.python:
            return [self.python]
        if self.python_dir:
            d = self.python_dir.rstrip("/") or "/"
            return [f"{d}/python3", f"{d}/python"]
        return ["python3", "python"]

    def find_python(self) -> str:
        """sh that sets PY to the first candidate found, or says in one line that none is (exit 127)."""
        cands = self.candidates()
        words = " ".join(_word(c) for c in cands)
        said = (f"{self.where or 'this machine'} has no {' or '.join(cands)}"
                + (" (pythonPath)" if self.python or self.python_dir else " on PATH"))
        line = shlex.quote(f"nni-agent: {said}: the agent needs Python >= {'%d.%d' % nni_agent.boot.MIN_PYTHON}")
        tell = f"echo {line} | tee {shlex.quote(self.message_file)} >&2" if self.message_file else f"echo {line} >&2"
        return (f'PY=; for c in {words}; do if command -v "$c" >/dev/null 2>&1; then PY=$(command -v "$c"); '
                f'break; fi; done; [ -n "$PY" ] || {{ {tell}; exit 127; }}')

    def shell_lines(self, boot_file: str | None = None, agent_args: str | None = None) -> list[str]:
        """POSIX sh (safe under `set -eu`): find Python, then `exec` the boot step: `boot_file` (a path
        on the worker), else boot.py inline. `agent_args`: a shell word standing for the agent's
        arguments (e.g. '"$@"'), else they are written out. Two commands (the second spans lines
        when boot.py travels inline)."""
        boot = _word(boot_file) if boot_file else "-c " + shlex.quote(inline_source())
        rest = agent_args if agent_args is not None else " ".join(_word(a) for a in self.agent_args())
        opts = " ".join(_word(a) for a in self.boot_args())
        return [self.find_python(), f'exec "$PY" {boot} {opts}{" " if opts else ""}-- {rest}']

    def shell(self, boot_file: str | None = None, agent_args: str | None = None) -> str:
        """`shell_lines` as one script."""
        return "\n".join(self.shell_lines(boot_file, agent_args))
