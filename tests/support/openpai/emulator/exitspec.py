"""Exit codes as PAI reports them: the runtime's mapping of a user command's exit code to the
container exit code (openpai-runtime exithandler + runtime-exit-spec), and the rest-server's
``appExitSpec`` / ``containerExitSpec`` objects (pai k8s-job-exit-spec.yaml, a transcribed subset),
so a client sees e.g. 255 ``PAIRuntimeUnknownFailed`` for ``exit 3`` as on a real cluster."""
from __future__ import annotations

import json
import re

import yaml

# code: (phrase, issuer, causer, type, stage, behavior, reaction, reason)
_SPEC: dict[int, tuple] = {
    0: ("Succeeded", "USER_CONTAINER", "USER_CONTAINER", "USER_SUCCESS", "COMPLETING", "UNKNOWN", "NEVER_RETRY", None),
    -210: ("StopFrameworkRequested", "PAI_FC", "USER_STOP", "USER_STOP", "UNKNOWN", "PERMANENT", "NEVER_RETRY",
           "User has requested to stop the job"),
    -220: ("FrameworkAttemptCompletion", "PAI_FC", "USER_STOP", "USER_STOP", "UNKNOWN", "PERMANENT", "NEVER_RETRY",
           "Stop to complete current job attempt"),
    -1001: ("PodNodeLost", "PAI_K8S", "PAI_K8S", "PLATFORM_FAILURE", "RUNNING", "TRANSIENT", "ALWAYS_RETRY",
            "Pod lost due to node lost, maybe its kubelet is down for a long time"),
    130: ("ContainerSigIntReceived", "PAI_OS", "PAI_OS", "PLATFORM_FAILURE", "RUNNING", "TRANSIENT", "ALWAYS_RETRY",
          "Container killed by OS Signal: SIGINT"),
    131: ("ContainerSigQuitReceived", "PAI_OS", "PAI_OS", "PLATFORM_FAILURE", "RUNNING", "TRANSIENT", "ALWAYS_RETRY",
          "Container killed by OS Signal: SIGQUIT"),
    132: ("ContainerSigIllReceived", "USER_CONTAINER", "USER_CONTAINER", "USER_FAILURE", "RUNNING", "PERMANENT",
          "NEVER_RETRY", "Container killed by OS Signal: SIGILL"),
    134: ("ContainerSigAbrtReceived", "USER_CONTAINER", "UNKNOWN", "UNKNOWN_FAILURE", "RUNNING", "UNKNOWN",
          "RETRY_TO_MAX", "Container killed by OS Signal: SIGABRT"),
    135: ("ContainerSigBusReceived", "USER_CONTAINER", "USER_CONTAINER", "USER_FAILURE", "RUNNING", "PERMANENT",
          "NEVER_RETRY", "Container killed by OS Signal: SIGBUS"),
    136: ("ContainerSigFpeReceived", "USER_CONTAINER", "USER_CONTAINER", "USER_FAILURE", "RUNNING", "PERMANENT",
          "NEVER_RETRY", "Container killed by OS Signal: SIGFPE"),
    137: ("ContainerSigKillReceived", "PAI_OS", "PAI_OS", "PLATFORM_FAILURE", "RUNNING", "TRANSIENT", "ALWAYS_RETRY",
          "Container killed by OS Signal: SIGKILL"),
    139: ("ContainerSigSegvReceived", "USER_CONTAINER", "UNKNOWN", "UNKNOWN_FAILURE", "RUNNING", "UNKNOWN",
          "RETRY_TO_MAX", "Container killed by OS Signal: SIGSEGV"),
    141: ("ContainerSigPipeReceived", "USER_CONTAINER", "USER_CONTAINER", "USER_FAILURE", "RUNNING", "PERMANENT",
          "NEVER_RETRY", "Container killed by OS Signal: SIGPIPE"),
    143: ("ContainerSigTermReceived", "PAI_OS", "PAI_OS", "PLATFORM_FAILURE", "RUNNING", "TRANSIENT", "ALWAYS_RETRY",
          "Container killed by OS Signal: SIGTERM"),
    220: ("UserCommandExitWithError", "USER_CONTAINER", "USER_CONTAINER", "USER_FAILURE", "RUNNING", "PERMANENT",
          "NEVER_RETRY", "User command is invalid"),
    255: ("PAIRuntimeUnknownFailed", "PAI_RUNTIME", "UNKNOWN", "UNKNOWN_FAILURE", "UNKNOWN", "UNKNOWN",
          "RETRY_TO_MAX", "User command failed but the failure cannot be recognized by PAI Runtime"),
    256: ("PAIRuntimeExitAbnormally", "PAI_RUNTIME", "PAI_RUNTIME", "PLATFORM_FAILURE", "UNKNOWN", "UNKNOWN",
          "RETRY_TO_MAX", "PAI Runtime exit abnormally with undefined exitcode, it may have bugs"),
    -8000: ("ContainerUndefinedNegativeExitCode", "UNKNOWN", "UNKNOWN", "UNKNOWN_FAILURE", "UNKNOWN", "UNKNOWN",
            "RETRY_TO_MAX", "Container exited with undefined negative exitcode"),
}
_SIGNAL_CODES = {130, 131, 132, 134, 135, 136, 137, 139, 141, 143}
STOP_REQUESTED, ATTEMPT_COMPLETION, NODE_LOST = -210, -220, -1001


