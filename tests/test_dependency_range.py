"""The agent works with the oldest and the newest grpcio/protobuf/psutil that pyproject.toml allows.

Agents run in users' images, which bring their own versions, so the agent's dependencies are
ranges. For each end of the ranges this makes a venv (cached under .venv/deprange/, keyed by
Python and versions; the "newest" one is re-resolved weekly) holding exactly those versions and
the agent from this checkout (a .pth onto agent/, so the code is always the current one), then
runs a real TrainingService of this venv whose local agent is that venv's Python: the whole
protocol, trial API included, across the version gap. Needs the package index to build a venv;
skips with the reason when it cannot be reached and nothing is cached.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from unittest import mock

import psutil
import pytest

from nni_agent.guardian import ARGV_TAG

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".venv" / "deprange"
# The agent's runtime dependencies that the test pins (nvidia-ml-py is imported only on
# machines with an NVIDIA driver, so it is not exercised here).
PINNED = ("grpcio", "protobuf", "psutil")
PYTHON = os.environ.get("NNI_RANGE_PYTHON", sys.executable)  # e.g. a python3.10 to try another Python


def oldest_python() -> str | None:
    """The oldest Python the agent supports that this machine has: NNI_OLDEST_PYTHON, else a
    python3.8 / python3.9 on PATH or under pyenv (this image ships pyenv's 3.8)."""
    from nni_agent.compat import MIN_PYTHON

    if os.environ.get("NNI_OLDEST_PYTHON"):
        return os.environ["NNI_OLDEST_PYTHON"]
    for minor in range(MIN_PYTHON[1], sys.version_info[1]):
        candidates = [str(p) for p in sorted(Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python3.{minor}"))]
        candidates += [p for p in [shutil.which(f"python3.{minor}")] if p]  # (a pyenv shim may not run)
        for found in candidates:
            if subprocess.run([found, "-c", "pass"], capture_output=True).returncode == 0:
                return found
    return None

TRIAL = r'''
from nni_agent import get_next_parameter, report_intermediate_result, report_final_result
p = get_next_parameter()
for i in range(3):
    report_intermediate_result(i)
report_final_result(p["x"])
'''

PROBE = r'''
import json, warnings
warnings.simplefilter("error")  # a gencode/runtime version warning fails the probe
import grpc, google.protobuf, psutil
import nni_agent, nni_agent.v1.agent_pb2 as pb, nni_agent.v1.agent_pb2_grpc
msg = pb.AgentMessage(hello=pb.Hello(agent_id="x", protocol_major=1))
assert pb.AgentMessage.FromString(msg.SerializeToString()) == msg
print(json.dumps({"grpcio": grpc.__version__, "protobuf": google.protobuf.__version__,
                  "psutil": psutil.__version__, "agent": nni_agent.__file__}))
'''


def agent_requirements() -> dict[str, str]:
    """{distribution: version specifier} from pyproject.toml's [project] dependencies."""
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib

        deps = tomllib.loads(text)["project"]["dependencies"]
    except ImportError:  # Python 3.10
        block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
        assert block, "no [project] dependencies in pyproject.toml"
        deps = re.findall(r'"([^"]+)"', block.group(1))
    out = {}
    for dep in deps:
        name, spec = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", dep).groups()
        out[name.lower()] = spec.replace(" ", "")
    return out


def pins(end: str) -> list[str]:
    reqs = agent_requirements()
    missing = [n for n in PINNED if n not in reqs]
    assert not missing, f"pyproject.toml lists no {missing}"
    if end == "newest":
        return [f"{n}{reqs[n]}" for n in PINNED]
    out = []
    for n in PINNED:
        lower = re.search(r">=([0-9][0-9.]*)", reqs[n])
        assert lower, f"{n}{reqs[n]}: a range needs a lower bound (>=)"
        out.append(f"{n}=={lower.group(1)}")
    return out


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def _in_range(version: str, spec: str) -> bool:
    """`version` against a spec of `>=` / `<` clauses (what pyproject.toml uses for these)."""
    for op, bound in re.findall(r"(>=|<)([0-9.]+)", spec):
        if (op == ">=" and _key(version) < _key(bound)) or (op == "<" and _key(version) >= _key(bound)):
            return False
    return True


def _index_unreachable() -> str | None:
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/") + "/pip/"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10).close()
    except Exception as exc:  # noqa: BLE001 - any failure means: cannot build a venv here
        return f"the package index ({url}) cannot be reached ({exc}); no cached venv in {CACHE}"
    return None


def venv_for(end: str, base: str = PYTHON) -> tuple[Path, list[str]]:
    """The cached venv of `base` for this end of the ranges: (its python, the requirements it holds)."""
    reqs = pins(end)
    version = subprocess.run([base, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    stamp = time.strftime("%G-W%V") if end == "newest" else ""  # pick up new releases weekly
    key = hashlib.sha256(json.dumps([version, reqs, stamp]).encode()).hexdigest()[:12]
    venv = CACHE / f"{end}-py{version}-{key}"
    python = venv / "bin" / "python"
    done = venv / "requirements.txt"
    if not done.exists():
        reason = _index_unreachable()
        if reason:
            pytest.skip(reason)
        CACHE.mkdir(parents=True, exist_ok=True)
        for old in CACHE.glob(f"{end}-py{version}-*"):  # superseded ranges or weeks
            shutil.rmtree(old, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{end}-", dir=CACHE))
        try:
            # This venv's pip installs into the new one (no ensurepip there), except for a Python
            # older than that pip supports, whose own pip does it; only wheels, so a release
            # without a wheel for this Python fails at once instead of compiling.
            own_pip = _key(version) < (3, 10)
            subprocess.run([base, "-m", "venv", *([] if own_pip else ["--without-pip"]), str(tmp)], check=True,
                           capture_output=True)
            pip_cmd = ([str(tmp / "bin" / "python"), "-m", "pip"] if own_pip
                       else [sys.executable, "-m", "pip", "--python", str(tmp / "bin" / "python")])
            pip = subprocess.run(
                [*pip_cmd, "install", "--quiet", "--disable-pip-version-check", "--no-input", "--only-binary=:all:",
                 *reqs], capture_output=True, text=True)
            assert pip.returncode == 0, f"pip install {' '.join(reqs)} failed:\n{pip.stdout}{pip.stderr}"
            site = subprocess.run([str(tmp / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            (Path(site) / "nni_agent_checkout.pth").write_text(str(ROOT / "agent") + "\n")
            (tmp / "requirements.txt").write_text("\n".join(reqs) + "\n")
            tmp.rename(venv)  # a venv's python finds its site-packages relative to itself
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return python, reqs


def _metrics(got: list, trial_id: str) -> list[tuple[str, int, str]]:
    out = []
    for m in got:
        if m.id == trial_id:
            d = json.loads(m.data)
            out.append((d["type"], d["sequence"], d["value"]))
    return out


def _live_children() -> list[psutil.Process]:
    """This process's descendants that still run (zombies of earlier tests have no cmdline)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                p.cmdline()
                out.append(p)
        except psutil.Error:
            continue
    return out


def _agent_logs(root: Path) -> str:
    return "\n".join(f"{p}:\n{p.read_text(errors='replace')[-3000:]}" for p in root.rglob("agent*.log"))


async def _until(cond, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := await cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return value


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("interpreter", ["this", "oldest"])
@pytest.mark.parametrize("end", ["oldest", "newest"])
def test_agent_across_the_dependency_range(end: str, interpreter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each end of the ranges, under this Python and under the oldest one the agent supports
    (its agent and its trial both run there: Python 3.8 on this image)."""
    base = PYTHON if interpreter == "this" else oldest_python()
    if base is None:
        pytest.skip("no Python 3.8 or 3.9 on this machine (set NNI_OLDEST_PYTHON to one)")
    python, reqs = venv_for(end, base)
    probe = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, cwd="/")
    assert probe.returncode == 0, probe.stderr
    versions = json.loads(probe.stdout)
    assert versions["agent"].startswith(str(ROOT / "agent")), versions  # the checkout's agent
    if end == "oldest":
        assert [f"{n}=={versions[n]}" for n in PINNED] == reqs
    else:  # inside each range, and above its lower end (else "newest" would prove nothing new)
        reqs_by_name = agent_requirements()
        for n in PINNED:
            assert _in_range(versions[n], reqs_by_name[n]), (n, versions[n], reqs_by_name[n])
            assert _key(versions[n]) > _key(re.search(r">=([0-9.]+)", reqs_by_name[n]).group(1)), (n, versions[n])

    from nni_manager import HyperParameters, TrialJobApplicationForm, create_training_service
    from nni_manager.config import ExperimentConfig, TrainingServiceConfig

    monkeypatch.delenv("PYTHONPATH", raising=False)
    short = Path(tempfile.mkdtemp(prefix="dr", dir="/tmp"))  # Unix socket paths are short
    try:
        code = short / "code"
        code.mkdir()
        (code / "trial.py").write_text(TRIAL)
        cfg = ExperimentConfig(
            trial_code_directory=code,
            trial_command=f"{python} trial.py",
            trial_grace_period=2.0,
            training_service=TrainingServiceConfig(platform="local"),
            experiment_working_directory=short / "exps",
        )

        async def body() -> None:
            got: list = []
            async with contextlib.AsyncExitStack() as stack:
                # The local backend starts its agent with sys.executable: make that the venv's
                # Python while the service starts (and only then: the manager stays in this venv).
                with mock.patch.object(sys, "executable", str(python)):
                    ts = await stack.enter_async_context(create_training_service(cfg))
                ts.add_trial_job_metric_listener(got.append)
                record = {"parameter_id": 0, "parameter_source": "algorithm", "parameters": {"x": 5},
                          "parameter_index": 0}
                job = await ts.submit_trial_job(TrialJobApplicationForm(
                    sequence_id=0, hyper_parameters=HyperParameters(json.dumps(record), 0)))

                async def finished():
                    d = await ts.get_trial_job(job.id)
                    return d if d.status.value not in ("WAITING", "RUNNING", "UNKNOWN") else None

                try:
                    done = await _until(finished, f"trial {job.id} to finish")
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; agent log:\n{_agent_logs(short)}") from None
                assert done.status.value == "SUCCEEDED", (done.status, done.message, _agent_logs(short))

                ours = [p for p in _live_children()  # this experiment's (its socket and dirs are under `short`)
                        if "nni_agent" in " ".join(p.cmdline()) and str(short) in " ".join(p.cmdline())]
                agents = [p for p in ours if ARGV_TAG not in p.cmdline()]  # not its guardian
                assert len(agents) == 1, [p.cmdline() for p in ours]
                assert agents[0].cmdline()[0] == str(python)  # the venv's agent, not this venv's
                libs = {m.path for m in agents[0].memory_maps()}
                venv_dir = str(python.parent.parent)
                assert any(p.startswith(venv_dir) and "/grpc/" in p for p in libs), sorted(libs)

                await _until(lambda: asyncio.sleep(0, len(_metrics(got, job.id)) >= 4), "the final metric")
                await asyncio.sleep(0.3)  # a duplicate would arrive right behind
                assert _metrics(got, job.id) == [("PERIODICAL", 0, "0"), ("PERIODICAL", 1, "1"),
                                                 ("PERIODICAL", 2, "2"), ("FINAL", 0, "5")]

        asyncio.run(body())
    finally:
        shutil.rmtree(short, ignore_errors=True)
