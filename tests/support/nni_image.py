"""`msranni/nni:latest` as it really is, for emulators that map images to Python environments.

NNI's default image is Ubuntu 20.04 with Python 3.8 and `nni` installed (which brings psutil) but
neither grpcio nor protobuf. Here: a venv of pyenv's CPython 3.8 with `nni==3.0` installed from
the package index, made once and kept under `.venv/test-images/` (about 35 s and 0.5 GB the first
time; minutes on a loaded machine), by scripts/test.sh's setup (`python -m tests.support.nni_image`)
or else by the first test that needs it; tests skip, saying why, where no Python 3.8 or no index is
available.
"""
from __future__ import annotations

import fcntl
import glob
import json
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".venv" / "test-images" / "msranni-nni-latest-py3.8"
WHEELS = ROOT / ".venv" / "test-images" / "agent-wheels-cp38"
NNI = "nni==3.0"

# unmodified NNI trial code that holds it runs under the image's own Python 3.8
PY38_TRIAL = """
import sys
import nni
nni.get_next_parameter()
assert sys.version_info[:2] == (3, 8), sys.version
nni.report_intermediate_result(1.0)
nni.report_final_result({"default": 38.0, "python": "%d.%d" % sys.version_info[:2]})
"""
PY38_FINAL = {"default": 38.0, "python": "3.8"}


def final_results(metrics: list[str]) -> list[object]:
    """The FINAL values among metric records as the trial-job metric listener hands them over."""
    return [json.loads(r["value"]) for r in map(json.loads, metrics) if r["type"] == "FINAL"]


def python38() -> str | None:
    found = sorted(glob.glob("/root/.pyenv/versions/3.8.*/bin/python3.8")) or [
        p for p in (shutil.which("python3.8"),) if p]
    return found[-1] if found else None


def nni_latest_bin() -> tuple[str | None, str]:
    """(the bin directory of the image's Python, "") or (None, why it cannot be made)."""
    ready = HOME / ".complete"
    if ready.exists():
        return str(HOME / "bin"), ""
    py = python38()
    if py is None:
        return None, "no CPython 3.8 here (pyenv install 3.8) for the msranni/nni:latest image"
    HOME.parent.mkdir(parents=True, exist_ok=True)
    with open(HOME.parent / ".msranni-nni.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be making it
        if ready.exists():
            return str(HOME / "bin"), ""
        shutil.rmtree(HOME, ignore_errors=True)
        try:
            subprocess.run([py, "-m", "venv", str(HOME)], check=True, capture_output=True, timeout=120)
            subprocess.run([str(HOME / "bin" / "python"), "-m", "pip", "install", "--quiet",
                            "--disable-pip-version-check", NNI], check=True, capture_output=True, text=True, timeout=600)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            shutil.rmtree(HOME, ignore_errors=True)
            tail = (getattr(e, "stderr", "") or "").strip().splitlines()[-1:] or [str(e)]
            return None, f"cannot make the msranni/nni:latest Python 3.8 environment ({NNI}): {tail[0][:200]}"
        ready.write_text(NNI + "\n")
    return str(HOME / "bin"), ""


def cp38_wheelhouse() -> tuple[Path | None, str]:
    """(a wheelhouse holding the agent's dependencies for CPython 3.8 on manylinux x86_64, "") or
    (None, why not), made once with the manager's own `pip download` (agent_deps.download): for
    platforms that ship wheels for every CPython without a probe (OpenPAI, AML), so a test can
    keep downloads off and still give the 3.8 image its wheels."""
    from nni_manager.backends import agent_deps

    ready = WHEELS / ".complete"
    if ready.exists():
        return WHEELS, ""
    WHEELS.parent.mkdir(parents=True, exist_ok=True)
    with open(WHEELS.parent / ".agent-wheels-cp38.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return WHEELS, ""
        worker = agent_deps.WorkerPython((3, 8), "x86_64", (2, 17))
        agent_deps.download(worker, agent_deps.agent_requirements(), WHEELS)
        if not list(WHEELS.glob("grpcio-*cp38*.whl")):
            return None, "cannot download the agent's dependency wheels for CPython 3.8 (no package index?)"
        ready.write_text("cp38\n")
    return WHEELS, ""


def main() -> int:
    """`python -m tests.support.nni_image`: make both while setup may use the network (scripts/test.sh),
    so that no test pays the install (minutes on a loaded machine) or reaches the package index."""
    made = [nni_latest_bin(), cp38_wheelhouse()]
    for found, why in made:
        print(found if found is not None else f"not made: {why}")
    return 0 if all(found is not None for found, _ in made) else 1


if __name__ == "__main__":
    raise SystemExit(main())
