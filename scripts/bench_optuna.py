"""An Optuna trial through the agent next to Optuna's own ways of running it, same machine, same objective.

Four sides run one objective (`--params` suggest_float, then `--calls` storage round trips:
set_user_attr, each one call to the storage) for `--trials` trials of a SQLite study:

* in-process: `study.optimize` in this process (no server, no network), one trial at a time;
* optuna-grpc: Optuna's own `run_grpc_proxy_server` for the same kind of SQLite study, the
  objective in one client process (`GrpcStorageProxy` on 127.0.0.1), one trial at a time;
* sqlite-procs: Optuna's multi-process mode: `--workers` processes started together, each
  `study.optimize` on the same shared SQLite file (what Optuna's docs call distributed mode);
* agent: `nni-manager optuna` on the local platform with trialConcurrency `--workers`: each trial a
  process started by the agent, its storage calls carried by the agent and the hub to Optuna's
  servicer in the manager.

Printed: the median round trip of one suggest_float and of one set_user_attr measured inside the
objective (over all calls of all trials), and the wall time per trial (the side's total wall time
over its trials, start-up included), with the ratios to in-process and to sqlite-procs. The agent's
trial time includes a fresh Python with optuna imported per trial (sqlite-procs pays it once per
worker, the others once): that start-up is measured alone (`python -c "import optuna"`).

    .venv/bin/python scripts/bench_optuna.py --trials 8 --calls 100 --params 10 --workers 2
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
    suggest, attrs = [], []
    x = 0.0
    for i in range(int(os.environ.get("BENCH_PARAMS", "10"))):
        t0 = time.perf_counter()
        x += trial.suggest_float("x%d" % i, 0, 1)
        suggest.append(time.perf_counter() - t0)
    for i in range(int(os.environ.get("BENCH_CALLS", "100"))):
        t0 = time.perf_counter()
        trial.set_user_attr("a%d" % i, i)
        attrs.append(time.perf_counter() - t0)
    with open(os.path.join(os.environ["BENCH_OUT"], "%d.json" % trial.number), "w") as f:
        json.dump({"suggest": suggest, "attr": attrs}, f)
    return x
'''

Timings = dict[str, list[float]]


def _calls(out: Path) -> Timings:
    found: Timings = {"suggest": [], "attr": []}
    for p in out.glob("*.json"):
        for kind, times in json.loads(p.read_text()).items():
            found[kind] += times
    return found


def _env(out: Path, args: argparse.Namespace) -> dict[str, str]:
    return {"BENCH_OUT": str(out), "BENCH_CALLS": str(args.calls), "BENCH_PARAMS": str(args.params)}


def in_process(work: Path, args: argparse.Namespace) -> tuple[float, Timings]:
    import optuna

    trials = args.trials
    out = work / "inproc"
    out.mkdir()
    os.environ.update(_env(out, args))
    sys.path.insert(0, str(work / "code"))
    import bench_objective

    study = optuna.create_study(storage=f"sqlite:///{work / 'inproc.db'}", study_name="b")
    t0 = time.perf_counter()
    study.optimize(bench_objective.objective, n_trials=trials)
    return (time.perf_counter() - t0) / trials, _calls(out)


def optuna_grpc(work: Path, args: argparse.Namespace) -> tuple[float, Timings]:
    import optuna
    from optuna.storages import GrpcStorageProxy, get_storage
    from optuna.storages._grpc.server import make_server

    trials = args.trials
    out = work / "grpc"
    out.mkdir()
    os.environ.update(_env(out, args))
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


def sqlite_procs(work: Path, args: argparse.Namespace) -> tuple[float, Timings]:
    """Optuna's multi-process mode: `--workers` processes on one SQLite file, started together."""
    import optuna

    out = work / "procs"
    out.mkdir()
    url = f"sqlite:///{work / 'procs.db'}"
    optuna.create_study(storage=url, study_name="b")
    shares = [args.trials // args.workers + (1 if i < args.trials % args.workers else 0) for i in range(args.workers)]
    env = {**os.environ, **_env(out, args), "PYTHONPATH": str(work / "code")}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", "import sys, optuna, bench_objective; "
                               "optuna.logging.set_verbosity(optuna.logging.WARNING); "
                               "optuna.load_study(study_name='b', storage=sys.argv[1])"
                               ".optimize(bench_objective.objective, n_trials=int(sys.argv[2]))", url, str(n)],
                              env=env) for n in shares if n]
    if any(p.wait() != 0 for p in procs):
        sys.exit("an Optuna worker process failed")
    return (time.perf_counter() - t0) / args.trials, _calls(out)


def agent(work: Path, args: argparse.Namespace) -> tuple[float, Timings]:
    trials = args.trials
    out = work / "agent"
    out.mkdir()
    config = work / "config.yml"
    config.write_text(f"trialCodeDirectory: {work / 'code'}\ntrialConcurrency: {args.workers}\n"
                      f"experimentWorkingDirectory: {work / 'exps'}\ntrainingService:\n  platform: local\n")
    env = {**os.environ, **_env(out, args)}
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
    parser.add_argument("--calls", type=int, default=100, help="set_user_attr calls per trial")
    parser.add_argument("--params", type=int, default=10, help="suggest_float calls per trial")
    parser.add_argument("--workers", type=int, default=2, help="processes of sqlite-procs, trialConcurrency of agent")
    args = parser.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="nmbo", dir="/tmp") as tmp:
        work = Path(tmp)
        (work / "code").mkdir()
        (work / "code" / "bench_objective.py").write_text(OBJECTIVE)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import optuna"], check=True)
        start_up = time.perf_counter() - t0
        load = os.getloadavg()[0]
        rows = {"in-process": in_process(work, args), "optuna-grpc": optuna_grpc(work, args),
                "sqlite-procs": sqlite_procs(work, args), "agent": agent(work, args)}
    print(f"{args.trials} trials, {args.params} suggest_float + {args.calls} set_user_attr each, {args.workers} "
          f"workers for sqlite-procs and agent; python -c 'import optuna': {start_up * 1000:.0f} ms "
          f"(load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; {os.cpu_count()} cores)")
    base = {k: statistics.median(rows["in-process"][1][k]) for k in ("suggest", "attr")}
    procs = {k: statistics.median(rows["sqlite-procs"][1][k]) for k in ("suggest", "attr")}
    base_trial, procs_trial = rows["in-process"][0], rows["sqlite-procs"][0]
    print(f"{'side':13} {'suggest_float':>13} {'x in-proc':>9} {'x procs':>8} {'set_user_attr':>13} {'x in-proc':>9} "
          f"{'x procs':>8} {'s/trial':>8} {'x in-proc':>9} {'x procs':>8}")
    for name, (per_trial, times) in rows.items():
        sug, att = statistics.median(times["suggest"]), statistics.median(times["attr"])
        print(f"{name:13} {sug * 1e6:10.0f} us {sug / base['suggest']:9.2f} {sug / procs['suggest']:8.2f} "
              f"{att * 1e6:10.0f} us {att / base['attr']:9.2f} {att / procs['attr']:8.2f} "
              f"{per_trial:8.3f} {per_trial / base_trial:9.2f} {per_trial / procs_trial:8.2f}")


if __name__ == "__main__":
    main()
