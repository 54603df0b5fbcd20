"""The agent's boot step (nni_agent/boot.py) under every Python 3 on this machine, and its table of
requirements held against pyproject.toml.

Too old a Python gets one line (3.6 and 3.7 must still parse the file); a Python without the
dependencies, or with versions outside the agent's ranges, gets one line naming each and the fix.
The versions are read from dist-info METADATA on the path, so fake distributions (a module plus a
METADATA with the Version) stand for old or new releases: nothing is downloaded.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import zipfile
from typing import Any
from pathlib import Path

import pytest

import nni_agent.boot as boot

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")
from nni_agent.compat import MIN_PYTHON

ROOT = Path(__file__).resolve().parent.parent
BOOT = ROOT / "agent" / "nni_agent" / "boot.py"


def _pythons() -> list[tuple[str, tuple[int, int]]]:
    found = {}
    for exe in sorted(glob.glob("/root/.pyenv/versions/*/bin/python3")) + ["/usr/bin/python3"]:
        if not os.access(exe, os.X_OK):
            continue
        out = subprocess.run([exe, "-c", "import sys; print('%d %d' % sys.version_info[:2])"],
                             capture_output=True, text=True)
        if out.returncode == 0:
            major, minor = map(int, out.stdout.split())
            if major == 3:
                found[exe] = (major, minor)
    if not found:  # this machine without pyenv: at least the test's own Python
        found[sys.executable] = tuple(sys.version_info[:2])
    return sorted(found.items(), key=lambda kv: kv[1])


PYTHONS = _pythons()
SUPPORTED = [(exe, v) for exe, v in PYTHONS if v >= MIN_PYTHON]


def _ids(items: list[tuple[str, tuple[int, int]]]) -> list[str]:
    return [f"{exe}({v[0]}.{v[1]})" for exe, v in items]


def fake_dist(site: Path, dist: str, module: str, version: str) -> None:
    """A distribution as the path shows it: the module, and dist-info METADATA with its Version."""
    pkg = site.joinpath(*module.split("."))
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")


def good_site(site: Path, **versions: str) -> Path:
    """Every required dependency at its lowest supported version, unless `versions` says otherwise."""
    for dist, module, low, _below, required in boot.REQUIREMENTS:
        v = versions.get(dist.replace("-", "_"), low if required else None)
        if v is not None:
            fake_dist(site, dist, module, v)
    return site


FAKE_AGENT = '''import json, os, sys
print("AGENT " + json.dumps({"argv": sys.argv[1:], "pythonpath": os.environ.get("PYTHONPATH", ""),
                             "file": __file__, "sys_path": sys.path}), flush=True)
'''


def fake_agent(where: Path) -> Path:
    """An `nni_agent` package whose `python -m nni_agent` prints what it was started with."""
    pkg = where / "nni_agent"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(FAKE_AGENT)
    return where


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_boot(python: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
             inline: bool = False) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONNOUSERSITE": "1", **(env or {})}
    head = [python, "-c", BOOT.read_text()] if inline else [python, str(BOOT)]
    return subprocess.run([*head, *args], capture_output=True, text=True, env=clean, cwd=cwd, timeout=60)


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == boot.FAILED, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nni-agent: "), out.stderr
    return lines[0]


# ----------------------------------------------------------------------------- one table

def test_requirements_are_the_ones_pyproject_declares() -> None:
    """boot.REQUIREMENTS is what the boot step checks; pyproject.toml is what pip installs."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {re.split(r"[<>=!~; ]", d, maxsplit=1)[0].lower(): d.replace(" ", "") for d in deps}
    table = {dist: boot.requirement(dist, low, below) for dist, _m, low, below, _r in boot.REQUIREMENTS}
    assert table == declared
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=%d.%d" % boot.MIN_PYTHON


def test_version_tuple_reads_release_numbers() -> None:
    assert boot.version_tuple("1.49.1") == (1, 49, 1)
    assert boot.version_tuple("1.60.0rc1") == (1, 60, 0)
    assert boot.version_tuple("5.29.0.post1") == (5, 29, 0)
    assert boot.version_tuple("12.535.133") > boot.version_tuple("12.535")


# ----------------------------------------------------------------------------- every Python 3 here

@pytest.mark.parametrize("python,version", [p for p in PYTHONS if p[1] < MIN_PYTHON] or
                         [pytest.param("", (0, 0), marks=pytest.mark.skip(reason="no Python older than "
                                                                                  "the minimum on this machine"))],
                         ids=_ids([p for p in PYTHONS if p[1] < MIN_PYTHON]) or None)