def exit_spec(code: int | None) -> dict | None:
    """frameworkConverter.generateExitSpec: the spec entry, else the 256 / -8000 fallback with the raw code."""
    if code is None:
        return None
    base = code if code in _SPEC else (256 if code > 0 else -8000)
    phrase, issuer, causer, typ, stage, behavior, reaction, reason = _SPEC[base]
    out = {"code": code, "phrase": phrase, "issuer": issuer, "causer": causer, "type": typ, "stage": stage,
           "behavior": behavior, "reaction": reaction}
    if reason:
        out["reason"] = reason
    return out


def is_permanent(code: int) -> bool:
    spec = _SPEC.get(code)
    return bool(spec) and spec[5] == "PERMANENT"


def runtime_exit(user_code: int, user_log: str) -> int:
    """The container exit code the runtime's exithandler chooses for the user command's exit code."""
    if user_code == 0:
        return 0
    if user_code in _SIGNAL_CODES:
        return user_code
    if user_code == 127 and re.search(r"(?i)command not found", user_log):
        return 220
    return 255


def container_diagnostics(container_code: int, user_code: int, user_log: str) -> str:
    """FrameworkController's diagnostics for a failed pod whose app container wrote the runtime's
    exit summary into its termination message (parsed back by rest-server generateExitDiagnostics)."""
    tail = "\n".join(user_log.splitlines()[-15:])
    summary = {"exitCode": container_code, "originUserExitCode": user_code,
               "errorLogs": {"user": tail, "platform": ""}}
    message = ("[PAI_RUNTIME_ERROR_START]\n" + yaml.safe_dump(summary, sort_keys=False)
               + "[PAI_RUNTIME_ERROR_END]")
    pod = {"containers": [{"name": "app", "reason": "Error", "message": message, "code": container_code}]}
    return "Pod failed: PodPattern unmatched: " + json.dumps(pod, separators=(",", ":"))


def exit_diagnostics(diag: str | None) -> dict | None:
    """frameworkConverter.generateExitDiagnostics: summary (pod status re-dumped as YAML) and the
    runtime's own summary when the container message holds one."""
    if not diag:
        return None
    out = {"diagnosticsSummary": diag, "runtime": None, "launcher": diag}
    m = re.search(r"matched: (.*)", diag)
    if not m:
        return out
    try:
        pod = json.loads(m.group(1))
    except ValueError:
        return out
    out["diagnosticsSummary"] = diag[:m.start() + len("matched:")] + "\n" + yaml.safe_dump(pod, sort_keys=False)
    out["launcher"] = out["diagnosticsSummary"]
    for c in pod.get("containers") or []:
        if c.get("code", 0) <= 0 or not c.get("message"):
            continue
        mm = re.search(r"\[PAI_RUNTIME_ERROR_START\](.*)\[PAI_RUNTIME_ERROR_END\]", c["message"], re.S)
        if mm:
            try:
                out["runtime"] = {**(yaml.safe_load(mm.group(1).strip()) or {}), "name": c.get("name")}
                out["launcher"] = None
            except yaml.YAMLError:
                pass
            break
    return out
