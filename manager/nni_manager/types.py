"""NNI's training-service data structures (nni-training-service.md §4), in Python form."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, TypedDict


# One parameter of an NNI search space: `{"_type": "choice", "_value": [...]}` (its values are the
# user's: numbers, strings, or nested spaces for a choice); the space maps names onto them.
ParameterSpec = TypedDict("ParameterSpec", {"_type": str, "_value": list[Any]})
SearchSpace = Dict[str, ParameterSpec]


class TrialJobStatus(str, enum.Enum):
    UNKNOWN = "UNKNOWN"
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    USER_CANCELED = "USER_CANCELED"
    SYS_CANCELED = "SYS_CANCELED"
    EARLY_STOPPED = "EARLY_STOPPED"

    @property
    def is_terminal(self) -> bool:
        return self not in (TrialJobStatus.UNKNOWN, TrialJobStatus.WAITING, TrialJobStatus.RUNNING)


@dataclass
class HyperParameters:
    value: str  # the ParameterRecord JSON, stored and delivered verbatim
    index: int = 0


@dataclass
class TrialJobApplicationForm:
    sequence_id: int
    hyper_parameters: HyperParameters
    placement_constraint: dict[str, object] | None = None
    id: str | None = None  # set when resuming a known trial


@dataclass
class TrialJobDetail:
    id: str
    status: TrialJobStatus
    submit_time: int  # epoch milliseconds, like NNI
    form: TrialJobApplicationForm
    sequence_id: int
    working_directory: str = ""
    start_time: int | None = None
    end_time: int | None = None
    tags: list[str] = field(default_factory=list)
    url: str | None = None
    is_early_stopped: bool = False
    message: str = ""  # why it is WAITING, why it failed, or that contact is lost
    agent_id: str | None = None  # where it runs (the first member, for a trial on several agents)
    gpu_indices: list[int] | None = None
    environment_id: str | None = None  # elastic platforms: the environment (a TFJob, a pod) it runs in
    agents: list[str] = field(default_factory=list)  # every agent it runs on

    def snapshot(self) -> TrialJobDetail:
        """A copy for callers to keep (later changes do not show in it). Fields are replaced,
        never mutated in place, so a shallow copy is enough; 4x cheaper than dataclasses.replace,
        which matters for list_trial_jobs over 100,000 trials."""
        copy = object.__new__(TrialJobDetail)
        copy.__dict__.update(self.__dict__)
        return copy


@dataclass(frozen=True)
class TrialJobMetric:
    id: str  # trial id
    data: str  # the NNI metric JSON string (nni-training-service.md §1.4)
    # the same, decoded once at ingest (nni_manager.metrics) so listeners need not parse it again;
    # shared by every listener: read it, never change it
    message: dict[str, object] | None = field(default=None, compare=False, repr=False)
