#!/usr/bin/env python3
"""Regenerate the Python gRPC code for proto/ into agent/nni_agent/.

The generated modules are committed so that workers need neither grpcio-tools nor a
compiler; tests/test_proto_current.py fails when they are stale. Run after editing a
.proto file:  python scripts/gen_proto.py   (or --check to only compare).

The generator is pinned (GENERATOR below) and runs in a venv of its own, made on first
use under .venv/protogen/ (about 10 s: three wheels from the package index) and reused
after that, so the output is the same on every machine and the project's own venv keeps
the newest grpcio. Why this old grpcio-tools: its protoc (25.1) writes protobuf gencode
without a runtime-version gate and its gRPC plugin writes no grpcio-version gate, so one
generated module loads with every protobuf from 4.25.1 (the gencode version: never older)
up to the newest, and every grpcio the agent allows. Protobuf promises that Python gencode
from 3.20.0 on is supported by runtimes up to at least 8.x
(https://protobuf.dev/support/cross-version-runtime-guarantee/#python). Newer generators
embed `ValidateProtobufRuntimeVersion(<their version>)` and `GRPC_GENERATED_VERSION`, which
would raise the agent's lower bounds to the generator's own versions.
tests/test_dependency_range.py runs a real agent with the oldest and newest allowed pairs.
"""
from __future__ import annotations

import argparse
import fcntl
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "agent"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

# The generator's whole environment, pinned. grpcio-tools 1.62.3 is the last release with
# protoc 25 (protobuf 4.25 gencode); it has wheels for CPython 3.8-3.12 only.
GENERATOR = ("grpcio-tools==1.62.3", "grpcio==1.62.3", "protobuf==4.25.9")
GENERATOR_PYTHONS = ((3, 8), (3, 12))  # oldest, newest CPython the pinned wheels exist for
GEN_ROOT = Path(os.environ.get("NNI_PROTOGEN_DIR", ROOT / ".venv" / "protogen"))

RUN_PROTOC = """
import sys
from pathlib import Path
import grpc_tools
from grpc_tools import protoc
include = Path(grpc_tools.__file__).parent / "_proto"
sys.exit(protoc.main(["protoc", f"-I{include}", *sys.argv[1:]]))
"""


def _python_version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def _generator_python() -> tuple[str, tuple[int, int]]:
    """This interpreter if the pinned wheels support it, else a supported python3.X on PATH."""
    lo, hi = GENERATOR_PYTHONS
    candidates = [sys.executable] + [f"python3.{m}" for m in range(hi[1], lo[1] - 1, -1)]
    for cand in candidates:
        path = cand if os.sep in cand else shutil.which(cand)
        version = _python_version(path) if path else None
        if version and lo <= version <= hi:
            return path, version
    raise SystemExit(f"gen_proto: the pinned generator ({GENERATOR[0]}) needs CPython "
                     f"{lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}; this is {sys.version.split()[0]} and no python3.X "
                     f"in that range is on PATH. Install one (e.g. python3.12) and run again.")


def generator_env() -> Path:
    """The generator venv's python, made (under a lock: tests may race) when missing."""
    python, version = _generator_python()
    venv = GEN_ROOT / ("-".join(r.replace("==", "-") for r in GENERATOR) + f"-py{version[0]}.{version[1]}")
    done = venv / "generator.txt"
    want = "\n".join(GENERATOR) + "\n"
    if done.exists() and done.read_text() == want:
        return venv / "bin" / "python"
    GEN_ROOT.mkdir(parents=True, exist_ok=True)
    with open(GEN_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (done.exists() and done.read_text() == want):
            shutil.rmtree(venv, ignore_errors=True)
            print(f"gen_proto: making the generator venv {venv.relative_to(ROOT) if venv.is_relative_to(ROOT) else venv}"
                  f" ({' '.join(GENERATOR)}) ...", file=sys.stderr)
            steps = [
                [python, "-m", "venv", str(venv)],
                [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 "--no-input", "--only-binary=:all:", *GENERATOR],
            ]
            for cmd in steps:
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    shutil.rmtree(venv, ignore_errors=True)
                    raise SystemExit(f"gen_proto: {' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
            done.write_text(want)
    return venv / "bin" / "python"


def generate(out_root: Path) -> list[Path]:
    """Run the pinned protoc over every .proto file; return the files written."""
    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    args = [
        f"-I{PROTO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *map(str, protos),
    ]
    out = subprocess.run([str(generator_env()), "-c", RUN_PROTOC, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"protoc failed:\n{out.stdout}{out.stderr}")
    return sorted(p for p in out_root.rglob("*") if p.name.endswith(GENERATED_SUFFIXES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed code is stale")
    args = parser.parse_args()
    if not args.check:
        written = generate(OUT_ROOT)
        print("\n".join(str(p.relative_to(ROOT)) for p in written))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        expected = {OUT_ROOT / p.relative_to(tmp) for p in fresh}
        stale = []
        for path in fresh:
            committed = OUT_ROOT / path.relative_to(tmp)
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(str(committed.relative_to(ROOT)))
        leftover = [p for p in OUT_ROOT.rglob("*") if p.name.endswith(GENERATED_SUFFIXES) and p not in expected]
        stale += [f"{p.relative_to(ROOT)} (no .proto makes it)" for p in leftover]
    if stale:
        print("stale generated protobuf code (run: python scripts/gen_proto.py):", *stale, sep="\n  ")
        return 1
    print(f"generated protobuf code is current ({GENERATOR[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
