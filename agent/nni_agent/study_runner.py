"""The trial command of an Optuna study: run ONE Optuna trial of the objective, through the agent.

`python -m nni_agent.study_runner TARGET --study-name NAME [--sampler S] [--pruner P]`, started
by `nni-manager optuna`. The study's storage is reached only at the agent's endpoint
(NNI_STUDY_STORAGE, with the trial's token NNI_STUDY_STORAGE_TOKEN; nni_agent.study_storage),
through `optuna.storages.GrpcStorageProxy`: the sampler and the pruner run here, in the trial's
process, as in Optuna's own distributed mode. TARGET is `file.py:function` or `module:function`
in the trial's working directory (the trialCodeDirectory); the function gets a real
`optuna.Trial`. Its return value is told to the study (a number, or a sequence for a
multi-objective study); `optuna.TrialPruned` ends the Optuna trial PRUNED and this trial
EARLY_STOPPED; any other exception ends it FAIL and this trial FAILED (exit 1, traceback on
stderr). Runs with the trial's own Python, which needs optuna (and what the objective imports).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
import traceback
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

import grpc

from nni_agent.study_storage import ENV_ENDPOINT, ENV_TOKEN, MD_TOKEN, MD_TRIAL, RUNNER_SERVICE

if TYPE_CHECKING:
    from optuna.storages import GrpcStorageProxy

EXIT_FAILED = 1
EXIT_USAGE = 2


def agent_storage(endpoint: str, trial_id: str, token: str) -> GrpcStorageProxy:
    """A GrpcStorageProxy on the agent's endpoint whose calls carry the trial's credentials."""
    from optuna.storages import GrpcStorageProxy
    from optuna.storages._grpc import client as grpc_client
    from optuna.storages._grpc.auto_generated import api_pb2_grpc

    host, _, port = endpoint.rpartition(":")
    metadata = [(MD_TRIAL, trial_id), (MD_TOKEN, token)]

    class AgentStorageProxy(GrpcStorageProxy):
        def _setup(self) -> None:  # Optuna's own set-up, on a channel that adds the metadata
            channel = grpc_client.create_insecure_channel(self._host, self._port)
            self._channel = grpc.intercept_channel(channel, _Interceptor(metadata))
            self._stub = api_pb2_grpc.StorageServiceStub(self._channel)
            self._cache = grpc_client.GrpcClientCache(self._stub)

    return AgentStorageProxy(host=host, port=int(port))


class _Interceptor(grpc.UnaryUnaryClientInterceptor):
    def __init__(self, metadata: List[Tuple[str, str]]) -> None:
        self._metadata = metadata

    def intercept_unary_unary(self, continuation: Callable[[grpc.ClientCallDetails, object], object],
                              client_call_details: grpc.ClientCallDetails, request: object) -> object:
        details = _CallDetails(client_call_details, list(client_call_details.metadata or []) + self._metadata)
        return continuation(details, request)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: List[Tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def load_objective(target: str, code_dir: str) -> Callable[..., Any]:
    """`file.py:function` (a path inside `code_dir`) or `module:function` (importable from it)."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise ValueError("TARGET %r: expected file.py:function or module:function" % target)
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    if where.endswith(".py"):
        path = os.path.join(code_dir, where)
        spec = importlib.util.spec_from_file_location("__nni_objective__", path)
        if spec is None or spec.loader is None or not os.path.isfile(path):
            raise ValueError("TARGET %r: no file %s" % (target, path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    func = getattr(module, name, None)
    if not callable(func):
        raise ValueError("TARGET %r: %s has no function %s" % (target, where, name))
    return func


def _make(kind: str, name: Optional[str]) -> Any:
    if not name:
        return None
    import optuna

    return getattr(getattr(optuna, kind), name)()


def _end_early_stopped(endpoint: str, trial_id: str, token: str) -> None:
    """Tell the agent the Optuna trial was pruned: this trial then ends EARLY_STOPPED."""
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary("/%s/EndAs" % RUNNER_SERVICE)
        call(b"EARLY_STOPPED", metadata=[(MD_TRIAL, trial_id), (MD_TOKEN, token)], timeout=30)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nni_agent.study_runner", description=__doc__.split("\n")[0])
    parser.add_argument("target")
    parser.add_argument("--study-name", required=True)
    parser.add_argument("--sampler")
    parser.add_argument("--pruner")
    args = parser.parse_args(argv)
    endpoint = os.environ.get(ENV_ENDPOINT, "")
    token = os.environ.pop(ENV_TOKEN, "")  # the objective's own children need not see it
    trial_id = os.environ.get("NNI_TRIAL_JOB_ID", "")
    if not endpoint or not token or endpoint == "agent":
        print("nni_agent.study_runner: %s is not set: run it as the trial command of `nni-manager optuna`"
              % ENV_ENDPOINT, file=sys.stderr)
        return EXIT_USAGE
    try:
        import optuna
    except ImportError:
        print("nni_agent.study_runner: the trial's Python has no optuna: `pip install optuna` on the worker",
              file=sys.stderr)
        return EXIT_FAILED
    storage = agent_storage(endpoint, trial_id, token)
    study = optuna.load_study(study_name=args.study_name, storage=storage, sampler=_make("samplers", args.sampler),
                              pruner=_make("pruners", args.pruner))
    stopped = []  # a stop (SIGINT) while the trial is being created waits for the objective's `try`
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stopped.append(signum))
    try:
        trial = study.ask()  # the manager makes it with this trial's ids as user attrs (nni:experiment_id, ...)
    except BaseException:
        signal.signal(signal.SIGINT, previous)
        raise
    print("Optuna trial %d of study %s" % (trial.number, args.study_name), flush=True)
    try:
        signal.signal(signal.SIGINT, previous)
        if stopped:
            raise KeyboardInterrupt()
        # after ask(): an objective that cannot be loaded is one FAIL trial of the study, as one that raises
        try:
            objective = load_objective(args.target, os.getcwd())
        except (ValueError, ImportError) as exc:  # the last stderr line is the trial's FAILED reason
            traceback.print_exc()
            print("nni_agent.study_runner: cannot load the objective: %s" % exc, file=sys.stderr)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return EXIT_FAILED
        value = objective(trial)
    except optuna.TrialPruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        print("pruned at step %s" % (storage.get_trial(trial._trial_id).last_step,), flush=True)
        _end_early_stopped(endpoint, trial_id, token)
        return 0
    except KeyboardInterrupt:  # the agent stops the trial (cancelled, maxTrialDuration): the study hears it
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise
    except Exception:
        traceback.print_exc()
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return EXIT_FAILED
    frozen = study.tell(trial, value)
    print("Optuna trial %d: %s %s" % (trial.number, frozen.state.name, frozen.values), flush=True)
    if frozen.state != optuna.trial.TrialState.COMPLETE:
        return EXIT_FAILED
    from nni_agent import trial_api  # the experiment's own record: `trials`, the WebUI, the summary

    final = {"default": frozen.values[0], "optuna_trial": trial.number}
    if len(frozen.values) > 1:
        final["values"] = list(frozen.values)
    trial_api.report_final_result(final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
