"""Jobs as PAI keeps them: a FrameworkController framework (attempts, task roles, tasks, completion
statuses in FC's state strings), and the rest-server's list/detail views of it (k8s.js
convertFrameworkSummary / convertFrameworkDetail, frameworkConverter.convertState)."""
from __future__ import annotations

import hashlib
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from . import exitspec

WAITING_STATES = ("AttemptCreationPending", "AttemptCreationRequested", "AttemptPreparing")
DELETING_STATES = ("AttemptDeletionPending", "AttemptDeletionRequested", "AttemptDeleting")


def now_ms() -> int:
    """Kubernetes timestamps have second resolution; the rest-server turns them into epoch ms."""
    return int(time.time()) * 1000


def convert_name(name: str) -> str:
    """name.js convertName: the FrameworkController task role name."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def encode_name(framework_name: str) -> str:
    return hashlib.md5(framework_name.encode()).hexdigest()


def convert_state(state: str | None, code: int | None, attempt: bool = False) -> str:
    """frameworkConverter.convertState / convertAttemptState."""
    if state in WAITING_STATES:
        return "WAITING"
    if state == "AttemptRunning":
        return "RUNNING"
    if state in DELETING_STATES or (state == "AttemptCompleted" and not attempt):
        return "STOPPING" if code in (-210, -220) else "RUNNING"
    if state in ("Completed", "AttemptCompleted"):
        if code == 0:
            return "SUCCEEDED"
        return "STOPPED" if code in (-210, -220) else "FAILED"
    return "UNKNOWN"


def completion_status(code: int, diagnostics: str, trigger: dict | None = None) -> dict:
    spec = exitspec.exit_spec(code) or {}
    return {"code": code, "phrase": spec.get("phrase", "ContainerUnrecognizedFailed"),
            "type": {"name": "Succeeded" if code == 0 else "Failed",
                     "attributes": ["Permanent"] if exitspec.is_permanent(code) else []},
            "diagnostics": diagnostics, "trigger": trigger}


@dataclass
class Task:
    role: str                 # name in the job protocol
    fc_role: str              # convertName(role)
    index: int
    resources: dict           # cpu, memoryMB, gpu
    port_spec: dict           # label -> count (ssh and http always present)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    state: str = "AttemptCreationPending"
    attempt_id: int = 0
    pod_uid: str | None = None
    created: int | None = None
    launched: int | None = None
    completed: int | None = None
    attempt_created: int | None = None
    attempt_launched: int | None = None
    completion: dict | None = None
    retries: int = 0
    accountable: int = 0
    ports: dict = field(default_factory=dict)
    ip: str | None = None
    proc: Any = None
    kill_code: int | None = None      # the code FC reports when the platform ends the task
    key: str = ""                     # PAI_EMULATOR_TASK marker

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def holds(self) -> bool:
        """Counts against the virtual cluster while its pod exists."""
        return self.proc is not None

    @property
    def code(self) -> int | None:
        return self.completion["code"] if self.completion else None

    def detail(self, framework_name: str, attempt_id: int) -> dict:
        cs = self.completion
        diag = exitspec.exit_diagnostics(cs["diagnostics"] if cs else None)
        return {
            "taskIndex": self.index, "taskUid": self.uid,
            "taskState": convert_state(self.state, self.code),
            "containerId": self.pod_uid, "containerIp": self.ip,
            "containerNodeName": "localhost" if self.ip else None,
            "containerPorts": {k: ",".join(map(str, v)) for k, v in self.ports.items()} if self.pod_uid else {},
            "containerGpus": None,
            "containerLog": f"/api/v2/jobs/{framework_name}/attempts/{attempt_id}/taskRoles/{self.fc_role}"
                            f"/taskIndex/{self.index}/attempts/{self.attempt_id}/logs",
            "containerExitCode": self.code, "containerExitSpec": exitspec.exit_spec(self.code),
            "containerExitDiagnostics": diag["diagnosticsSummary"] if diag else None,
            "retries": self.retries, "accountableRetries": self.accountable,
            "createdTime": self.created, "launchedTime": self.launched or self.completed,
            "completedTime": self.completed, "attemptId": self.attempt_id,
            "attemptState": convert_state(self.state, self.code, attempt=True),
            "currentAttemptCreatedTime": self.attempt_created,
            "currentAttemptLaunchedTime": self.attempt_launched or self.completed,
            "currentAttemptCompletedTime": self.completed,
        }


@dataclass
class Job:
    user: str
    name: str
    vc: str
    raw: str                  # submitted YAML, secrets masked (the stored job config)
    protocol: dict            # validated + rendered
    secrets: Any
    seq: int
    submission: int
    roles: dict               # fc_role -> {name, instances, minFailed, minSucceeded, taskRetryCount}
    gang: bool
    max_retry: int
    created: int = field(default_factory=now_ms)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    execution_type: str = "START"
    state: str = "AttemptCreationPending"
    attempt_id: int = 0
    attempt_uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    attempt_created: int | None = None
    attempt_launched: int | None = None
    attempt_completed: int | None = None
    launched: int | None = None
    completed: int | None = None
    completion: dict | None = None
    retries: int = 0
    accountable: int = 0
    tasks: dict = field(default_factory=dict)     # fc_role -> [Task]
    history: dict = field(default_factory=dict)   # attempt id -> detail snapshot

    @property
    def framework_name(self) -> str:
        return f"{self.user}~{self.name}"

    @property
    def debug_id(self) -> str:
        return encode_name(self.framework_name)

    def all_tasks(self) -> list[Task]:
        return [t for ts in self.tasks.values() for t in ts]

    @property
    def code(self) -> int | None:
        return self.completion["code"] if self.completion else None

    @property
    def pai_state(self) -> str:
        return convert_state(self.state, self.code)

    def total_gpu(self) -> int:
        return sum(r["resources"]["gpu"] * r["instances"] for r in self.roles.values())

    def summary(self) -> dict:
        return {
            "debugId": self.debug_id, "name": self.name, "username": self.user, "state": self.pai_state,
            "subState": self.state, "executionType": self.execution_type, "tags": [],
            "retries": self.retries,
            "retryDetails": {"user": self.accountable, "platform": self.retries - self.accountable, "resource": 0},
            "retryDelayTime": None, "submissionTime": self.submission, "createdTime": self.created,
            "launchedTime": self.launched, "completedTime": self.completed, "appExitCode": self.code,
            "virtualCluster": self.vc, "totalGpuNumber": self.total_gpu(),
            "totalTaskNumber": sum(r["instances"] for r in self.roles.values()),
            "totalTaskRoleNumber": len(self.roles), "jobPriority": None,
        }

    def detail(self) -> dict:
        cs = self.completion
        diag = exitspec.exit_diagnostics(cs["diagnostics"] if cs else None)
        trig = (cs or {}).get("trigger") or {}
        return {
            "debugId": self.debug_id, "name": self.name, "tags": [], "jobPriority": None,
            "jobStatus": {
                "username": self.user, "state": self.pai_state, "subState": self.state,
                "executionType": self.execution_type, "retries": self.retries,
                "retryDetails": {"user": self.accountable, "platform": self.retries - self.accountable,
                                 "resource": 0},
                "retryDelayTime": None, "createdTime": self.created,
                "launchedTime": self.launched or self.completed, "completedTime": self.completed,
                "attemptId": self.attempt_id, "attemptState": convert_state(self.state, self.code, attempt=True),
                "appId": self.attempt_uid, "appProgress": 1 if cs else 0, "appTrackingUrl": "",
                "appCreatedTime": self.attempt_created,
                "appLaunchedTime": self.attempt_launched or self.attempt_completed,
                "appCompletedTime": self.attempt_completed, "appExitCode": self.code,
                "appExitSpec": exitspec.exit_spec(self.code),
                "appExitDiagnostics": diag["diagnosticsSummary"] if diag else None,
                "appExitMessages": ({"container": None, "runtime": diag["runtime"], "launcher": diag["launcher"]}
                                    if diag else None),
                "appExitTriggerMessage": trig.get("message"),
                "appExitTriggerTaskRoleName": trig.get("taskRoleName"),
                "appExitTriggerTaskIndex": trig.get("taskIndex"),
                "appExitType": cs["type"]["name"] if cs else None,
                "virtualCluster": self.vc, "submissionTime": self.submission,
            },
            "taskRoles": {r: {"taskRoleStatus": {"name": r},
                              "taskStatuses": [t.detail(self.framework_name, self.attempt_id) for t in ts]}
                          for r, ts in self.tasks.items()},
        }