def test_too_old_python_gets_one_line(python: str, version: tuple[int, int], tmp_path: Path) -> None:
    for inline in (False, True):
        line = one_line(run_boot(python, "--where", "the image python:3.7", "--message-file",
                                 str(tmp_path / "msg"), "--", "--agent-id", "a", inline=inline))
        assert re.fullmatch(rf"nni-agent: Python {version[0]}\.{version[1]}\.\d+ \({re.escape(python)}\) of the "
                            rf"image python:3\.7 is older than 3\.8, .*", line), line
        assert (tmp_path / "msg").read_text() == line  # e.g. a pod's termination message


@pytest.mark.parametrize("python,version", SUPPORTED, ids=_ids(SUPPORTED))
def test_python_without_the_dependencies_gets_one_line_with_the_fix(python: str, version: tuple[int, int],
                                                                    tmp_path: Path) -> None:
    line = one_line(run_boot(python, "--where", "the compute node", "--", "--agent-id", "a", cwd=tmp_path))
    assert "of the compute node cannot run the agent: grpcio is missing; protobuf is missing; psutil is missing; " \
           "the nni-agent package is missing" in line, line
    assert line.endswith(f"fix: {python} -m pip install 'grpcio>=1.49.1,<2' 'protobuf>=4.25.1,<8' "
                         "'psutil>=5.9.4,<8'"), line
    assert "nvidia-ml-py" not in line  # optional: GPUs are reported absent without it


@pytest.mark.parametrize("python,version", SUPPORTED, ids=_ids(SUPPORTED))
def test_dependency_versions_outside_the_range_get_one_line(python: str, version: tuple[int, int],
                                                            tmp_path: Path) -> None:
    site = good_site(tmp_path / "site", grpcio="1.30.0", protobuf="8.0.0", nvidia_ml_py="11.450.51")
    fake_agent(tmp_path / "agent")
    line = one_line(run_boot(python, "--path", str(site), "--path", str(tmp_path / "agent"), "--",
                             "--agent-id", "a", cwd=tmp_path))
    assert "cannot run the agent: grpcio 1.30.0 is older than 1.49.1; protobuf 8.0.0 is newer than the agent " \
           "supports (below 8); nvidia-ml-py 11.450.51 is older than 12.535; fix: " in line, line
    assert "'grpcio>=1.49.1,<2' 'protobuf>=4.25.1,<8' 'nvidia-ml-py>=12.535'" in line
    assert "psutil" not in line


@pytest.mark.parametrize("python,version", SUPPORTED, ids=_ids(SUPPORTED))
def test_good_python_execs_the_agent_with_its_path(python: str, version: tuple[int, int], tmp_path: Path) -> None:
    """Versions in range: the agent (here one that prints its start) runs with the boot's paths first
    on its own sys.path, PYTHONPATH left as the worker had it (its trials inherit that), and its
    arguments untouched."""
    site = good_site(tmp_path / "site", grpcio="1.70.0", protobuf="5.29.0")
    agent = fake_agent(tmp_path / "agent")
    for inline in (False, True):
        out = run_boot(python, "--path", str(agent), "--path", str(site), "--path", str(tmp_path / "absent"), "--",
                       "--agent-id", "a b", "--work-dir", "{agent}", cwd=tmp_path, inline=inline,
                       env={"PYTHONPATH": "/the/worker's"})
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout.split("AGENT ", 1)[1])
        assert seen["argv"] == ["--agent-id", "a b", "--work-dir", "{agent}"]
        assert seen["pythonpath"] == "/the/worker's"  # the trials' environment: the worker's own
        first = [p for p in seen["sys_path"] if p not in ("", str(tmp_path))][:2]
        assert first == [str(agent), str(site)]  # a missing dir (deps not shipped) is skipped
        assert seen["file"] == str(agent / "nni_agent" / "__main__.py")


