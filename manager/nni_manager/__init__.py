"""nni-manager: NNI's training-service API over nni-agents.

    async with create_training_service("config.yml") as ts:
        ts.add_trial_job_metric_listener(print)
        job = await ts.submit_trial_job(TrialJobApplicationForm(
            sequence_id=0, hyper_parameters=HyperParameters(value=record_json, index=0)))
"""

import sys

from nni_manager.version import __version__  # noqa: F401  (re-exported)

if sys.version_info < (3, 10):  # the package installs on 3.8 for workers: only the agent runs there
    raise ImportError(f"nni-manager needs Python >= 3.10, this is {sys.version.split()[0]} ({sys.executable}); "
                      "workers may run nni-agent on Python >= 3.8")

from nni_manager.config import ConfigError, ExperimentConfig  # noqa: E402
from nni_manager.errors import TrainingServiceError  # noqa: E402
from nni_manager.types import (  # noqa: E402
    HyperParameters,
    TrialJobApplicationForm,
    TrialJobDetail,
    TrialJobMetric,
    TrialJobStatus,
)


def __getattr__(name: str):  # lazy: importing types must not pull in grpc/sqlite machinery
    if name in ("TrainingService", "create_training_service"):
        from nni_manager import service

        return getattr(service, name)
    if name in ("Experiment", "TrialResult", "TrialJob"):  # NNI's experiment API (nni.experiment.Experiment)
        from nni_manager import api

        return getattr(api, name)
    raise AttributeError(name)


__all__ = [
    "ConfigError",
    "Experiment",
    "ExperimentConfig",
    "HyperParameters",
    "TrainingService",
    "TrainingServiceError",
    "TrialJobApplicationForm",
    "TrialJobDetail",
    "TrialJobMetric",
    "TrialJobStatus",
    "TrialJob",
    "TrialResult",
    "create_training_service",
]
