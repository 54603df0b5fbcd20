"""NNI 3.0's Python experiment API (`nni.experiment.Experiment`), so an NNI experiment script or
notebook moves over by changing one import:

    from nni_manager import Experiment          # was: from nni.experiment import Experiment
    experiment = Experiment('local')            # or NNI's ExperimentConfig, a dict, a YAML path, ours
    experiment.config.trial_command = ...
    experiment.start(8080)                      # the WebUI and REST API, as NNI serves them
    print(experiment.get_job_metrics())
    experiment.stop()

NNI runs its manager as a child process and its `Experiment` talks to it over the REST API; we
run the manager on an asyncio loop in a background thread of this process, serving the same
REST API and WebUI (registered in `~/nni-experiments/.experiment`, so `nnictl` and
`nni-manager list` see it), and every query goes through that API exactly as NNI's does, so
`Experiment.connect(port)` works the same on a running `nni-manager run` experiment.
"""
from __future__ import annotations

import asyncio
import atexit
import json
import logging
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from nni_manager.types import SearchSpace
from nni_manager.jsontypes import JSONValue
from nni_manager.config import ConfigError, ExperimentConfig
from nni_manager.loader import load_config
from nni_manager.experiment import Experiment as _Loop
from nni_manager.experiment import ExperimentResult

if TYPE_CHECKING:
    from nni_manager.webui.runner import LiveWebUI
    from nni_manager.webui.server import WebServer

__all__ = ["Experiment", "TrialHyperParameters", "TrialJob", "TrialMetricData", "TrialResult"]

log = logging.getLogger(__name__)
_ENDED = ("DONE", "STOPPED", "ERROR")
_REST_TIMEOUT_S = 20  # NNI's rest.timeout
_STOP_WAIT_S = 120.0


# -- NNI's data classes (nni/experiment/data.py), built from the REST answers as NNI builds them --

@dataclass(init=False)
class TrialResult:
    """One trial's parameters and final result (`export_data()`)."""

    parameter: dict[str, JSONValue]
    value: JSONValue
    trialJobId: str  # noqa: N815 - NNI's field name

    def __init__(self, parameter: dict[str, JSONValue], value: str, trialJobId: str) -> None:  # noqa: N803
        self.parameter = parameter
        self.value = json.loads(value)
        self.trialJobId = trialJobId


@dataclass(init=False)
class TrialMetricData:
    """One reported metric (`get_job_metrics()`): `data` decoded from NNI's twice-encoded string."""

    timestamp: int
    trialJobId: str  # noqa: N815
    parameterId: int  # noqa: N815
    type: str
    sequence: int
    data: JSONValue

    def __init__(self, timestamp: int, trialJobId: str, parameterId: int, type: str,  # noqa: A002,N803
                 sequence: int, data: str) -> None:
        self.timestamp = timestamp
        self.trialJobId = trialJobId
        self.parameterId = parameterId
        self.type = type
        self.sequence = sequence
        self.data = json.loads(json.loads(data))


@dataclass
class TrialHyperParameters:
    """One parameter record a trial received."""

    parameter_id: int
    parameter_source: str
    parameters: dict[str, JSONValue]
    parameter_index: int
    placement_constraint: dict[str, JSONValue] | None = None
    version_info: dict[str, JSONValue] | None = None


@dataclass(init=False)
class TrialJob:
    """A trial as `/trial-jobs` lists it (`list_trial_jobs()`, `get_trial_job()`)."""

    trialJobId: str  # noqa: N815
    status: str
    hyperParameters: list[TrialHyperParameters]  # noqa: N815
    logPath: str  # noqa: N815
    startTime: int  # noqa: N815
    endTime: int  # noqa: N815
    finalMetricData: list[TrialMetricData]  # noqa: N815
    stderrPath: str  # noqa: N815
    sequenceId: int  # noqa: N815
    message: str

    def __init__(self, trialJobId: str, status: str, startTime: int, sequenceId: int,  # noqa: N803
                 logPath: str = "", endTime: int = -1, stderrPath: str = "",  # noqa: N803
                 hyperParameters: list[str] | None = None, finalMetricData: list[dict[str, Any]] | None = None,  # noqa: N803
                 message: str = "--", **kwargs: object) -> None:
        self.trialJobId = trialJobId
        self.status = status
        self.hyperParameters = [TrialHyperParameters(**json.loads(e)) for e in hyperParameters or []]
        self.logPath = logPath
        self.startTime = startTime
        self.endTime = endTime
        self.finalMetricData = [TrialMetricData(**e) for e in finalMetricData or []]
        self.stderrPath = stderrPath
        self.sequenceId = sequenceId
        self.message = message