@pytest.mark.parametrize("python,version", SUPPORTED[:1] + SUPPORTED[-1:], ids=_ids(SUPPORTED[:1] + SUPPORTED[-1:]))
def test_wheel_unpacked_once_and_agent_id_from_the_environment(python: str, version: tuple[int, int],
                                                               tmp_path: Path) -> None:
    """The Kubernetes form: the wheel from a ConfigMap unpacked into scratch, "{agent}" = the pod's name."""
    site = good_site(tmp_path / "site")
    wheel = tmp_path / "nni_agent-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("nni_agent/__init__.py", "")
        zf.writestr("nni_agent/__main__.py", FAKE_AGENT)
    work = tmp_path / "work"
    work.mkdir()
    args = ["--path", str(site), "--wheel", str(wheel), "--unpack-to", str(work / "agent-tag"),
            "--sha256", f"{wheel.name}={sha256(wheel)}", "--agent-id-env", "NNI_AGENT_ID", "--", "--agent-id", "{agent}", "--token-file", "/s/{agent}"]
    for _ in range(2):
        out = run_boot(python, *args, env={"NNI_AGENT_ID": "pod-1"}, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout.split("AGENT ", 1)[1])
        assert seen["argv"] == ["--agent-id", "pod-1", "--token-file", "/s/pod-1"]
        assert seen["file"] == str(work / "agent-tag" / "nni_agent" / "__main__.py")
    assert [p.name for p in work.iterdir()] == ["agent-tag"]  # no leftover scratch directory
    assert (work / "agent-tag").stat().st_mode & 0o777 == 0o700
    line = one_line(run_boot(python, *args, cwd=tmp_path))
    assert line == "nni-agent: the environment variable NNI_AGENT_ID (the agent's id) is not set"


WORKER = {"version": "%d.%d" % sys.version_info[:2], "machine": platform.machine(),
          "libc": " ".join(platform.libc_ver()).strip()}


def test_boot_file_runs_without_its_package_shadowing_the_stdlib(tmp_path: Path) -> None:
    """Run as a file, boot.py's own directory (nni_agent/) leaves sys.path: `--check` with the real
    agent and this Python's real dependencies says ok."""
    out = run_boot(sys.executable, "--path", str(ROOT / "agent"), "--check",
                   env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if "site-packages" in p)}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"ok": True, "python": sys.executable, "problems": [], "fixes": [], **WORKER}


def test_check_mode_says_what_to_install(tmp_path: Path) -> None:
    """`--check` (the remote installer's): the problems and the requirements that fix them as JSON,
    and the one line."""
    site = good_site(tmp_path / "site", grpcio="1.30.0")
    fake_agent(tmp_path / "agent")
    out = run_boot(sys.executable, "--path", str(site), "--path", str(tmp_path / "agent"), "--check", cwd=tmp_path)
    assert out.returncode == boot.FAILED
    assert json.loads(out.stdout) == {"ok": False, "python": sys.executable, **WORKER,
                                      "problems": ["grpcio 1.30.0 is older than 1.49.1"], "fixes": ["grpcio>=1.49.1,<2"]}
    assert one_line(out).startswith("nni-agent: Python ")
    report = tmp_path / "report.json"  # --report: the same JSON in a file (a probe pod's termination log)
    run_boot(sys.executable, "--path", str(site), "--path", str(tmp_path / "agent"), "--check", "--report",
             str(report), cwd=tmp_path)
    assert json.loads(report.read_text()) == json.loads(out.stdout)


