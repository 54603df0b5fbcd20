#!/usr/bin/env python3
"""Regenerate the Python gRPC code for proto/ into agent/nni_agent/.

The generated modules are committed so that workers need neither grpcio-tools nor a
compiler; tests/test_proto_current.py fails when they are stale. Run after editing a
.proto file:  python scripts/gen_proto.py   (or --check to only compare).
"""
from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "agent"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) over every .proto file; return the files written."""
    from grpc_tools import protoc  # dev-only dependency
    import grpc_tools

    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *map(str, protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
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
        stale = []
        for path in fresh:
            committed = OUT_ROOT / path.relative_to(tmp)
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(str(committed.relative_to(ROOT)))
    if stale:
        print("stale generated protobuf code (run: python scripts/gen_proto.py):", *stale, sep="\n  ")
        return 1
    print("generated protobuf code is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