class Experiment:
    """NNI's `Experiment(config_or_platform, id=None)`: `Experiment('local')` (with `nni`
    installed: NNI's ExperimentConfig to fill in), NNI's ExperimentConfig, a dict, a YAML path or
    our ExperimentConfig; `None` with an `id` to `resume()` / `view()` a stored experiment."""

    def __init__(self, config_or_platform: object = None, id: str | None = None, *,  # noqa: A002 - NNI's name
                 experiment_id: str | None = None) -> None:
        config = config_or_platform
        if isinstance(config, (str, list)) and not (isinstance(config, str) and _is_file(config)):
            try:  # NNI's `Experiment('local')`: an empty config of NNI's API to fill in
                from nni.experiment import ExperimentConfig as NniConfig
            except ImportError:
                raise ConfigError("(config)", f"{config!r} is neither a config file nor, without the `nni` "
                                  "package, a platform to build a config for",
                                  "pass a YAML path, a dict, or `pip install nni` to use NNI's ExperimentConfig") from None
            config = NniConfig(config)
        self.config: Any = config
        self.id: str | None = id or experiment_id
        if self.id is not None and not _valid_id(self.id):
            raise ValueError(f"Invalid experiment ID: {self.id}. Experiment ID should only contain digits, alphanumeric "
                             "characters, hyphens, and underscores, and should be no longer than 32 characters.")
        self.port: int | None = None
        self.url_prefix: str | None = None
        self._pid: int | None = None  # the process serving a connected experiment
        self._loop_obj: _Loop | None = None
        self._thread: threading.Thread | None = None
        self._aio: asyncio.AbstractEventLoop | None = None
        self._stop_cb: Callable[[], None] | None = None
        self._web: LiveWebUI | None = None  # the running experiment's WebUI (its manifest entry)
        self._error: BaseException | None = None
        self._result: ExperimentResult | None = None
        self._sigterm: Callable[[int, FrameType | None], None] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, port: int = 8080, debug: bool = False, run_mode: object = None) -> None:
        """Start the experiment in the background and serve its WebUI on `port` (the next free
        one if taken; `self.port` says which). Returns once it runs; raises what stopped it.
        The experiment is stopped at exit unless `run_mode` is NNI's `RunMode.Detach`."""
        from nni_manager.service.nni_api import new_id

        if self._thread is not None:
            raise RuntimeError("the experiment is already started")
        if self.config is None:
            raise RuntimeError("no config: pass one to Experiment(...), or load_checkpoint() a stored experiment")
        config = self.config if isinstance(self.config, ExperimentConfig) else load_config(self.config)
        if debug:
            config.debug, config.log_level = True, "debug"
        self.id = self.id or new_id(8)  # known before the run: the WebUI's manifest entry needs it
        self._loop_obj = _Loop(config, experiment_id=self.id)  # ConfigError here, in the caller's thread
        self._error = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(int(port), ready), name="nni-manager-experiment",
                                        daemon=True)
        self._thread.start()
        while not ready.wait(0.05) and self._thread.is_alive():
            pass
        while self._loop_obj.status == "INITIALIZED" and self._thread.is_alive() and self._error is None:
            time.sleep(0.05)
        if not self._thread.is_alive() or self._error is not None:
            self._thread.join()
            self._thread = None
            if self._error is not None and not isinstance(self._error, asyncio.CancelledError):
                raise self._error
            raise RuntimeError(f"experiment {self.id} ended while starting")
        self._sync_manifest()
        if getattr(run_mode, "value", run_mode) != "detach":
            _stop_at_exit(self)
        self._catch_sigterm()

    def _sync_manifest(self) -> None:
        """The manifest says RUNNING before start() returns: `nni-manager list` and `nnictl experiment
        list` right after it show the experiment running, not the INITIALIZED the WebUI registered it
        as (the WebUI writes a change within a second, which a script that lists at once beats)."""
        web, aio = self._web, self._aio
        if web is None or web.server is None or aio is None or aio.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(web.server.sync_manifest(), aio).result(30)
        except Exception as exc:  # noqa: BLE001 - a full or read-only home must not fail the start
            log.warning("cannot update the experiments manifest: %s", exc)

    def _main(self, port: int, ready: threading.Event) -> None:
        try:
            asyncio.run(self._serve(port, ready))
        except BaseException as exc:  # noqa: BLE001 - reported by start() / get_status()
            self._error = exc
        finally:
            # its server is gone: stopped from elsewhere too (DELETE /experiment, nnictl stop), the
            # status is the run's own (get_status), not "no experiment answers on port ..."
            self.port = None
            ready.set()

    async def _serve(self, port: int, ready: threading.Event) -> None:
        """The CLI's run, with the WebUI: run, then keep serving (as NNI's manager does) until stop()."""
        from nni_manager.dispatcher import DispatcherError
        from nni_manager.experiment import NoWorkerError
        from nni_manager.webui.runner import WebOptions, live_webui

        experiment = self._loop_obj
        assert experiment is not None and self.id is not None
        self._aio = asyncio.get_running_loop()
        run_task: asyncio.Task[ExperimentResult] | None = None
        released = asyncio.Event()

        def stop() -> None:  # experiment.stop(), SIGTERM, DELETE /experiment, `nni-manager stop`, nnictl stop
            if run_task is not None and not run_task.done():
                run_task.cancel()
            released.set()
            for web in serving:
                web.release()

        self._stop_cb = stop
        serving: list[LiveWebUI] = []
        async with live_webui(experiment, self.id, WebOptions(port=port), stop) as webui:
            serving.append(webui)
            assert webui.server is not None
            self.port = webui.server.port
            self._web = webui
            ready.set()
            reopened = True
            while reopened and not released.is_set():  # a DONE experiment whose limit is raised runs on
                run_task = asyncio.create_task(experiment.run())
                try:
                    self._result = await run_task
                except asyncio.CancelledError:
                    webui.finish("STOPPING")
                    return
                except (DispatcherError, NoWorkerError) as exc:  # NNI keeps its WebUI up to show the error
                    webui.finish("ERROR", str(exc))
                    self._result = experiment.result()
                except Exception as exc:
                    webui.finish("ERROR", str(exc))
                    self._error = exc
                    raise
                else:
                    webui.finish("DONE")
                reopened = not released.is_set() and await webui.serve_until_stopped(
                    "is done" if experiment.status == "DONE" else "has failed",
                    "experiment.stop() or the end of this script")

    def run(self, port: int = 8080, wait_completion: bool = True, debug: bool = False) -> bool | None:
        """NNI's `run()`: start; with `wait_completion`, block until the experiment is done and
        return True (DONE or STOPPED) or False (ERROR). As in NNI the WebUI stays up until
        `stop()` or the end of the script; Ctrl-C stops the experiment (then None)."""
        try:
            self.start(port, debug)
            if wait_completion:
                return self._wait_completion()
        except KeyboardInterrupt:
            log.warning("KeyboardInterrupt detected")
            self.stop()
        return None

    def _wait_completion(self) -> bool:
        while True:
            status = self.get_status()
            if status in ("DONE", "STOPPED"):
                return True
            if status == "ERROR":
                return False
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop: cancel live trials (USER_CANCELED), stop the dispatcher and agents, close the
        WebUI. A connected experiment is stopped through its REST API, as NNI stops it."""
        self.save_checkpoint()
        if self._thread is not None:
            if self._aio is not None and self._stop_cb is not None and not self._aio.is_closed():
                try:
                    self._aio.call_soon_threadsafe(self._stop_cb)
                except RuntimeError:  # the loop closed meanwhile
                    pass
            self._thread.join()
            self._thread = None
            self._restore_sigterm()
        elif self.port is not None:
            self._rest("DELETE", "/experiment")
            deadline = time.monotonic() + _STOP_WAIT_S
            while self._pid is not None and _serving(self._pid, self.id) and time.monotonic() < deadline:
                time.sleep(0.1)
        self.port = None
        self._pid = None

    def _catch_sigterm(self) -> None:
        """`nni-manager stop ID` / `nnictl stop` send SIGTERM: stop the experiment, not the script
        (only where the script left SIGTERM at its default)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def on_term(signum: int, frame: FrameType | None) -> None:
            if self._aio is not None and self._stop_cb is not None and not self._aio.is_closed():
                try:
                    self._aio.call_soon_threadsafe(self._stop_cb)
                except RuntimeError:
                    pass
        signal.signal(signal.SIGTERM, on_term)
        self._sigterm = on_term

    def _restore_sigterm(self) -> None:
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) is self._sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._sigterm = None

    # -- stored experiments: resume, view, checkpoints ------------------------------------

    def has_checkpoint(self) -> bool:
        """Whether experiment `self.id` exists (NNI: its entry in ~/nni-experiments/.experiment;
        here also its directory under ~/nni-experiments)."""
        from nni_manager.experiments import ExperimentNotFound, resolve
        from nni_manager.webui import manifest

        if self.id is None:
            return False
        if self.id in manifest.read():
            return True
        try:
            resolve(self.id)
        except ExperimentNotFound:
            return False
        return True

    def save_checkpoint(self) -> None:
        """Nothing to do, as in NNI: the store keeps every trial and metric as it happens."""

    def load_checkpoint(self) -> None:
        """Load the stored experiment's config into `self.config` (a config already set is kept,
        as NNI keeps it)."""
        if self.config is not None:
            return
        self.config = _stored_config(self._directory())

    def _directory(self) -> Path:
        from nni_manager.experiments import ExperimentNotFound, resolve

        try:
            return resolve(str(self.id))
        except ExperimentNotFound as exc:
            raise RuntimeError(str(exc)) from None

    def resume(self, port: int = 8080, wait_completion: bool = True, debug: bool = False) -> bool | None:
        """NNI's `Experiment(config_or_None, id).resume()`: run a stopped experiment on; ended
        trials are kept and their results go to the tuner."""
        if not self.has_checkpoint():
            raise RuntimeError(f"Experiment {self.id} does not exist thus cannot be resumed.")
        self.load_checkpoint()
        return self.run(port, wait_completion, debug)

    def run_or_resume(self, port: int = 8080, wait_completion: bool = True, debug: bool = False) -> bool | None:
        """`resume()` when experiment `self.id` exists, else `run()`."""
        if self.has_checkpoint():
            return self.resume(port, wait_completion, debug)
        return self.run(port, wait_completion, debug)

    def view(self, port: int = 8080, non_blocking: bool = False) -> Experiment:
        """NNI's `Experiment(None, id).view()`: serve a stored experiment's WebUI, read-only
        (status VIEWED); blocks until Ctrl-C unless `non_blocking` (then `stop()` ends it)."""
        if not self.has_checkpoint():
            raise RuntimeError(f"Experiment {self.id} does not exist thus cannot be viewed.")
        directory = self._directory()
        if self._thread is not None:
            raise RuntimeError("the experiment is already started")
        ready = threading.Event()
        self._error = None
        self._thread = threading.Thread(target=self._view_main, args=(directory, int(port), ready),
                                        name="nni-manager-view", daemon=True)
        self._thread.start()
        ready.wait()
        if self.port is None:
            self._thread.join()
            self._thread = None
            raise self._error or RuntimeError(f"cannot serve {directory}")
        _stop_at_exit(self)
        if not non_blocking:
            try:
                while self._thread is not None and self._thread.is_alive():
                    time.sleep(0.5)
            except KeyboardInterrupt:
                log.warning("KeyboardInterrupt detected")
            finally:
                self.stop()
        return self

    def _view_main(self, directory: Path, port: int, ready: threading.Event) -> None:
        from nni_manager.webui.runner import WebOptions, serve_stored

        async def go() -> None:
            self._aio = asyncio.get_running_loop()
            stopped = asyncio.Event()
            self._stop_cb = stopped.set

            def on_ready(server: WebServer) -> None:
                self.port = server.port
                ready.set()
            await serve_stored(directory, WebOptions(port=port), stopped=stopped, on_ready=on_ready)
        try:
            asyncio.run(go())
        except BaseException as exc:  # noqa: BLE001 - raised by view()
            self._error = exc
        finally:
            ready.set()

    @classmethod
    def connect(cls, port: int) -> Experiment:
        """Attach to the experiment served on `port` (`nni-manager run`, or another script's)."""
        experiment = cls(None)
        experiment.port = port
        experiment.id = experiment.get_experiment_profile().get("id")
        status = experiment.get_status()
        pid = experiment.get_experiment_metadata(str(experiment.id)).get("pid")
        if not isinstance(pid, (int, float, str)):  # None: no entry (NNI writes an int)
            log.warning("Get experiment pid failed, can not stop experiment by stop().")
        else:
            experiment._pid = int(pid)
        log.info("Connect to port %d success, experiment id is %s, status is %s.", port, experiment.id, status)
        return experiment

    # -- queries and updates: NNI's REST API, as nni.experiment.Experiment calls it ---------

    def _rest(self, method: str, api: str, data: object = None) -> Any:  # Any: NNI's REST answers, shaped per API
        if self.port is None:
            raise RuntimeError("Experiment is not running")
        parts = [f"http://127.0.0.1:{self.port}", self.url_prefix, "api/v1/nni", api]
        url = "/".join(p.strip("/") for p in parts if p)
        body = None if data is None else json.dumps(data).encode()
        request = urllib.request.Request(url, data=body, method=method,
                                         headers={"Content-Type": "application/json"} if body is not None else {})
        try:
            with urllib.request.urlopen(request, timeout=_REST_TIMEOUT_S) as response:  # noqa: S310 - loopback
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except (ValueError, AttributeError):
                pass
            raise RuntimeError(f"{method} {api}: HTTP {exc.code}: {detail}") from None
        except OSError as exc:
            raise RuntimeError(f"no experiment answers on port {self.port} ({exc}); is it running?") from None
        return json.loads(text) if method in ("GET", "POST") and text else None

    def get_status(self) -> str:
        """NNI's experiment status: INITIALIZED, RUNNING, TUNER_NO_MORE_TRIAL, NO_MORE_TRIAL,
        DONE, STOPPED, ERROR (VIEWED for `view()`). After `stop()`, the status it ended in."""
        if self.port is None and self._loop_obj is not None:
            status = self._loop_obj.status
            return status if status in _ENDED else "STOPPED"
        return str(self._rest("GET", "/check-status")["status"])

    def get_trial_job(self, trial_job_id: str) -> TrialJob:
        return TrialJob(**self._rest("GET", f"/trial-jobs/{trial_job_id}"))

    def list_trial_jobs(self) -> list[TrialJob]:
        return [TrialJob(**job) for job in self._rest("GET", "/trial-jobs")]

    def get_job_statistics(self) -> list[dict[str, JSONValue]]:
        return list(self._rest("GET", "/job-statistics"))

    def get_job_metrics(self, trial_job_id: str | None = None) -> dict[str, list[TrialMetricData]]:
        """Each trial id -> its metrics (intermediate PERIODICAL and FINAL), in order."""
        out: dict[str, list[TrialMetricData]] = {}
        for metric in self._rest("GET", f"/metric-data/{trial_job_id}" if trial_job_id else "/metric-data"):
            out.setdefault(metric["trialJobId"], []).append(TrialMetricData(**metric))
        return out

    def get_experiment_profile(self) -> dict[str, Any]:
        return dict(self._rest("GET", "/experiment"))

    def get_experiment_metadata(self, exp_id: str) -> dict[str, JSONValue]:
        return next((m for m in self.get_all_experiments_metadata() if m.get("id") == exp_id), {})

    def get_all_experiments_metadata(self) -> list[dict[str, JSONValue]]:
        return list(self._rest("GET", "/experiments-info"))

    def export_data(self) -> list[TrialResult]:
        """Every succeeded trial's parameters, final result and id."""
        return [TrialResult(**r) for r in self._rest("GET", "/export-data")]

    def _update_experiment_profile(self, key: str, value: object) -> None:
        kind = {"trialConcurrency": "TRIAL_CONCURRENCY", "maxExperimentDuration": "MAX_EXEC_DURATION",
                "searchSpace": "SEARCH_SPACE", "maxTrialNumber": "MAX_TRIAL_NUM"}[key]
        profile = self.get_experiment_profile()
        profile["params"][key] = value
        self._rest("PUT", f"/experiment?update_type={kind}", profile)
        log.info("Successfully update %s.", key)

    def update_trial_concurrency(self, value: int) -> None:
        self._update_experiment_profile("trialConcurrency", value)

    def update_max_experiment_duration(self, value: str) -> None:
        """`value` as NNI writes durations: '90s', '10m', '2h', '1d'."""
        self._update_experiment_profile("maxExperimentDuration", value)

    def update_search_space(self, value: SearchSpace) -> None:
        self._update_experiment_profile("searchSpace", value)

    def update_max_trial_number(self, value: int) -> None:
        """Raise (or lower) maxTrialNumber; raising it on a DONE experiment runs it on, as in NNI."""
        self._update_experiment_profile("maxTrialNumber", value)

    def kill_trial_job(self, trial_job_id: str) -> None:
        self._rest("DELETE", f"/trial-jobs/{trial_job_id}")

    # -- ours -----------------------------------------------------------------------------

    @property
    def error(self) -> str:
        """Why the experiment failed (the tuner's error, or why no worker is usable), or ""."""
        if self._loop_obj is not None and self._loop_obj.error:
            return self._loop_obj.error
        return "" if self._error is None or isinstance(self._error, asyncio.CancelledError) else repr(self._error)

    @property
    def experiment_dir(self) -> Path | None:
        return self._loop_obj.experiment_dir if self._loop_obj else None

    def result(self) -> ExperimentResult | None:
        """Our summary (best trial, stop reason) once the experiment ended."""
        if self._result is None and self._loop_obj is not None and self._loop_obj.status in _ENDED:
            return self._loop_obj.result()
        return self._result