def test_wheels_in_pieces_are_joined_and_unpacked_once_onto_the_path(tmp_path: Path) -> None:
    """`--parts DIR --deps-to DIR`: wheels cut into `<wheel>.<nnn>` pieces (ConfigMaps, one level of
    subdirectories, `..data` entries as a ConfigMap volume has) are joined in order, unpacked once,
    and put on the path: the check then finds the dependencies."""
    import zipfile

    site = good_site(tmp_path / "site")
    fake_agent(tmp_path / "agent")
    whl = tmp_path / "deps-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for f in sorted(site.rglob("*")):
            if f.is_file():
                zf.write(f, f.relative_to(site).as_posix())
    data = whl.read_bytes()
    size = len(data) // 3 + 1
    for i in range(3):  # pieces spread over two volumes, out of order
        d = tmp_path / "parts" / str(i % 2)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{whl.name}.{i:03d}").write_bytes(data[i * size:(i + 1) * size])
    (tmp_path / "parts" / "0" / "..data").mkdir()
    deps = tmp_path / "work" / "deps-cp3"
    deps.parent.mkdir()
    (tmp_path / "parts" / "1" / "planted-1.0-py3-none-any.whl.000").write_bytes(b"not named: ignored")
    args = ("--path", str(tmp_path / "agent"), "--parts", str(tmp_path / "parts"), "--deps-to", str(deps),
            "--sha256", f"{whl.name}={sha256(whl)}", "--check")
    out = run_boot(sys.executable, *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ok"] is True
    assert (deps / "grpc").is_dir() and [p.name for p in deps.parent.iterdir()] == ["deps-cp3"]
    (tmp_path / "parts" / "1" / f"{whl.name}.001").write_bytes(b"broken")  # unpacked once: not read again
    assert run_boot(sys.executable, *args, cwd=tmp_path).returncode == 0


def test_unknown_boot_option_is_one_line(tmp_path: Path) -> None:
    line = one_line(run_boot(sys.executable, "--frobnicate", "x", "--", "--agent-id", "a", cwd=tmp_path))
    assert line == "nni-agent: unknown boot option --frobnicate (the manager and this boot script disagree)"


def test_boot_source_has_no_openpai_template_tags() -> None:
    """OpenPAI renders `<% ... %>` in a job's commands, where boot.py travels inline."""
    text = BOOT.read_text()
    assert "<%" not in text and "%>" not in text


# ----------------------------------------------------------------------------- shipped code by digest

PLANTED = '''import os
open(os.environ["MARKER"], "w").write("planted code ran")
'''


def agent_wheel(where: Path, main: str = FAKE_AGENT) -> Path:
    wheel = where / "nni_agent-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("nni_agent/__init__.py", "")
        zf.writestr("nni_agent/__main__.py", main)
    return wheel


def test_changed_agent_wheel_is_refused_in_one_line_and_never_runs(tmp_path: Path) -> None:
    """The wheel in the shared place is not the one whose digest the command line carries: one line
    naming it, exit 3, and its code does not run."""
    site = good_site(tmp_path / "site")
    good = hashlib.sha256(agent_wheel(tmp_path).read_bytes()).hexdigest()
    wheel = agent_wheel(tmp_path, PLANTED)  # replaced after the manager shipped it
    marker = tmp_path / "marker"
    out = run_boot(sys.executable, "--path", str(site), "--wheel", str(wheel), "--unpack-to", str(tmp_path / "a"),
                   "--sha256", f"{wheel.name}={good}", "--", "--agent-id", "x", env={"MARKER": str(marker)},
                   cwd=tmp_path)
    line = one_line(out)
    assert line.startswith(f"nni-agent: the shipped file {wheel.name} ({wheel}) is not the one the manager shipped "
                           f"(sha256 {sha256(wheel)[:16]}, expected {good[:16]})"), line
    assert not marker.exists() and not (tmp_path / "a").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".nni-agent-")]  # nothing left behind
    line = one_line(run_boot(sys.executable, "--wheel", str(wheel), "--unpack-to", str(tmp_path / "a"), "--",
                             "--agent-id", "x", cwd=tmp_path))
    assert line == f"nni-agent: no --sha256 for the agent wheel {wheel.name} (the manager and this boot script " \
                   "disagree)"


SELF_REPORT = FAKE_AGENT + '''home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
st = os.stat(home)
print("HOME " + json.dumps({"dir": home, "mode": st.st_mode & 0o777, "uid": st.st_uid,
                            "stamp": open(os.path.join(home, ".nni-agent-digests")).read()}), flush=True)
'''


def _home(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.split("HOME ", 1)[1])  # type: ignore[no-any-return]


def test_planted_unpack_directory_is_not_used(tmp_path: Path) -> None:
    """A directory already at --unpack-to that this boot step did not make (another user's, or not
    0700, or without the stamp of these digests) is never read: the verified wheel is unpacked
    into a fresh private directory and the agent runs from there. Where the planted one cannot be
    replaced, that copy is this start's own and is gone when the agent exits."""
    site = good_site(tmp_path / "site")
    wheel = agent_wheel(tmp_path, SELF_REPORT)
    target = tmp_path / "agent-tag"
    fake_agent(target)
    (target / "nni_agent" / "__main__.py").write_text(PLANTED)
    marker = tmp_path / "marker"
    temp = tmp_path / "temp"
    temp.mkdir(mode=0o700)
    for mode in (0o777, 0o700):  # group-writable; then private but not stamped by the boot step
        target.chmod(mode)
        before = sorted(tmp_path.iterdir())
        home = _home(run_boot(sys.executable, "--path", str(site), "--wheel", str(wheel), "--unpack-to", str(target),
                              "--sha256", f"{wheel.name}={sha256(wheel)}", "--", "--agent-id", "x",
                              env={"MARKER": str(marker), "TMPDIR": str(temp)}, cwd=tmp_path))
        assert not marker.exists()
        assert home["mode"] == 0o700 and home["uid"] == os.getuid()
        assert home["stamp"] == f"{wheel.name}={sha256(wheel)}\n"
        if mode == 0o777:  # not this boot step's: never touched; this start's own copy left with the agent
            assert home["dir"] != str(target) and not Path(home["dir"]).exists()
            assert (target / "nni_agent" / "__main__.py").read_text() == PLANTED
        else:  # this user's own but unstamped (an older shipment): replaced by the verified copy
            assert home["dir"] == str(target) and (target / boot.STAMP).is_file()
        assert sorted(tmp_path.iterdir()) == before and not list(temp.iterdir())


