"""Build an agent-only wheel from the `nni_agent` package this manager runs.

Workers get exactly the agent code the manager speaks with, without a package index and
without the manager's own dependencies. The wheel is pure Python, so installing it is
unpacking it; `tag` (version + content hash) names the per-user install directory, so a
changed agent is never mistaken for an installed one of the same version.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import zipfile
from dataclasses import dataclass
from pathlib import Path

import nni_agent
from nni_agent.boot import REQUIREMENTS
from nni_agent.compat import MIN_PYTHON_TEXT

_DIST = "nni_agent"
# The agent's dependencies by the module each one provides (checked on workers before start):
# from the boot step's table, the one place they are written.
AGENT_MODULES = {module: dist for dist, module, _low, _below, _required in REQUIREMENTS}
_SUFFIXES = (".py", ".pyi", ".typed")


@dataclass(frozen=True)
class AgentWheel:
    path: Path
    version: str
    tag: str  # "<version>-<12 hex of the content hash>"
    requirements: tuple[str, ...]  # the agent's runtime requirements (no extras)


def _package_files() -> list[tuple[str, bytes]]:
    root = Path(nni_agent.__file__).resolve().parent
    return [
        (f"nni_agent/{p.relative_to(root).as_posix()}", p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in _SUFFIXES and "__pycache__" not in p.parts
    ]


def agent_requirements() -> tuple[str, ...]:
    """The agent's own requirements from the installed distribution (extras dropped)."""
    reqs = importlib.metadata.requires("nni-agent") or []
    return tuple(r for r in reqs if "extra ==" not in r)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_agent_wheel(dest_dir: Path) -> AgentWheel:
    """Write the wheel into `dest_dir` (reused when an identical one is already there)."""
    version = nni_agent.__version__
    files = _package_files()
    content = hashlib.sha256()
    for name, data in files:
        content.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    tag = f"{version}-{content.hexdigest()[:12]}"
    requirements = agent_requirements()
    path = dest_dir / f"{_DIST}-{version}-py3-none-any.whl"
    tag_file = dest_dir / f"{_DIST}-{version}.tag"
    if path.exists() and tag_file.exists() and tag_file.read_text() == tag:
        return AgentWheel(path, version, tag, requirements)

    info = f"{_DIST}-{version}.dist-info"
    meta = "\n".join(
        ["Metadata-Version: 2.1", "Name: nni-agent", f"Version: {version}", f"Requires-Python: >={MIN_PYTHON_TEXT}"]
        + [f"Requires-Dist: {r}" for r in requirements]
    ) + "\n"
    extra = [
        (f"{info}/METADATA", meta.encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: nni-manager\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{info}/entry_points.txt", b"[console_scripts]\nnni-agent = nni_agent.cli:main\n"),
        (f"{info}/top_level.txt", b"nni_agent\n"),
    ]
    entries = files + extra
    record = "\n".join([_record_line(n, d) for n, d in entries] + [f"{info}/RECORD,,"]) + "\n"
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries + [(f"{info}/RECORD", record.encode())]:
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    tmp.replace(path)
    tag_file.write_text(tag)
    return AgentWheel(path, version, tag, requirements)
