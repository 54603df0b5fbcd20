"""An Optuna trial through the agent next to Optuna's own ways of running it, same machine, same objective.

Three sides run one objective (3 suggest_float, then `--calls` storage round trips:
set_user_attr, each one call to the storage) for `--trials` trials, one at a time:

* in-process: `study.optimize` on the SQLite study (no server, no network);
* optuna-grpc: Optuna's own `run_grpc_proxy_server` for the same kind of SQLite study, the
  objective in one client process (`GrpcStorageProxy` on 127.0.0.1) — Optuna's distributed mode;
* agent: `nni-manager optuna` on the local platform: each trial a process started by the agent,
  its storage calls carried by the agent and the hub to Optuna's servicer in the manager.

Printed: the per-call round trip measured inside the objective (median over all calls of all
trials) and the wall time per trial, with the ratios to in-process and to optuna-grpc. The agent's
trial time includes a fresh Python with optuna imported per trial (the others pay that once):
that start-up is measured alone (`python -c "import optuna"`) and printed for scale.

    .venv/bin/python scripts/bench_optuna.py --trials 8 --calls 100
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

OBJECTIVE = '''
import json, os, time

def objective(trial):
    x = sum(trial.suggest_float("x%d" % i, 0, 1) for i in range(3))
    times = []
    for i in range(int(os.environ.get("BENCH_CALLS", "100"))):
        t0 = time.perf_counter()
        trial.set_user_attr("a%d" % i, i)
        times.append(time.perf_counter() - t0)
    with open(os.path.join(os.environ["BENCH_OUT"], "%d.json" % trial.number), "w") as f:
        json.dump(times, f)
    return x
'''


def _calls(out: Path) -> list[float]:
    return [t for p in out.glob("*.json") for t in json.loads(p.read_text())]


def in_process(work: Path, trials: int, calls: int) -> tuple[float, list[float]]:
    import optuna

    out = work / "inproc"
    out.mkdir()
    os.environ.update(BENCH_OUT=str(out), BENCH_CALLS=str(calls))
    sys.path.insert(0, str(work / "code"))
    import bench_objective

    study = optuna.create_study(storage=f"sqlite:///{work / 'inproc.db'}", study_name="b")
    t0 = time.perf_counter()
    study.optimize(bench_objective.objective, n_trials=trials)
    return (time.perf_counter() - t0) / trials, _calls(out)


def optuna_grpc(work: Path, trials: int, calls: int) -> tuple[float, list[float]]:
    import optuna
    from optuna.storages import GrpcStorageProxy, get_storage
    from optuna.storages._grpc.server import make_server

    out = work / "grpc"
    out.mkdir()
    os.environ.update(BENCH_OUT=str(out), BENCH_CALLS=str(calls))
    import bench_objective

    import socket

    with socket.socket() as s:  # make_server does not say which port it bound: pick a free one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = make_server(get_storage(f"sqlite:///{work / 'grpc.db'}"), "127.0.0.1", port)
    server.start()
    threading.Thread(target=server.wait_for_termination, daemon=True).start()
    try:
        storage = GrpcStorageProxy(host="127.0.0.1", port=port)
        storage.wait_server_ready(timeout=30)
        study = optuna.create_study(storage=storage, study_name="b")
        t0 = time.perf_counter()
        study.optimize(bench_objective.objective, n_trials=trials)
        per_trial = (time.perf_counter() - t0) / trials
        storage.close()
    finally:
        server.stop(None)
    return per_trial, _calls(out)


def agent(work: Path, trials: int, calls: int) -> tuple[float, list[float]]:
    out = work / "agent"
    out.mkdir()
    config = work / "config.yml"
    config.write_text(f"trialCodeDirectory: {work / 'code'}\ntrialConcurrency: 1\n"
                      f"experimentWorkingDirectory: {work / 'exps'}\ntrainingService:\n  platform: local\n")
    env = {**os.environ, "BENCH_OUT": str(out), "BENCH_CALLS": str(calls)}
    t0 = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "nni_manager", "optuna", "bench_objective:objective",
                             "--study-name", "b", "--storage", f"sqlite:///{work / 'agent.db'}",
                             "--n-trials", str(trials), "--config", str(config), "--plain", "--no-webui"],
                            capture_output=True, text=True, env=env, timeout=1800)
    total = time.perf_counter() - t0
    if result.returncode != 0:
        sys.exit(f"nni-manager optuna failed: {result.stderr.strip().splitlines()[-1:]}")
    return total / trials, _calls(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nmbo", dir="/tmp") as tmp:
        work = Path(tmp)
        (work / "code").mkdir()
        (work / "code" / "bench_objective.py").write_text(OBJECTIVE)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import optuna"], check=True)
        start_up = time.perf_counter() - t0
        rows = {"in-process": in_process(work, args.trials, args.calls),
                "optuna-grpc": optuna_grpc(work, args.trials, args.calls),
                "agent": agent(work, args.trials, args.calls)}
    print(f"{args.trials} trials, {args.calls} storage calls each; python -c 'import optuna': {start_up * 1000:.0f} ms "
          f"(load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores)")
    base_call = statistics.median(rows["in-process"][1])
    grpc_call = statistics.median(rows["optuna-grpc"][1])
    base_trial, grpc_trial = rows["in-process"][0], rows["optuna-grpc"][0]
    print(f"{'side':12} {'call (median)':>14} {'x in-proc':>10} {'x grpc':>8} {'s/trial':>9} {'x in-proc':>10} "
          f"{'x grpc':>8}")
    for name, (per_trial, times) in rows.items():
        call = statistics.median(times)
        print(f"{name:12} {call * 1e6:11.0f} us {call / base_call:10.2f} {call / grpc_call:8.2f} {per_trial:9.3f} "
              f"{per_trial / base_trial:10.2f} {per_trial / grpc_trial:8.2f}")


if __name__ == "__main__":
    main()
