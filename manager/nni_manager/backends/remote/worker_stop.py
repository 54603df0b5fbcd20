"""Runs ON THE WORKER (stdlib only), fed to `python -` over SSH.

argv: <run marker> <grace seconds> <token file>. Every process the remote backend starts
(the agent, and through inheritance every trial and their daemonised children) carries
NNI_AGENT_REMOTE_RUN=<run marker>. Asks them to stop (SIGTERM), waits up to the grace,
then SIGKILLs what is left, removes the token file and prints one JSON line.
"""
import json
import os
import signal
import sys
import time

MARKER = b"NNI_AGENT_REMOTE_RUN=" + sys.argv[1].encode()


def marked() -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if MARKER in f.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:
            pass
    return pids


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def main() -> None:
    grace = float(sys.argv[2])
    first = marked()
    signal_all(first, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = marked()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = marked()
    signal_all(left, signal.SIGKILL)
    time.sleep(0.05)
    try:
        os.unlink(sys.argv[3])
    except OSError:
        pass
    print(json.dumps({"terminated": len(first), "killed": len(left), "still_running": marked()}))


main()
