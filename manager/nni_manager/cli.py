"""`nni-manager`: run an NNI experiment config, list experiments, their trials and logs, stop and
resume them. Wherever an experiment is named, its id works as with `nnictl` (or its directory)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from nni_manager import experiment_lock
from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.metrics import metric_number, metric_value
from nni_manager.types import TrialJobDetail

EXIT_TUNER_FAILED = 1
EXIT_CONFIG = 2
EXIT_NO_WORKER = 3
EXIT_INTERRUPTED = 130
STUDY_STORAGE_ENV = "NNI_MANAGER_STUDY_STORAGE"  # `optuna`: the storage URL when --storage is not given
STARTED_LINE = "nni-manager: experiment {} started"  # (plain output) start-up is over: --detach returns
_DETACH_START_S = 600.0  # a cluster's first pull of the agent image can take minutes
RUN_EXIT_CODES = f"""exit status:
  0    the experiment is done (maxTrialNumber, maxExperimentDuration or the tuner's end)
  {EXIT_TUNER_FAILED}    the tuner / assessor / advisor failed (status ERROR)
  {EXIT_CONFIG}    the config or an argument is wrong (nothing was started)
  {EXIT_NO_WORKER}    no worker could start, every worker was lost for good, or the platform refused the
       experiment at start or could not be reached (status ERROR)
  {EXIT_INTERRUPTED}  stopped by the user (Ctrl-C, SIGTERM, DELETE /experiment)
On failure the last line on stderr says why (one line: the field or the cause, and the fix).
--dry-run and --detach check what run checks and exit with the same status."""


class UsageError(Exception):
    """A wrong command-line argument (exit 2, no traceback)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nni-manager", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment (NNI v2 or v1 YAML config)",
                         description="Run an experiment until maxTrialNumber / maxExperimentDuration / the tuner "
                                     "is done. Ctrl-C cancels the running trials and stops cleanly.",
                         epilog=RUN_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("config", type=Path, help="experiment config YAML")
    run.add_argument("--experiment-id", help="resume this experiment (same experimentWorkingDirectory)")
    run.add_argument("--plain", action="store_true", help="plain log lines instead of the live table")
    run.add_argument("--dry-run", action="store_true",
                     help="print what would be submitted (the Kubernetes objects as YAML, the SSH commands, ...) "
                          "and exit; nothing is started")
    _run_arguments(run)
    resume = sub.add_parser("resume", help="resume a stopped experiment by id (nnictl resume)",
                            description="Run an experiment again with the config file it was started with: trials "
                                        "still running are re-attached, ended ones are kept, the tuner goes on.",
                            epilog=RUN_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    resume.add_argument("experiment_id", metavar="EXPERIMENT", help="an experiment id or its directory")
    resume.add_argument("--plain", action="store_true", help="plain log lines instead of the live table")
    _run_arguments(resume)
    list_cmd = sub.add_parser("list", help="list experiments (nnictl experiment list)",
                              description="The running experiments; --all also the stopped ones.")
    list_cmd.add_argument("--all", action="store_true", help="stopped experiments too")
    stop_cmd = sub.add_parser("stop", help="stop a running experiment by id (nnictl stop)",
                              description="Stop the experiment as Ctrl-C in its terminal would: its running trials "
                                          "are cancelled, its workers cleaned up; waits until that is done.")
    stop_cmd.add_argument("experiment_id", metavar="EXPERIMENT", help="the id of a running experiment")
    cleanup_cmd = sub.add_parser("cleanup", help="delete what a Kubernetes experiment whose manager died left in the "
                                 "cluster", description="Delete the experiment's owner ConfigMap: the cluster's garbage "
                                 "collector deletes its pods, jobs, Secrets, ConfigMaps, relay and RBAC objects.")
    cleanup_cmd.add_argument("experiment_id", metavar="EXPERIMENT", nargs="?", help="an experiment id or its directory")
    cleanup_cmd.add_argument("--all-orphans", action="store_true",
                             help="every Kubernetes experiment known here whose manager is not running")
    view_cmd = sub.add_parser("view", help="serve a stored experiment's WebUI and REST API, read-only",
                              description="Serve NNI's WebUI and REST API for an experiment directory (also "
                                          "one copied from another machine) until Ctrl-C.")
    view_cmd.add_argument("experiment", metavar="EXPERIMENT", help="an experiment id (as `nni-manager list` shows) or its directory")
    _web_arguments(view_cmd)
    export_cmd = sub.add_parser("export", help="write an experiment in NNI's format (db/nni.sqlite) for NNI's tools",
                                description="Write NNI 3.0's experiment directory (db/nni.sqlite, trial logs) from our "
                                            "store and register it in ~/nni-experiments/.experiment, so that "
                                            "`nnictl view ID` and NNI's other tools open it.")
    export_cmd.add_argument("--nni-db", required=True, metavar="EXPERIMENT",
                            help="an experiment id or <experimentWorkingDirectory>/<experiment id>")
    export_cmd.add_argument("--out", type=Path, metavar="DIR",
                            help="NNI's experimentWorkingDirectory to write DIR/<experiment id>/ into (default: the "
                                 "one EXPERIMENT_DIR is in, i.e. in place)")
    export_cmd.add_argument("--no-register", action="store_true",
                            help="leave ~/nni-experiments/.experiment alone (nnictl view needs the entry)")
    optuna_cmd = sub.add_parser("optuna", help="run an Optuna study's trials as an experiment (docs/optuna.md)",
                                description="Run n_trials trials of an Optuna study, each one Optuna trial of an "
                                            "unmodified objective, on the config's platform; the trials reach the "
                                            "study's storage only through their agents.",
                                epilog=RUN_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    optuna_cmd.add_argument("target", metavar="TARGET",
                            help="the objective: file.py:function or module:function in trialCodeDirectory")
    optuna_cmd.add_argument("--study-name", required=True, help="the study (created if it does not exist)")
    optuna_cmd.add_argument("--storage", metavar="URL",
                            help="an Optuna storage URL the manager opens (e.g. sqlite:///study.db); default: "
                                 f"${STUDY_STORAGE_ENV} (keeps a database password out of the process list)")
    optuna_cmd.add_argument("--n-trials", type=int, required=True, help="how many Optuna trials to run")
    optuna_cmd.add_argument("--config", type=Path, required=True, metavar="CONFIG.yml",
                            help="an NNI v2 config without searchSpace or tuner (trainingService, trialConcurrency, "
                                 "trialCodeDirectory, ...)")
    optuna_cmd.add_argument("--direction", action="append", choices=("maximize", "minimize"), default=[],
                            help="a new study's direction; repeat for a multi-objective study (default: minimize)")
    optuna_cmd.add_argument("--sampler", metavar="NAME", help="an optuna.samplers class, e.g. TPESampler")
    optuna_cmd.add_argument("--pruner", metavar="NAME", help="an optuna.pruners class, e.g. MedianPruner")
    optuna_cmd.add_argument("--plain", action="store_true", help="plain log lines instead of the live table")
    optuna_cmd.add_argument("--experiment-id", help=argparse.SUPPRESS)  # --detach's child
    _run_arguments(optuna_cmd)
    trials = sub.add_parser("trials", help="table of an experiment's trials (also while it runs)")
    trials.add_argument("experiment", metavar="EXPERIMENT", help="an experiment id (as `nni-manager list` shows) or its directory")
    logs = sub.add_parser("logs", help="print a trial's stdout (or stderr)")
    logs.add_argument("experiment", metavar="EXPERIMENT", help="an experiment id (as `nni-manager list` shows) or its directory")
    logs.add_argument("trial_id")
    logs.add_argument("--stderr", action="store_true", help="print trial.stderr instead of trial.stdout")
    logs.add_argument("--trial-log", action="store_true",
                      help="print only trial.log: what NNI's SDK logs, and on the local platform the trial's print() "
                           "output (shown after trial.stdout by default)")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing (trial.stdout and trial.log, as without it) until the trial ends")
    logs.add_argument("--replica", metavar="ROLE-INDEX",
                      help="for a trial on several replicas (TFJob, Framework): only this one's log, e.g. worker-0 "
                           "(default: every replica's, one after the other)")
    args = parser.parse_args(argv)
    try:
        if args.command in ("run", "resume"):
            _web_options(args)  # a wrong --port is refused by every mode alike (also with --no-webui)
            if args.command == "resume":
                if _study_resume(args):  # an Optuna study's experiment: its `optuna` command again
                    return _optuna(args)
                args.config, args.experiment_id = _resumable(args.experiment_id)
                args.dry_run = False
            if args.dry_run:
                return _dry_run(args.config)
            if args.detach:
                return _detach(args)
            keep = sys.stdout.isatty() if args.keep_serving is None else args.keep_serving
            return _run(args.config, args.experiment_id, args.plain, None if args.no_webui else _web_options(args),
                        keep)
        if args.command == "optuna":
            return _optuna(args)
        if args.command == "list":
            return _list(args.all)
        if args.command == "stop":
            return _stop(args.experiment_id)
        if args.command == "cleanup":
            return _cleanup(args.experiment_id, args.all_orphans)
        if args.command == "view":
            return _view(_experiment_dir(args.experiment), _web_options(args))
        if args.command == "export":
            return _export(_experiment_dir(args.nni_db), args.out, not args.no_register)
        if args.command == "trials":
            return _trials(_experiment_dir(args.experiment))
        return _logs(_experiment_dir(args.experiment), args.trial_id, args.stderr, args.follow, args.replica,
                     args.trial_log)
    except (ConfigError, UsageError, experiment_lock.ExperimentBusy) as exc:
        print(f"nni-manager: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _dry_run(config_path: Path) -> int:
    from nni_manager.startup import preflight

    backend = preflight(load_config(config_path))  # what run checks before it creates anything
    print(backend.render().text)
    return 0


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    _web_arguments(parser)
    parser.add_argument("--no-webui", action="store_true", help="serve no WebUI / REST API (open no TCP port)")
    parser.add_argument("--keep-serving", action=argparse.BooleanOptionalAction, default=None,
                        help="after the experiment ends, keep serving the WebUI until Ctrl-C or `nni-manager stop "
                             "ID`, as NNI does. Default: when the output is a terminal; --detach always keeps "
                             "serving. Without a terminal (nohup, a CI job) pass --keep-serving to keep it")
    parser.add_argument("--detach", action="store_true",
                        help="run in the background: print the id and the WebUI's URL and return; the WebUI stays "
                             "after the end until `nni-manager stop ID` (output in <experimentWorkingDirectory>/"
                             "<id>/detach.log)")


def _experiment_dir(ref: str) -> Path:
    from nni_manager.experiments import ExperimentNotFound, resolve

    try:
        return resolve(ref)
    except ExperimentNotFound as exc:
        raise UsageError(str(exc)) from None


def _resumable(ref: str) -> tuple[Path, str]:
    """(the config file, the id) to resume experiment `ref` with."""
    directory = _experiment_dir(ref)
    store = _open_store(directory)
    try:
        row = store.experiment()
    finally:
        store.close()
    config_file = (row.get("config") or {}).get("config_file")
    if not config_file:
        raise UsageError(f"experiment {row.get('id', ref)} was not started from a config file: resume it with "
                         f"`nni-manager run CONFIG --experiment-id {row.get('id', ref)}`")
    if not Path(config_file).is_file():
        raise UsageError(f"experiment {row['id']} was started from {config_file}, which is gone: resume it with "
                         f"`nni-manager run CONFIG --experiment-id {row['id']}`")
    return Path(config_file), str(row["id"])


def _study_resume(args: argparse.Namespace) -> bool:
    """For `resume` of an experiment that ran an Optuna study: fill `args` as its `optuna` command
    (nni_manager.optuna.study.save_spec kept it) and say True; False for any other experiment."""
    from nni_manager.optuna.study import saved_spec

    directory = _experiment_dir(args.experiment_id)
    store = _open_store(directory)
    try:
        row, spec = store.experiment(), saved_spec(store)
    finally:
        store.close()
    if spec is None:
        return False
    experiment_id = str(row.get("id") or directory.name)
    if not spec["storage"] and not os.environ.get(STUDY_STORAGE_ENV):
        raise UsageError(f"experiment {experiment_id}'s study storage URL holds a password, which is not kept: "
                         f"set {STUDY_STORAGE_ENV} to the URL and resume again")
    config = spec["config"]
    if isinstance(config, str) and not Path(config).is_file():
        raise UsageError(f"experiment {experiment_id} was started from {config}, which is gone: run `nni-manager "
                         f"optuna ... --config CONFIG.yml` again with the same --study-name (the study keeps its trials)")
    args.target, args.study_name, args.n_trials = spec["target"], spec["study_name"], spec["n_trials"]
    args.storage, args.direction = spec["storage"] or None, spec["directions"]
    args.sampler, args.pruner, args.experiment_id = spec["sampler"], spec["pruner"], experiment_id
    args.config = Path(config) if isinstance(config, str) else config
    return True


def _list(show_all: bool) -> int:
    from rich.console import Console
    from rich.table import Table

    from nni_manager.experiments import list_all

    rows = [e for e in list_all() if show_all or e.running]
    if not rows:
        print("no running experiment" + ("" if show_all else " (`nni-manager list --all` shows stopped ones)"))
        return 0
    table = Table("ID", "Name", "Status", "Platform", "Started", "WebUI / directory", *(["Why it ended"] if show_all
                                                                                       else []), box=None)
    for e in rows:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.start_time / 1000)) if e.start_time else ""
        table.add_row(e.id, e.name, e.status + (" (running)" if e.running and e.status in ("DONE", "ERROR") else ""),
                      e.platform, started, e.url or str(e.directory or ""),
                      *([("" if e.running else e.reason)] if show_all else []))
    Console(width=None if sys.stdout.isatty() else 1000).print(table)  # a pipe: one line per experiment
    return 0


def _stop(ref: str) -> int:
    from nni_manager.experiments import ExperimentNotFound, stop

    try:
        stopped = stop(ref)
    except ExperimentNotFound as exc:
        raise UsageError(str(exc)) from None
    except (ProcessLookupError, TimeoutError) as exc:
        print(f"nni-manager: {exc}", file=sys.stderr)
        return EXIT_TUNER_FAILED
    print(f"stopped experiment {stopped.id}")
    return 0


def _cleanup(ref: str | None, all_orphans: bool) -> int:
    from nni_manager.backends.kubernetes.cleanup import cleanup

    if bool(ref) == all_orphans:
        raise UsageError("cleanup takes an experiment id or --all-orphans (one of the two)")
    ok = True
    for done, line in cleanup(ref, all_orphans):
        print(f"nni-manager: {line}", file=sys.stdout if done else sys.stderr)
        ok = ok and done
    return 0 if ok else EXIT_TUNER_FAILED


DETACH_LOG = "detach.log"  # in the experiment's own directory: it holds the WebUI's token URL


def _private_dir(path: Path) -> Path:
    """`path` as a directory of this user's alone (made 0700, or one of ours already: not a link,
    our uid), for a background run's log: a shared experimentWorkingDirectory must not let anyone
    else plant it or read the WebUI token it holds."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise UsageError(f"cannot make the experiment directory {path}: {e.strerror or e}") from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise UsageError(f"{path} is not a directory of yours (someone else made it, or it is a link): "
                         "use another --experiment-id or experimentWorkingDirectory")
    os.chmod(path, 0o700)
    return path


def _own_file(path: Path) -> int:
    """An append descriptor of `path`, created 0600, never through a link nor into someone else's file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise UsageError(f"cannot write the background run's log {path}: {e.strerror or e}") from e
    if os.fstat(fd).st_uid != os.getuid():
        os.close(fd)
        raise UsageError(f"{path} belongs to someone else: remove it, or use another --experiment-id")
    os.fchmod(fd, 0o600)
    return fd


def _detach(args: argparse.Namespace, config=None, command: list[str] | None = None,
            env: dict[str, str] | None = None) -> int:
    """Start the same `run` (or `command`, checked as `config`, with `env`) in a new session, wait
    for its WebUI line (or its end), return."""
    import subprocess

    from nni_manager.service.nni_api import new_id
    from nni_manager.startup import preflight

    if config is None:
        config = load_config(args.config)  # a config error now, in this terminal
        preflight(config)
    experiment_id = args.experiment_id or new_id(8)
    root = Path(config.experiment_working_directory).expanduser()
    experiment_lock.check_free(root / experiment_id, experiment_id)  # refused here, before the log is touched
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = _private_dir(root / experiment_id) / DETACH_LOG
    argv = [sys.executable, "-m", "nni_manager", *(command or ["run", str(args.config)]), "--experiment-id",
            experiment_id, "--plain",
            "--keep-serving" if args.keep_serving is not False else "--no-keep-serving",
            "--port", str(args.port), "--bind", args.bind, "--url-prefix", args.url_prefix]
    if args.no_webui:
        argv.append("--no-webui")
    fd = _own_file(log_path)
    offset = os.fstat(fd).st_size  # the log is appended to by every run of this id: read only this one's
    log = os.fdopen(os.open(log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")  # still readable if a
    # start-up refused in the child removes the experiment's directory (a config error leaves nothing)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                                close_fds=True, env=env)
    finally:
        os.close(fd)
    with log:
        deadline = time.monotonic() + _DETACH_START_S
        url, started, lines = "", False, []
        while not started and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            lines = _read_from(log, offset)
            url = next((line.split(None, 1)[1].strip() for line in lines if line.startswith("WebUI: ")), "")
            started = STARTED_LINE.format(experiment_id) in lines
        if not started and proc.poll() is not None:  # start-up failed: its one line and its status, as `run`
            lines = _read_from(log, offset)
            reason = next((line for line in reversed(lines) if line.startswith("nni-manager: ")), "")
            print(reason or f"nni-manager: the experiment exited during start-up ({proc.returncode}); see {log_path}",
                  file=sys.stderr)
            return proc.returncode or EXIT_NO_WORKER
    state = "runs" if started else "is still starting"
    print(f"experiment {experiment_id} {state} in the background (pid {proc.pid})")
    if url:
        print(f"WebUI: {url}")
    print(f"output: {log_path}\nstop it with: nni-manager stop {experiment_id}")
    return 0


def _read_from(log: BinaryIO, offset: int) -> list[str]:
    log.seek(offset)
    return log.read().decode(errors="replace").splitlines()


def _web_arguments(parser: argparse.ArgumentParser) -> None:
    from nni_manager.webui import DEFAULT_BIND, DEFAULT_PORT

    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port of NNI's WebUI and REST API (default {DEFAULT_PORT}, as NNI; the next free one "
                             "if taken)")
    parser.add_argument("--bind", default=DEFAULT_BIND, metavar="ADDRESS",
                        help=f"address to serve on (default {DEFAULT_BIND}: only your own user's processes on this "
                             "machine are served). Any other address requires the token printed in the WebUI URL "
                             "(your own processes on this machine still need none); `ssh -L` also works")
    parser.add_argument("--url-prefix", default="", help="serve under /PREFIX/ (NNI's urlPrefix), e.g. behind a proxy")


def _web_options(args: argparse.Namespace):  # -> WebOptions
    from nni_manager.webui.runner import WebOptions

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a port number (0-65535): pass e.g. --port 8080, or --port 0 "
                         "for any free one")
    return WebOptions(port=args.port, bind=args.bind, url_prefix=args.url_prefix)


def _view(experiment_dir: Path, web) -> int:  # web: WebOptions
    from nni_manager.webui.runner import serve_stored

    _open_store(experiment_dir).close()  # a clear error for a directory without an experiment
    experiment_lock.check_free(experiment_dir, experiment_dir.name)  # its manager serves it (and owns its entry)
    asyncio.run(serve_stored(experiment_dir, web))
    return 0


def _export(experiment_dir: Path, out: Path | None, register: bool) -> int:
    from nni_manager.webui.nni_db import export_nni_db

    _open_store(experiment_dir).close()  # a clear error for a directory without an experiment
    done = export_nni_db(experiment_dir, out, register=register)
    for note in done.notes:
        print(f"nni-manager: note: {note}", file=sys.stderr)
    print(f"wrote {done.db}: {done.trials} trials, {done.metrics} metrics, {done.events} trial events")
    view = f"nnictl view {done.experiment_id} --experiment_dir {done.working_directory} --port 8080"
    print(f"open it with NNI: {view}" + ("" if done.registered else "  (needs its entry in ~/nni-experiments/.experiment)"))
    return 0


def _run(config_path: Path, experiment_id: str | None, plain: bool, web=None,  # web: WebOptions | None
         keep_serving: bool = False, *, config=None, make_experiment=None) -> int:
    """Run an experiment to its end; `config` (already checked) and `make_experiment` (an
    Experiment class or factory) replace the config file's and the tuner's (nni-manager optuna)."""
    from nni_manager.dispatcher import DispatcherError
    from nni_manager.experiment import NO_WORKER, Experiment, NoWorkerError, TrialSummary
    from nni_manager.service.nni_api import new_id
    from nni_manager.startup import preflight
    from nni_manager.ui import ExperimentView, final_summary
    from nni_manager.webui.runner import LiveWebUI, live_webui

    if config is None:
        config = load_config(config_path)
        preflight(config)  # as --dry-run and --detach: a config mistake creates nothing
    experiment_id = experiment_id or new_id(8)  # known before the run: the WebUI's manifest entry needs it
    experiment_dir = Path(config.experiment_working_directory).expanduser() / experiment_id
    created = not experiment_dir.exists()
    view: ExperimentView | None = None

    def on_event(kind: str, t: TrialSummary) -> None:
        if view is not None:
            view.event(kind, t)

    def on_started() -> None:
        if plain:
            print(STARTED_LINE.format(experiment_id), flush=True)

    experiment = (make_experiment or Experiment)(config, experiment_id=experiment_id, on_event=on_event,
                                                 on_started=on_started)
    # held until this process exits: before the WebUI registers, so a second manager touches nothing
    experiment_lock.acquire(experiment_dir, experiment_id)
    view = ExperimentView(experiment, live=False if plain else None)
    _console_notices(config)
    webui: LiveWebUI | None = None
    summarised = False

    def summary() -> None:  # once: before "the WebUI stays until Ctrl-C", not after it
        nonlocal summarised
        if not summarised:
            summarised = True
            view.__exit__(None, None, None)  # the live table ends here; the summary follows it
            print(final_summary(experiment.result()), flush=True)

    async def go() -> bool:
        nonlocal webui, summarised
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        stopping = False

        def stop() -> None:  # first Ctrl-C / SIGTERM / DELETE /experiment: cancel trials and clean up
            nonlocal stopping
            if webui is not None and webui.serving_after_end:
                webui.release()
                return
            if not stopping:
                stopping = True
                print("\nnni-manager: stopping: cancelling running trials ...", file=sys.stderr, flush=True)
                task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        async with live_webui(experiment, experiment_id, web, stop) as webui:
            reopened = True
            while reopened:  # raising maxTrialNumber on a DONE experiment runs it on, as in NNI
                try:
                    await experiment.run()
                except asyncio.CancelledError:
                    webui.finish("STOPPING")
                    return False
                except (DispatcherError, NoWorkerError) as exc:  # NNI keeps its WebUI up to show the error too
                    webui.finish("ERROR", str(exc))
                    if keep_serving and webui.server is not None:
                        summary()
                        try:
                            await webui.serve_until_stopped("has failed")
                        except asyncio.CancelledError:  # stopped while showing the error: still the error
                            pass
                    raise
                except Exception as exc:
                    webui.finish("ERROR", str(exc))
                    raise
                webui.finish("DONE")
                reopened = False
                if keep_serving and webui.server is not None:
                    summary()
                    reopened = await webui.serve_until_stopped("is done")
                else:
                    reopened = webui.end_without_serving()
                if reopened:
                    summarised = False  # the run goes on: its summary comes again at its new end
        return True

    with view:
        try:
            finished = asyncio.run(go())
        except (DispatcherError, NoWorkerError):  # trials cancelled: the summary and the reason follow
            finished = True
        except ConfigError:  # found at start (e.g. the cluster's address): a new experiment leaves nothing
            if created and not experiment.trials:
                _forget(experiment_dir, experiment_id)
            raise
        except Exception as exc:  # noqa: BLE001 - a platform that refused: one line; the traceback is in the log
            reason = " ".join(str(exc).split()) or type(exc).__name__
            log = experiment_dir / "log" / "nnimanager.log"
            if not experiment.started:
                print(f"nni-manager: the experiment could not start: {reason} (details: {log})", file=sys.stderr)
                return EXIT_NO_WORKER
            summary()
            print(f"nni-manager: the experiment failed: {reason} (details: {log})", file=sys.stderr)
            return EXIT_TUNER_FAILED
    summary()
    if experiment.error:  # ERROR, never success, even when stopped while showing it
        print(f"nni-manager: {experiment.error}", file=sys.stderr)
        return EXIT_NO_WORKER if experiment.stop_reason == NO_WORKER else EXIT_TUNER_FAILED
    return 0 if finished else EXIT_INTERRUPTED


def _optuna(args: argparse.Namespace) -> int:
    """`nni-manager optuna`: the study's trials as an experiment (nni_manager.optuna)."""
    import functools

    from nni_manager.optuna.study import StudyExperiment, StudySpec, check_spec, create_study, study_config
    from nni_manager.startup import preflight

    _web_options(args)
    storage_url = args.storage or os.environ.get(STUDY_STORAGE_ENV, "")
    os.environ.pop(STUDY_STORAGE_ENV, None)  # the manager's alone: its agents and their trials inherit nothing
    if not storage_url:
        raise UsageError(f"--storage: no study storage: pass --storage URL or set {STUDY_STORAGE_ENV}")
    spec = StudySpec(args.target, args.study_name, storage_url, args.n_trials, args.direction, args.sampler,
                     args.pruner)
    check_spec(spec)
    config = study_config(args.config, spec)
    preflight(config, tuner=False)
    source = args.config if isinstance(args.config, Mapping) else str(args.config.expanduser().resolve())
    if args.detach:
        if not isinstance(source, str):
            raise UsageError("--detach: this study's experiment was started from Python with a config mapping: "
                             "resume it without --detach")
        command = ["optuna", spec.target, "--study-name", spec.study_name,  # the URL goes in the environment
                   "--n-trials", str(spec.n_trials), "--config", source]
        for d in spec.directions:
            command += ["--direction", d]
        command += ["--sampler", spec.sampler] if spec.sampler else []
        command += ["--pruner", spec.pruner] if spec.pruner else []
        return _detach(args, config, command, {**os.environ, STUDY_STORAGE_ENV: spec.storage_url})
    storage = create_study(spec)
    keep = sys.stdout.isatty() if args.keep_serving is None else args.keep_serving
    return _run(args.config, args.experiment_id, args.plain, None if args.no_webui else _web_options(args), keep,
                config=config, make_experiment=functools.partial(StudyExperiment, study=spec, storage=storage,
                                                                 source=source))


def _console_notices(config) -> None:  # config: ExperimentConfig
    """What the user must see (nni_manager.notices: e.g. dependencies that cannot be shipped) on this console."""
    import logging

    from nni_manager.config import secret_values
    from nni_manager.notices import console_handler, log

    if not any(getattr(h, "nni_console", False) for h in log.handlers):
        handler = console_handler(secret_values(config))
        handler.nni_console = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        if log.level == logging.NOTSET:
            log.setLevel(logging.WARNING)


def _forget(experiment_dir: Path, experiment_id: str) -> None:
    """Remove what a run refused at start created: its directory and its manifest entry."""
    import shutil

    from nni_manager.webui import manifest

    experiment_lock.release(experiment_dir)
    shutil.rmtree(experiment_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        manifest.update(lambda d: d.pop(experiment_id, None))


def _open_store(experiment_dir: Path):  # -> Store
    from nni_manager.store import DB_NAME, Store

    if not (experiment_dir / DB_NAME).is_file():
        raise UsageError(f"{experiment_dir} holds no experiment ({DB_NAME} missing); pass "
                         "<experimentWorkingDirectory>/<experiment id>, as printed by `nni-manager run`")
    return Store.open_readonly(experiment_dir)


def _trials(experiment_dir: Path) -> int:
    from rich.console import Console

    from nni_manager.experiment import TrialSummary
    from nni_manager.ui import fmt_value, status_line, trial_table

    store = _open_store(experiment_dir)
    try:
        details, metrics = store.trials(), store.metrics()
    finally:
        store.close()
    summaries: dict[str, TrialSummary] = {}
    study_values: dict[str, list] = {}  # a multi-objective study's trial: every value in the final column
    for d in details:
        record = json.loads(d.form.hyper_parameters.value)
        shown = record.get("parameters") or {}
        if isinstance(record.get("optuna"), dict):  # an Optuna study's trial: its number, then its params
            shown = {"optuna_trial": record["optuna"].get("number"), **shown}
            if len(record["optuna"].get("values") or ()) > 1:
                study_values[d.id] = [fmt_value(v) for v in record["optuna"]["values"]]
        summaries[d.id] = TrialSummary(d.id, d.sequence_id, record.get("parameter_id"),
                                       shown, d.status, gpu_indices=d.gpu_indices,
                                       start_time=d.start_time, end_time=d.end_time, message=d.message)
    for m in metrics:
        trial = summaries.get(m["trial_id"])
        if trial is None:
            continue
        value = metric_value(m["data"], "nni-manager trials", m["trial_id"])
        if m["type"] == "FINAL":
            trial.final, trial.metric = value, metric_number(value)
        elif m["type"] == "PERIODICAL":
            trial.latest = value
    for trial_id, values in study_values.items():
        summaries[trial_id].final = "[" + ", ".join(values) + "]"
    rows = sorted(summaries.values(), key=lambda t: t.sequence_id)
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(trial_table(rows))
    console.print(status_line(rows, experiment_dir))
    return 0


def _open_log(experiment_dir: Path, trial: TrialJobDetail, name: str, platform: str) -> BinaryIO | None:
    """The copy streamed to the manager; else a local trial's own directory (never a directory
    an agent reported elsewhere: see local_files)."""
    from nni_manager.local_files import open_trial_log

    return open_trial_log(experiment_dir, trial, name, platform)


def _copy_out(f: BinaryIO, out: BinaryIO, header: bytes = b"") -> int:
    """Copy the rest of `f` to `out` in bounded pieces (a log may be larger than memory);
    `header` goes first, only if there is something to copy."""
    n = 0
    while chunk := f.read(1 << 20):
        if header:
            out.write(header)
            header = b""
        out.write(chunk)
        n += len(chunk)
    out.flush()
    return n


# C0 controls but tab, newline and carriage return (progress bars), DEL, and C1 controls: what a
# trial's output could use to clear the screen, retitle the window or hide text in a terminal.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c not in (0x09, 0x0A, 0x0D)}


class _Terminal:
    """A binary writer to a terminal that shows control bytes escaped (`\\x1b`), never acted on."""

    def __init__(self, text_out) -> None:  # a text stream (sys.stdout)
        import codecs

        self._out = text_out
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data: bytes) -> int:
        self._out.write(self._decoder.decode(data).translate(_CONTROLS))
        return len(data)

    def flush(self) -> None:
        self._out.flush()


def _logs(experiment_dir: Path, trial_id: str, stderr: bool, follow: bool, replica: str | None,
          trial_log: bool = False) -> int:
    from nni_manager.local_files import open_in

    replicas_dir = experiment_dir / "trials" / trial_id / "replicas"
    name = "trial.log" if trial_log else "trial.stderr" if stderr else "trial.stdout"
    replicas = sorted(p.name for p in replicas_dir.iterdir()) if replicas_dir.is_dir() else []
    if replica is not None and replica not in replicas:
        raise UsageError(f"trial {trial_id} has no replica {replica!r}; its replicas: {', '.join(replicas) or 'none'}")
    out: BinaryIO = _Terminal(sys.stdout) if sys.stdout.isatty() else sys.stdout.buffer  # type: ignore[assignment]
    if replicas and replica is None:
        if follow:
            raise UsageError(f"trial {trial_id} runs on several replicas: pick one to follow with --replica "
                             f"({', '.join(replicas)})")
        for label in replicas:  # one after the other, each under a header, as `tail` does
            print(f"==> {label} <==", flush=True)
            f = open_in(experiment_dir, replicas_dir / label, name)
            if f is not None:
                with f:
                    _copy_out(f, out)
        return 0
    store = _open_store(experiment_dir)
    try:
        platform = str(((store.experiment().get("config") or {}).get("training_service") or {}).get("platform")
                       or "local")

        def trial() -> TrialJobDetail:
            for t in store.trials():
                if t.id == trial_id:
                    return t
            raise UsageError(f"no trial {trial_id!r} in {experiment_dir}; pick one from `nni-manager trials DIR`")

        # NNI's SDK sends a local trial's print() to trial.log (nni/runtime/log.py): after
        # trial.stdout, plain and --follow alike; a header names the file whenever it changes
        # (as `tail -f` does for several files)
        names = [name, "trial.log"] if name == "trial.stdout" and not replica else [name]
        offsets = dict.fromkeys(names, 0)
        shown = name
        while True:
            ended = trial().status.is_terminal  # read before the files, so no tail bytes are missed
            for n in names:
                f = (open_in(experiment_dir, replicas_dir / replica, n) if replica
                     else _open_log(experiment_dir, trial(), n, platform))
                if f is None:
                    continue
                with f:
                    f.seek(offsets[n])
                    copied = _copy_out(f, out, b"" if n == shown else f"==> {n} <==\n".encode())
                offsets[n] += copied
                if copied:
                    shown = n
            if not follow or ended:
                break
            time.sleep(0.2)
        return 0
    finally:
        store.close()
