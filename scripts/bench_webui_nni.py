"""Our WebUI / REST API vs NNI 3.0's own manager, on the same 10,000-trial experiment.

One run: builds a store of N trials x M intermediate results (+ one final each) with the
manager's Store API (scripts/bench_webui.py), serves it with `nni-manager view`, then exports it
with `nni-manager export --nni-db` and serves that with NNI 3.0's `nnictl view` (its Node.js
manager from the installed nni wheel; made to listen on 127.0.0.1 only, tests/support/webui/nni_view.py).
The two servers are measured one after the other (the machine's cores are shared), with:

* per endpoint: median latency of `--samples` requests and the server's CPU per request, for
  `/trial-jobs`, `/metric-data-latest`, `/metric-data-range/0/19` (one WebUI chunk) and the whole
  `/metric-data` (what the WebUI asks below 100 trials; once);
* one browser-like poller for `--window` seconds: NNI's WebUI tick past 100 trials (check-status,
  experiment, experiment-metadata, trial-jobs, then one metric-data-range call per 20 trials plus
  metric-data-latest over 6 connections, revalidating with ETags as a browser cache does), the next
  tick 10 s after the previous one ended; the server's CPU over the window, ticks completed.

Prints both side by side with the ratio NNI / ours.

    .venv/bin/python scripts/bench_webui_nni.py [--trials 10000] [--metrics 100] [--window 60]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "manager"), str(ROOT / "agent"), str(ROOT), str(ROOT / "scripts")]

from bench_webui import build, get  # noqa: E402
from nni_manager.webui.nni_db import export_nni_db  # noqa: E402
from tests.support.webui.nni_view import NniView, node_why_not  # noqa: E402

import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

TICK_S = 10.0  # the WebUI's default refresh interval


def cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


class Poller:
    """One open WebUI past 100 trials, until `deadline`."""

    def __init__(self, api: str, trials: int) -> None:
        self.api = api
        self.ranges = [f"{api}/metric-data-range/{i}/{i + 20}" for i in range(0, trials, 20)]
        self.etags: dict[str, str] = {}
        self.lock = threading.Lock()

    def _get(self, url: str, deadline: float) -> bool:
        if time.monotonic() > deadline:
            return False
        with self.lock:
            tag = self.etags.get(url)
        request = urllib.request.Request(url, headers={"If-None-Match": tag} if tag else {})
        try:
            with urllib.request.urlopen(request, timeout=max(1.0, deadline - time.monotonic() + 600)) as r:
                r.read()
                if r.headers.get("ETag"):
                    with self.lock:
                        self.etags[url] = r.headers["ETag"]
        except urllib.error.HTTPError as exc:
            if exc.code != 304:
                raise
        return True

    def run(self, window: float) -> dict[str, Any]:
        deadline = time.monotonic() + window
        ticks: list[float] = []
        calls = 0
        with ThreadPoolExecutor(max_workers=6) as pool:  # a browser's connections per host
            while time.monotonic() < deadline:
                started = time.monotonic()
                done = [self._get(self.api + p, deadline) for p in
                        ("/check-status", "/experiment", "/experiment-metadata", "/trial-jobs")]
                done += list(pool.map(lambda u: self._get(u, deadline), self.ranges + [self.api + "/metric-data-latest/"]))
                calls += sum(done)
                if not all(done):
                    break
                ticks.append(time.monotonic() - started)
                rest = started + TICK_S - time.monotonic()
                if rest > 0:
                    time.sleep(min(rest, max(0.0, deadline - time.monotonic())))
        return {"ticks": ticks, "calls": calls, "per_tick": 4 + len(self.ranges) + 1}


def measure(label: str, api: str, proc: psutil.Process, trials: int, samples: int, window: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    c0, t0 = cpu(proc), time.perf_counter()
    get(api + "/trial-jobs")
    out["first"] = (time.perf_counter() - t0, cpu(proc) - c0)
    print(f"[{label}] first /trial-jobs: {out['first'][0] * 1000:.0f} ms", flush=True)
    for path in ("/trial-jobs", "/metric-data-latest/", "/metric-data-range/0/19"):
        times, cpus, size = [], [], 0
        for _ in range(samples):
            c0 = cpu(proc)
            dt, size = get(api + path)
            times.append(dt)
            cpus.append(cpu(proc) - c0)
        out[path] = (statistics.median(times), statistics.median(cpus), size)
        print(f"[{label}] {path}: {out[path][0] * 1000:.0f} ms", flush=True)
    c0 = cpu(proc)
    dt, size = get(api + "/metric-data")
    out["/metric-data"] = (dt, cpu(proc) - c0, size)
    print(f"[{label}] /metric-data: {dt:.1f} s, {size / 1e6:.0f} MB", flush=True)
    out["rss"] = proc.memory_info().rss
    c0, t0 = cpu(proc), time.monotonic()
    polled = Poller(api, trials).run(window)
    elapsed = time.monotonic() - t0
    polled["cpu_share"] = (cpu(proc) - c0) / elapsed
    polled["elapsed"] = elapsed
    out["poll"] = polled
    out["rss_after"] = proc.memory_info().rss
    print(f"[{label}] poller: {len(polled['ticks'])} ticks, {polled['calls']} requests in {elapsed:.0f} s, "
          f"CPU {polled['cpu_share'] * 100:.0f} % of a core", flush=True)
    return out


def report(ours: dict[str, Any], nni: dict[str, Any], window: float) -> None:
    def row(name: str, a: float, b: float, fmt: Callable[[float], str]) -> None:
        ratio = f"{b / a:.1f}x" if a > 0 else "n/a"  # CPU times tick in 10 ms steps
        print(f"{name:44} {fmt(a):>14} {fmt(b):>14} {ratio:>10}")

    ms = lambda v: f"{v * 1000:.1f} ms"  # noqa: E731
    sec = lambda v: f"{v:.2f} s"  # noqa: E731
    print(f"\n{'':44} {'nni-manager':>14} {'NNI 3.0':>14} {'NNI/ours':>10}")
    row("first /trial-jobs (cold)", ours["first"][0], nni["first"][0], ms)
    for path in ("/trial-jobs", "/metric-data-latest/", "/metric-data-range/0/19"):
        row(f"{path} median latency", ours[path][0], nni[path][0], ms)
        row(f"{path} server CPU per request", ours[path][1], nni[path][1], ms)
    row("/metric-data (everything) latency", ours["/metric-data"][0], nni["/metric-data"][0], sec)
    row("/metric-data server CPU", ours["/metric-data"][1], nni["/metric-data"][1], sec)
    po, pn = ours["poll"], nni["poll"]
    for label, p in (("nni-manager", po), ("NNI 3.0", pn)):
        done = f"{len(p['ticks'])} ticks, median {statistics.median(p['ticks']):.1f} s" if p["ticks"] else \
            f"no tick finished: {p['calls']} of its {p['per_tick']} requests in {p['elapsed']:.0f} s"
        print(f"poller ({window:.0f} s window), {label}: {done}")
    est_o = statistics.median(po["ticks"]) if po["ticks"] else po["elapsed"] * po["per_tick"] / max(1, po["calls"])
    est_n = statistics.median(pn["ticks"]) if pn["ticks"] else pn["elapsed"] * pn["per_tick"] / max(1, pn["calls"])
    row("WebUI tick wall time (estimated if unfinished)", est_o, est_n, sec)
    row("server CPU with one poller (% of a core)", po["cpu_share"] * 100, pn["cpu_share"] * 100,
        lambda v: f"{v:.0f} %")
    row("server RSS after polling (MB)", ours["rss_after"] / 1e6, nni["rss_after"] / 1e6, lambda v: f"{v:.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--metrics", type=int, default=100, help="intermediate results per trial")
    ap.add_argument("--samples", type=int, default=3, help="requests per endpoint (median)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds of browser-like polling per server")
    args = ap.parse_args()
    why = node_why_not()
    if why:
        print(f"NNI's manager cannot run here: {why}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        exps = Path(tmp) / "exps"
        exp = exps / "bench001"
        t = time.perf_counter()
        build(exp, args.trials, args.metrics)
        print(f"store: {args.trials} trials x {args.metrics + 1} metrics, "
              f"{(exp / 'experiment.db').stat().st_size / 1e6:.0f} MB, built in {time.perf_counter() - t:.0f} s",
              flush=True)
        env = {**os.environ, "HOME": str(home)}
        proc = subprocess.Popen([sys.executable, "-m", "nni_manager", "view", str(exp), "--port", "0"], env=env,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            url = re.match(r"WebUI: (\S+)", proc.stdout.readline()).group(1)  # type: ignore[union-attr]
            ours = measure("nni-manager", url + "api/v1/nni", psutil.Process(proc.pid), args.trials, args.samples,
                           args.window)
        finally:
            proc.terminate()
            proc.wait(30)
        t = time.perf_counter()
        done = export_nni_db(exp)
        print(f"nni-manager export --nni-db: {done.metrics:,} metrics, {done.events:,} events, "
              f"{done.db.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        view = NniView(home, "bench001", exps, timeout=300)
        try:
            print(f"nnictl view: VIEWED after {time.perf_counter() - t:.1f} s", flush=True)
            nni = measure("NNI 3.0", view.api, psutil.Process(view.pid), args.trials, args.samples, args.window)
        finally:
            view.close()
        report(ours, nni, args.window)
    return 0


if __name__ == "__main__":
    sys.exit(main())
