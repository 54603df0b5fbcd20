"""Summarise a per-test profile written by tests/support/cpu_profile.py: totals, the share of each
test folder, and the tests that burn the most CPU and wall time.

    NNI_TEST_PROFILE=/tmp/p.jsonl bash scripts/test.sh -p tests.support.cpu_profile
    python scripts/test_profile.py /tmp/p.jsonl"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def folder(test: str) -> str:
    parts = test.split("::")[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.profile.read_text().splitlines() if line.strip()]
    for r in rows:
        r["cpu"] = r["cpu_self"] + r["cpu_children"]
    wall, cpu = sum(r["wall"] for r in rows), sum(r["cpu"] for r in rows)
    print(f"{len(rows)} tests: {wall:.0f} s of test wall time, {cpu:.0f} CPU s counted "
          f"({sum(r['cpu_self'] for r in rows):.0f} in pytest, {sum(r['cpu_children'] for r in rows):.0f} in children)")
    by: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for r in rows:
        b = by[folder(r["test"])]
        b[0] += 1
        b[1] += r["wall"]
        b[2] += r["cpu"]
    print(f"\n{'folder':32} {'tests':>6} {'wall s':>8} {'wall %':>7} {'CPU s':>8} {'CPU %':>6}")
    for name, (n, w, c) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:32} {int(n):6} {w:8.0f} {100 * w / wall:6.1f}% {c:8.0f} {100 * c / max(cpu, 1e-9):5.1f}%")
    for key in ("cpu", "wall"):
        print(f"\nthe {args.top} tests with the most {key}:")
        for r in sorted(rows, key=lambda r: -r[key])[:args.top]:
            print(f"  {r[key]:7.1f}  {r['test']}")


if __name__ == "__main__":
    main()
