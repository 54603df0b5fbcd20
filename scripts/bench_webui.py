"""WebUI / REST API latency and CPU on a large experiment store (issue: a 10,000-trial experiment
must stay responsive while a browser polls every 10 s).

Builds a store of N trials x M intermediate results (+ one final each) with the manager's own
Store API, serves it with `nni-manager view` (a separate process, so its CPU can be read), and
times the requests an open NNI WebUI makes: each 10 s tick is check-status, experiment,
experiment-metadata, trial-jobs, metric-data-latest and, past 100 trials, one
metric-data-range call per 20 trials (fired together, as the WebUI does).

    .venv/bin/python scripts/bench_webui.py [--trials 10000] [--metrics 100] [--ticks 3]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "manager"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))

from nni_manager.store import Store  # noqa: E402
from nni_manager.types import HyperParameters, TrialJobApplicationForm, TrialJobDetail, TrialJobStatus  # noqa: E402

T0 = 1_795_000_000_000


def build(directory: Path, trials: int, metrics: int) -> None:
    store = Store.open(directory)
    store.init_experiment("bench001", {"trial_command": "python t.py", "training_service": {"platform": "local"},
                                       "search_space": {"x": {"_type": "uniform", "_value": [0, 1]}},
                                       "tuner": {"name": "Random", "class_args": {"optimize_mode": "maximize"}},
                                       "trial_concurrency": 8, "max_trial_number": trials}, T0)
    seq = 0
    with store.transaction():
        for i in range(trials):
            tid = f"t{i:07d}"
            record = json.dumps({"parameter_id": i, "parameter_source": "algorithm", "parameters": {"x": i / trials},
                                 "parameter_index": 0})
            start = T0 + i * 1000
            store.save_trial(TrialJobDetail(id=tid, status=TrialJobStatus.SUCCEEDED, submit_time=start, sequence_id=i,
                                            form=TrialJobApplicationForm(i, HyperParameters(record, 0)),
                                            working_directory=f"/w/{tid}", start_time=start, end_time=start + 900))
            store.add_event(tid, TrialJobStatus.SUCCEEDED, "", start + 900)
            store.add_parameter(tid, 0, record)
            for k in range(metrics + 1):
                kind = "PERIODICAL" if k < metrics else "FINAL"
                seq += 1
                data = json.dumps({"parameter_id": i, "trial_job_id": tid, "type": kind, "sequence": k if k < metrics else 0,
                                   "value": json.dumps({"default": k / (metrics or 1), "loss": 1.0 / (k + 1)})})
                store.add_metric(tid, "a", "b", seq, seq, data, start + k)
    store.close()


def get(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return time.perf_counter() - started, len(body)


_etags: dict[str, str] = {}


def get_cached(url: str) -> tuple[float, int]:
    """As a browser's HTTP cache does: revalidate with the ETag of the last answer."""
    started = time.perf_counter()
    request = urllib.request.Request(url, headers={"If-None-Match": _etags[url]} if url in _etags else {})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            body = r.read()
            if r.headers.get("ETag"):
                _etags[url] = r.headers["ETag"]
    except urllib.error.HTTPError as exc:
        if exc.code != 304:
            raise
        body = b""
    return time.perf_counter() - started, len(body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--metrics", type=int, default=100, help="intermediate results per trial")
    ap.add_argument("--ticks", type=int, default=3, help="WebUI polling ticks to time")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exp = Path(tmp) / "bench001"
        t = time.perf_counter()
        build(exp, args.trials, args.metrics)
        size = (exp / "experiment.db").stat().st_size
        print(f"store: {args.trials} trials x {args.metrics + 1} metrics, {size / 1e6:.0f} MB, "
              f"built in {time.perf_counter() - t:.1f} s")
        env = {**os.environ, "HOME": tmp}
        proc = subprocess.Popen([sys.executable, "-m", "nni_manager", "view", str(exp), "--port", "0"], env=env,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            url = re.match(r"WebUI: (\S+)", proc.stdout.readline()).group(1)  # type: ignore[union-attr]
            api = url + "api/v1/nni"
            ps = psutil.Process(proc.pid)
            cpu0 = sum(ps.cpu_times()[:2])
            t, _ = get(api + "/trial-jobs")  # the first request loads the latest-metric index
            cpu1 = sum(ps.cpu_times()[:2])
            print(f"first request (loads finals + latest of {args.trials * (args.metrics + 1):,} metric rows): "
                  f"{t * 1000:.0f} ms, manager CPU {cpu1 - cpu0:.2f} s")
            rows = []
            for path in ("/check-status", "/experiment", "/trial-jobs", "/metric-data-latest",
                         "/metric-data-range/0/19", f"/metric-data/t{args.trials // 2:07d}", "/export-data"):
                times = []
                for _ in range(5):
                    dt, n = get(api + path)
                    times.append(dt)
                rows.append((path, statistics.median(times), n))
            print(f"{'endpoint':36} {'median ms':>10} {'bytes':>12}")
            for path, dt, n in rows:
                print(f"{path:36} {dt * 1000:10.1f} {n:12,}")
            ranges = [f"{api}/metric-data-range/{i}/{i + 20}" for i in range(0, args.trials, 20)]
            with ThreadPoolExecutor(max_workers=6) as pool:  # a browser opens about 6 connections per host
                for label, ticks in (("first tick, empty browser cache", 1), ("later ticks, cache revalidated", args.ticks)):
                    tick_times = []
                    cpu_start = sum(ps.cpu_times()[:2])
                    for _ in range(ticks):
                        started = time.perf_counter()
                        for path in ("/check-status", "/experiment", "/experiment-metadata", "/trial-jobs"):
                            get(api + path)
                        list(pool.map(get_cached, ranges + [api + "/metric-data-latest"]))
                        tick_times.append(time.perf_counter() - started)
                    cpu_tick = (sum(ps.cpu_times()[:2]) - cpu_start) / ticks
                    print(f"WebUI tick ({len(ranges)} range calls + latest + 4), {label}: median "
                          f"{statistics.median(tick_times):.2f} s wall, manager CPU {cpu_tick:.2f} s per tick "
                          f"= {cpu_tick / 10 * 100:.0f} % of a core at the WebUI's 10 s interval")
            dt, n = get(api + "/metric-data")
            print(f"/metric-data (everything, what the WebUI asks below 100 trials): {dt:.2f} s, {n / 1e6:.0f} MB")
            started = time.perf_counter()
            dt, _ = get(api + "/check-status")
            print(f"/check-status right after: {dt * 1000:.1f} ms")
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