def test_unsafe_unpack_place_reuses_one_private_copy(tmp_path: Path) -> None:
    """--unpack-to in a directory others may write (a shared place, a 0777 volume): the wheel is
    unpacked once into this user's temp dir, under a name fixed by its digest, and every later
    start of the same shipment runs from that copy; nothing else is left there."""
    site = good_site(tmp_path / "site")
    wheel = agent_wheel(tmp_path, SELF_REPORT)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    temp = tmp_path / "temp"
    temp.mkdir(mode=0o700)
    args = ["--path", str(site), "--wheel", str(wheel), "--unpack-to", str(shared / "agent"),
            "--sha256", f"{wheel.name}={sha256(wheel)}", "--", "--agent-id", "x"]
    homes = [_home(run_boot(sys.executable, *args, env={"TMPDIR": str(temp)}, cwd=tmp_path)) for _ in range(3)]
    assert len({h["dir"] for h in homes}) == 1
    assert Path(homes[0]["dir"]).parent == temp and homes[0]["mode"] == 0o700
    assert [p.name for p in temp.iterdir()] == [Path(homes[0]["dir"]).name]
    assert not list(shared.iterdir())  # nothing written into the shared place
    (tmp_path / "v2").mkdir()
    other = agent_wheel(tmp_path / "v2", SELF_REPORT + "# 2\n")
    home = _home(run_boot(sys.executable, "--path", str(site), "--wheel", str(other), "--unpack-to",
                          str(shared / "agent"), "--sha256", f"{other.name}={sha256(other)}", "--", "--agent-id", "x",
                          env={"TMPDIR": str(temp)}, cwd=tmp_path))
    assert home["dir"] != homes[0]["dir"] and len(list(temp.iterdir())) == 2  # another shipment, its own copy


def _pieces(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    whl = tmp_path / name
    with zipfile.ZipFile(whl, "w") as zf:
        for n, text in files.items():
            zf.writestr(n, text)
    return whl


def test_dependency_pieces_are_verified_missing_ones_named_and_others_ignored(tmp_path: Path) -> None:
    """Only the wheels the command line names (for this Python: `cpXY/` entries of other Pythons
    are not this one's) are joined; a changed piece or a missing wheel is one line naming it."""
    fake_agent(tmp_path / "agent")
    good = _pieces(tmp_path, "dep-1.0-py3-none-any.whl", {"dep_mod/__init__.py": ""})
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / f"{good.name}.000").write_bytes(good.read_bytes())
    planted = _pieces(tmp_path, "extra-1.0-py3-none-any.whl", {"sitecustomize.py": PLANTED})
    (parts / f"{planted.name}.000").write_bytes(planted.read_bytes())
    me = "cp%d%d" % sys.version_info[:2]
    base = ("--path", str(tmp_path / "agent"), "--parts", str(parts), "--check")
    run_boot(sys.executable, *base, "--deps-to", str(tmp_path / "d1"), "--sha256", f"{me}/{good.name}={sha256(good)}",
             "--sha256", f"cp27/other-1.0-py3-none-any.whl={'0' * 64}", cwd=tmp_path,
             env={"MARKER": str(tmp_path / "marker")})
    assert sorted(p.name for p in (tmp_path / "d1").iterdir()) == [boot.STAMP, "dep_mod"]
    line = one_line(run_boot(sys.executable, *base, "--deps-to", str(tmp_path / "d2"),
                             "--sha256", f"{good.name}={sha256(good)}",
                             "--sha256", f"psutil-5.9.8-cp36-abi3-manylinux2014_x86_64.whl={'1' * 64}", cwd=tmp_path))
    assert line == f"nni-agent: the shipped file psutil-5.9.8-cp36-abi3-manylinux2014_x86_64.whl is missing from {parts}"
    (parts / f"{good.name}.000").write_bytes(planted.read_bytes())  # replaced in the shared place
    line = one_line(run_boot(sys.executable, *base, "--deps-to", str(tmp_path / "d3"),
                             "--sha256", f"{good.name}={sha256(good)}", cwd=tmp_path))
    assert line.startswith(f"nni-agent: the shipped file {good.name} ({parts}/{good.name}.000) is not the one the "
                           "manager shipped"), line
    assert not (tmp_path / "d2").exists() and not (tmp_path / "d3").exists()
    assert not (tmp_path / "marker").exists()
    line = one_line(run_boot(sys.executable, "--sha256", "x=12", "--", "--agent-id", "a", cwd=tmp_path))
    assert line == "nni-agent: boot option --sha256 needs NAME=<64 hex digits>, not x=12"
