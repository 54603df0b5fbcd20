"""Objectives of the tests' Optuna studies: unmodified Optuna code, plus a record of what each saw.

Each writes seen/<NNI trial id>.json next to this file: the Optuna trial number, the params it
was given, what it returned (or how it ended), and what it could see of the study's storage.
"""
import json
import os
import sys

import grpc
import optuna

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.isfile(os.path.join(HERE, "seen_dir.txt")):  # records go to <that directory>/seen instead: a test's own,
    with open(os.path.join(HERE, "seen_dir.txt")) as f:  # not the worker's home, which other test runs may clean
        HERE = f.read().strip()


def _record(trial, **what):
    storage = trial.study._storage
    endpoint = os.environ.get("NNI_STUDY_STORAGE", "")
    with grpc.insecure_channel(endpoint) as channel:  # the agent's endpoint, with a wrong token
        call = channel.unary_unary("/optuna.StorageService/GetAllStudies")
        try:
            call(b"", metadata=[("nni-trial-id", os.environ["NNI_TRIAL_JOB_ID"]), ("nni-trial-token", "wrong")],
                 timeout=20)
            wrong_token = "answered"
        except grpc.RpcError as exc:
            wrong_token = exc.code().name
    seen = {"number": trial.number, "params": trial.params,
            "user_attrs": {k: v for k, v in trial.user_attrs.items() if k.startswith("nni:")}, "storage_class": type(storage).__name__,
            "storage_at": "%s:%s" % (storage._host, storage._port), "endpoint": endpoint,
            "wrong_token": wrong_token, "environ": dict(os.environ), "argv": sys.argv, "pid": os.getpid(), **what}
    os.makedirs(os.path.join(HERE, "seen"), exist_ok=True)
    with open(os.path.join(HERE, "seen", os.environ["NNI_TRIAL_JOB_ID"] + ".json"), "w") as f:
        json.dump(seen, f)


def quadratic(trial):
    x = trial.suggest_float("x", -10, 10)
    n = trial.suggest_int("n", 1, 5)
    kind = trial.suggest_categorical("kind", ["a", "b"])
    trial.set_user_attr("note", "hello")
    value = (x - 2) ** 2 + n + (0.5 if kind == "a" else 0.0)
    _record(trial, returned=[value])
    return value


def steps(trial):
    """Reports trial.number + step: from the 6th trial on, MedianPruner prunes it at step 0."""
    x = trial.suggest_float("x", 0, 1)
    for step in range(3):
        trial.report(trial.number + step + x, step)
        if trial.should_prune():
            _record(trial, pruned_at=step)
            raise optuna.TrialPruned()
    value = trial.number + x
    _record(trial, returned=[value])
    return value


def _on_the_worker():
    """seen/<NNI trial id>.worker.json: which Python runs the objective, and whose packages it imports."""
    import importlib.util

    where = {"python": sys.executable, "grpc_file": grpc.__file__, "sys_path": sys.path,
             "psutil_importable": importlib.util.find_spec("psutil") is not None}
    os.makedirs(os.path.join(HERE, "seen"), exist_ok=True)
    with open(os.path.join(HERE, "seen", os.environ["NNI_TRIAL_JOB_ID"] + ".worker.json"), "w") as f:
        json.dump(where, f)


def steps_in_turn(trial):
    """`steps` once every earlier Optuna trial has finished (read through the study's storage): what
    MedianPruner sees does not depend on how concurrent trials interleave (the 6th is pruned at step 0)."""
    import time

    _on_the_worker()
    while any(t.number < trial.number and not t.state.is_finished() for t in trial.study.get_trials(deepcopy=False)):
        time.sleep(0.2)
    return steps(trial)


def first_sleeps(trial):
    """Optuna trial 0 sleeps (to be killed mid-trial); the others return at once."""
    _on_the_worker()
    x = trial.suggest_float("x", 0, 1)
    if trial.number == 0:
        _record(trial, slept=True)
        import time

        time.sleep(300)
    _record(trial, returned=[x])
    return x


def broken(trial):
    trial.suggest_float("x", 0, 1)
    _record(trial, raised="ValueError")
    raise ValueError("the objective broke on purpose")


def two_objectives(trial):
    x = trial.suggest_float("x", 0, 5)
    y = trial.suggest_float("y", 0, 3)
    values = [4 * x * x + 4 * y * y, (x - 5) ** 2 + (y - 5) ** 2]
    _record(trial, returned=values)
    return values


def sleeper(trial):
    trial.suggest_float("x", 0, 1)
    _record(trial, slept=True)
    import time

    time.sleep(120)
    return 0.0


def slow(trial):
    x = trial.suggest_float("x", 0, 1)
    _record(trial, returned=[x])
    import time

    time.sleep(1)
    return x


def nine_steps(trial):
    """Reports trial.number + step + x for 9 steps (minimized): later trials lose, and a pruner may
    stop them; the record says every step it reported and where it was pruned."""
    x = trial.suggest_float("x", 0, 1)
    reported = {}
    for step in range(9):
        reported[step] = trial.number + step + x
        trial.report(reported[step], step)
        if trial.should_prune():
            _record(trial, reported=reported, pruned_at=step)
            raise optuna.TrialPruned()
    value = trial.number + x
    _record(trial, reported=reported, returned=[value])
    return value


def bowl(trial):
    """Two floats only: every parameter is CMA-ES's own (no independent fallback)."""
    x = trial.suggest_float("x", -3, 3)
    y = trial.suggest_float("y", -3, 3)
    value = x * x + y * y
    _record(trial, returned=[value])
    return value


def first_hangs(trial):
    """Optuna trial 0 waits to be killed; the others return at once."""
    x = trial.suggest_float("x", 0, 1)
    _record(trial, returned=[x], hangs=trial.number == 0)
    if trial.number == 0:
        import time

        time.sleep(120)
    return x


def held(trial):
    """Waits for the file `release` next to the records (the test writes it), then makes one more
    storage call and returns x: the manager can be killed and resumed while it waits."""
    import time

    x = trial.suggest_float("x", 0, 1)
    _record(trial, held=True)
    while not os.path.exists(os.path.join(HERE, "release")):
        time.sleep(0.1)
    trial.set_user_attr("released", True)
    _record(trial, returned=[x])
    return x