def _stop_at_exit(experiment: Experiment) -> None:
    """Stop `experiment` when the script ends, as NNI's atexit does, but earlier: before the
    interpreter shuts down the thread pools the experiment's clean-up still uses (which happens
    before `atexit` handlers run)."""
    def stop() -> None:
        if experiment._thread is not None:
            experiment.stop()
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - CPython has it since 3.9
        atexit.register(stop)
    else:
        register(stop)


def _is_file(ref: str) -> bool:
    return Path(ref).expanduser().is_file() or ref.endswith((".yml", ".yaml", ".json"))


def _valid_id(ref: str) -> bool:
    """NNI's management.is_valid_experiment_id."""
    return 0 < len(ref) <= 32 and all(c.isalnum() or c in "-_" for c in ref)


def _serving(pid: int, experiment_id: str | None) -> bool:
    """Whether process `pid` still serves `experiment_id` (alive, and its entry not STOPPED)."""
    from nni_manager.webui import manifest

    if not manifest.alive(pid):
        return False
    entry = manifest.read().get(experiment_id or "")
    return not isinstance(entry, dict) or entry.get("status") != "STOPPED"


def _stored_config(directory: Path) -> ExperimentConfig:
    """The config a stored experiment ran with: its YAML file again where it still exists, else
    the stored fields (NNI's canonical form; platforms other than local need their file)."""
    from nni_manager.store import Store
    from nni_manager.webui.views import nni_params

    store = Store.open_readonly(directory)
    try:
        row = store.experiment()
    finally:
        store.close()
    stored = row.get("config") or {}
    config_file = stored.get("config_file")
    if config_file and Path(config_file).is_file():
        return load_config(Path(config_file))
    platform = (stored.get("training_service") or {}).get("platform", "local")
    if platform != "local":
        raise RuntimeError(f"experiment {row.get('id')} ran on {platform} from a config that is gone: pass it, "
                           f"Experiment(config, id={row.get('id')!r}).resume()")
    params = nni_params(stored)
    params["experimentWorkingDirectory"] = str(directory.parent)
    return load_config(params)
