"""`python -m tests.support.fork_probe --out FILE [--exit N]`: writes its argv, environment, working
directory and parent to FILE, prints a line to stdout and one to stderr, then exits with N, or
waits for a signal when N is not given."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--exit", type=int)
    args = p.parse_args()
    with open(args.out + ".tmp", "w") as f:
        json.dump({"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "ppid": os.getppid(),
                   "pid": os.getpid()}, f)
    os.rename(args.out + ".tmp", args.out)
    print("probe: stdout")
    print("probe: stderr", file=sys.stderr)
    sys.stdout.flush()
    if args.exit is not None:
        sys.exit(args.exit)
    signal.pause()
