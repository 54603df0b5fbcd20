"""Benchmark the remote (SSH) backend against the local one, side by side in one run.

Needs root, /usr/sbin/sshd, ip, nc and socat (apt-get install -y openssh-server
netcat-openbsd iproute2 socat). Three hosts are network namespaces with only loopback,
reached by proxyCommand; agents reach the manager only through the SSH tunnel. Prints:
  * run() -> agents connected: first start (agent installed from the wheel) for three
    hosts, then already installed for one host (target < 1 s) and for three at once;
  * per-trial overhead (submit -> SUCCEEDED of a trivial trial, sequential) over SSH vs
    local (target: within 1.5x of local), through a proxyCommand relay that disables
    Nagle (socat ...,nodelay) and through plain nc, which does not;
  * with --bare WHEELHOUSE: one host whose Python is a bare venv of /usr/bin/python3 (none of
    the agent's dependencies, no index in its namespace): run() -> agent connected when the
    manager ships the dependencies (first), when the worker has kept them (second), next to a
    worker whose Python has them; and the bytes shipped.

    python scripts/bench_remote.py [--trials 20] [--bare .venv/agent-wheelhouse]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nni_manager.backends.remote.config import MachineConfig, RemoteConfig  # noqa: E402
from nni_manager.config import ExperimentConfig, TrainingServiceConfig  # noqa: E402
from nni_manager.service import create_training_service  # noqa: E402
from nni_manager.backends.agent_wheel import build_agent_wheel  # noqa: E402
from tests.support.manager.helpers import form, wait_status  # noqa: E402
from tests.support.remote.fixtures import SSHD, SshKeys, _stop, _wait_listening  # noqa: E402


# The proxyCommand relay matters: nc leaves Nagle on, so an SSH packet that follows an
# unacknowledged one waits for the delayed ACK (~40 ms); socat's `nodelay` sends at once.
RELAYS = {
    "socat": "ip netns exec %h socat - TCP:127.0.0.1:%p,nodelay",
    "nc": "ip netns exec %h nc 127.0.0.1 %p",
}


def hosts(keys: SshKeys, run_id: str) -> tuple[list[MachineConfig], list[subprocess.Popen[bytes]], list[str]]:
    machines, procs, names = [], [], []
    for i in range(3):
        name = f"nnib{i}-{run_id}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        names.append(name)
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        port = 2300 + i
        proc = subprocess.Popen(["ip", "netns", "exec", name, SSHD, "-D", "-e", "-f", str(keys.sshd_config(port, name))],
                                stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(proc)
        _wait_listening(name, port, proc)
        keys.trust(name, port)
        machines.append(MachineConfig(host=name, port=port, user="root", ssh_key_file=keys.root / "client",
                                      known_hosts_file=keys.known_hosts, python_path=str(Path(sys.executable).parent),
                                      proxy_command=RELAYS["socat"]))
    return machines, procs, names


def config(work: Path, code: Path, platform: str, machines: list[MachineConfig],
           wheelhouse: Path | None = None) -> ExperimentConfig:
    return ExperimentConfig(
        trial_command="true", trial_code_directory=code, trial_concurrency=1, trial_grace_period=1.0,
        experiment_working_directory=work, agent_wheelhouse=wheelhouse,
        training_service=TrainingServiceConfig(platform=platform, options=RemoteConfig(machines) if platform == "remote" else None),
    )


async def time_to_connected(cfg: ExperimentConfig) -> float:
    ts = create_training_service(cfg)
    t0 = time.perf_counter()
    await ts.start()
    while not (ts.agents() and all(a["connected"] for a in ts.agents())):
        if failed := [a["failed"] for a in ts.agents() if a["failed"]]:
            await ts.clean_up()
            raise SystemExit(f"bench_remote: {failed}")
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - t0
    await ts.clean_up()
    return elapsed


async def per_trial(cfg: ExperimentConfig, n: int) -> list[float]:
    times = []
    async with create_training_service(cfg) as ts:
        for i in range(n):
            t0 = time.perf_counter()
            job = await ts.submit_trial_job(form(i))
            await wait_status(ts, job.id, "SUCCEEDED", timeout=30)
            times.append(time.perf_counter() - t0)
    return times


def _ms(times: list[float]) -> str:
    return f"{statistics.median(times) * 1000:.0f} / {sorted(times)[int(len(times) * .9) - 1] * 1000:.0f} ms"


class _Shipped(logging.Handler):
    """Counts what the manager shipped (the bootstrap's "shipped N wheels (B bytes)" record)."""

    def __init__(self) -> None:
        super().__init__()
        self.wheels = self.bytes = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("shipped "):
            self.wheels += int(record.args[0])  # type: ignore[index]
            self.bytes += int(record.args[1])  # type: ignore[index]


async def bare(tmp: Path, code: Path, machine: MachineConfig, wheelhouse: Path) -> None:
    """A bare worker Python: dependencies shipped, then kept, next to a Python that has them."""
    stock = Path("/usr/bin/python3")
    venv = tmp / "bare"
    subprocess.run([str(stock), "-m", "venv", "--without-pip", str(venv)], check=True)
    version = subprocess.run([str(stock), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    tag = build_agent_wheel(tmp / "wheel").tag
    os.environ["NNI_AGENT_WHEEL_CACHE"] = str(tmp / "wheel-cache")  # the manager's cache starts empty
    shipped = _Shipped()
    logging.getLogger("nni_manager.backends.remote.bootstrap").addHandler(shipped)
    logging.getLogger("nni_manager.backends.remote.bootstrap").setLevel(logging.INFO)
    bare_machine = dataclasses.replace(machine, python_path=str(venv / "bin"))
    with_deps = await time_to_connected(config(tmp / "b0", code, "remote", [machine]))
    shutil.rmtree(Path.home() / ".nni-agent" / tag / f"deps-{version}", ignore_errors=True)
    first = await time_to_connected(config(tmp / "b1", code, "remote", [bare_machine], wheelhouse))
    first_bytes, first_wheels = shipped.bytes, shipped.wheels
    second = await time_to_connected(config(tmp / "b2", code, "remote", [bare_machine], wheelhouse))
    print(f"bare worker (Python {version}, no dependencies, no index): run() -> agent connected: "
          f"dependencies shipped {first:.2f} s ({first_wheels} wheels, {first_bytes / 1e6:.1f} MB), "
          f"kept from before {second:.2f} s ({(shipped.bytes - first_bytes) / 1e6:.1f} MB shipped); "
          f"a worker that has them {with_deps:.2f} s; ratios {first / with_deps:.2f}x / {second / with_deps:.2f}x")


async def main(n: int, wheelhouse: Path | None) -> None:
    if os.geteuid() != 0 or not os.path.exists(SSHD) or not all(map(shutil.which, ("ip", "nc", "socat"))):
        raise SystemExit("bench_remote: needs root, /usr/sbin/sshd, ip, nc and socat "
                         "(apt-get install -y openssh-server iproute2 netcat-openbsd socat)")
    os.makedirs("/run/sshd", exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="nbr", dir="/tmp"))
    procs: list[subprocess.Popen[bytes]] = []
    names: list[str] = []
    try:
        keys_dir = tmp / "ssh"
        keys_dir.mkdir()
        keys = SshKeys(keys_dir)
        machines, procs, names = hosts(keys, secrets.token_hex(3))
        code = tmp / "code"
        code.mkdir()
        tag = build_agent_wheel(tmp / "wheel").tag
        shutil.rmtree(Path.home() / ".nni-agent" / tag, ignore_errors=True)  # force a fresh install
        first = await time_to_connected(config(tmp / "e1", code, "remote", machines))
        if wheelhouse is not None:
            await bare(tmp, code, machines[0], wheelhouse.resolve())
        one = await time_to_connected(config(tmp / "e2", code, "remote", machines[:1]))
        three = await time_to_connected(config(tmp / "e3", code, "remote", machines))
        print(f"run() -> agents connected: 3 hosts first start (install) {first:.2f} s; already installed: "
              f"1 host {one:.2f} s [target < 1 s: {'OK' if one < 1 else 'MISSED'}], "
              f"3 hosts at once {three:.2f} s (three agent start-ups share 2 cores)")
        local = await per_trial(config(tmp / "e4", code, "local", []), n)
        print(f"per-trial submit -> SUCCEEDED over {n} trials (median / p90): "
              f"local {_ms(local)}")
        for relay, line in RELAYS.items():
            via = [dataclasses.replace(machines[0], proxy_command=line)]
            remote = await per_trial(config(tmp / f"e5{relay}", code, "remote", via), n)
            ratio = statistics.median(remote) / statistics.median(local)
            print(f"  remote via proxyCommand {relay:5s} {_ms(remote)}, ratio {ratio:.2f}x  "
                  f"[target <= 1.5x: {'OK' if ratio <= 1.5 else 'MISSED'}]")
    finally:
        for proc in procs:
            _stop(proc)
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--bare", type=Path, metavar="WHEELHOUSE",
                        help="also time a bare worker Python with the dependencies from this wheelhouse")
    args = parser.parse_args()
    asyncio.run(main(args.trials, args.bare))
