"""The frameworkbarrier init container (microsoft/frameworkcontroller v1.0.1 ``pkg/barrier``).

The kubelet runs :func:`run_barrier` instead of a process for an init container whose image is
``frameworkcontroller/frameworkbarrier`` (any tag).  Like the real barrier it reads its Framework
(``FC_FRAMEWORK_NAMESPACE``/``FC_FRAMEWORK_NAME`` from the container's env, which the controller
injected) until every task of every task role has a non-empty ``attemptStatus.podIP`` in the
Framework's *status*, then writes ``framework.json`` (the Framework object) and ``injector.sh``
(``export FB_<ROLE>_IPS=...`` / ``FB_<ROLE>_ADDRESSES=<ip>:${FB_<ROLE>_PORT},...``) into the volume
mounted at the container's ``/mnt/frameworkbarrier`` and exits 0.

Exit codes as the real one: 0 passed; 201 (ContainerTransientConflictFailed) timeout
(``BARRIER_CHECK_TIMEOUT_SEC``, default 600, allowed 60..1200); 210 (ContainerPermanentFailed)
Framework not found or bad configuration (``BARRIER_CHECK_INTERVAL_SEC`` < 5, no framework name).
It is a real client of the API server: it GETs its Framework over HTTPS with the token of the pod's
service account, so RBAC decides (a 401/403 is logged and retried until the timeout, as the real one
does: nni#4146). Deviation: it polls every ``POLL_SECONDS`` (0.2 s) instead of every
``BARRIER_CHECK_INTERVAL_SEC`` (default 10 s), so tests do not wait; the timeout is the real one.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
import time
from pathlib import Path
from typing import Callable

import aiohttp

from .crds import FRAMEWORKS

log = logging.getLogger(__name__)

BARRIER_IMAGE_RE = re.compile(r"^(?:[^/]+\.[^/]+/)?(?:docker\.io/)?frameworkcontroller/frameworkbarrier(?::[^@]*)?(?:@.*)?$")
POLL_SECONDS = 0.2
EXIT_SUCCEEDED = 0
EXIT_TRANSIENT_CONFLICT_FAILED = 201
EXIT_PERMANENT_FAILED = 210
INJECTOR_FILE = "./injector.sh"


def is_barrier_image(image: str | None) -> bool:
    """True for ``frameworkcontroller/frameworkbarrier`` with any tag (and optional registry)."""
    return bool(image) and bool(BARRIER_IMAGE_RE.match(image))


def barrier_container(pod: dict) -> dict | None:
    for c in (pod.get("spec") or {}).get("initContainers") or []:
        if is_barrier_image(c.get("image")):
            return c
    return None


def _env(container: dict, pod: dict) -> dict[str, str]:
    env = {}
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    env.setdefault("FC_FRAMEWORK_NAMESPACE", ann.get("FC_FRAMEWORK_NAMESPACE", pod["metadata"].get("namespace", "default")))
    env.setdefault("FC_FRAMEWORK_NAME", ann.get("FC_FRAMEWORK_NAME", ""))
    return env


def is_barrier_passed(f: dict) -> bool:
    total = ready = 0
    status = f.get("status") or {}
    trss = {t["name"]: t for t in ((status.get("attemptStatus") or {}).get("taskRoleStatuses") or [])}
    for tr in (f.get("spec") or {}).get("taskRoles") or []:
        n = int(tr.get("taskNumber", 0))
        total += n
        trs = trss.get(tr["name"])
        if trs is None:
            continue
        for ts in trs["taskStatuses"][:n]:
            if not ts.get("deletionPending") and (ts.get("attemptStatus") or {}).get("podIP"):
                ready += 1
    return ready >= total


def task_role_env_name(role: str, suffix: str) -> str:
    return "_".join(["FB", role.upper(), suffix])


def generate_injector(f: dict) -> str:
    out = ["#!/bin/bash\n"]
    status = f.get("status")
    if status:
        out.append("\n")
        out.append(f"echo {INJECTOR_FILE}: Start to inject environment variables\n")
        out.append("\n")
        specs = {tr["name"]: tr for tr in (f.get("spec") or {}).get("taskRoles") or []}
        trss = (status.get("attemptStatus") or {}).get("taskRoleStatuses") or []
        for trs in trss:
            spec = specs.get(trs["name"])
            if spec is None:
                continue
            name = task_role_env_name(trs["name"], "IPS")
            ips = [ts["attemptStatus"]["podIP"] for ts in trs["taskStatuses"][:int(spec.get("taskNumber", 0))]]
            out.append(f"export {name}={','.join(ips)}\n")
            out.append(f"echo {name}=${{{name}}}\n")
        out.append("\n")
        for trs in trss:
            spec = specs.get(trs["name"])
            if spec is None:
                continue
            name = task_role_env_name(trs["name"], "ADDRESSES")
            port = task_role_env_name(trs["name"], "PORT")
            addrs = [ts["attemptStatus"]["podIP"] + ":${" + port + "}"
                     for ts in trs["taskStatuses"][:int(spec.get("taskNumber", 0))]]
            out.append(f"export {name}={','.join(addrs)}\n")
            out.append(f"echo {name}=${{{name}}}\n")
        out.append("\n")
        out.append(f"echo {INJECTOR_FILE}: Succeeded to inject environment variables\n")
    return "".join(out)


async def run_barrier(cluster, pod: dict, volume_dir: Path | str,
                      log_line: Callable[[str], None] | None = None) -> int:
    """Run the frameworkbarrier for ``pod`` (its barrier init container); write the files into
    ``volume_dir`` (the host directory of the volume the container mounts at /mnt/frameworkbarrier);
    return the container's exit code. Call on the emulator's loop."""
    say = log_line or (lambda s: log.info("%s", s))
    container = barrier_container(pod) or {}
    env = _env(container, pod)
    ns, name = env.get("FC_FRAMEWORK_NAMESPACE") or "default", env.get("FC_FRAMEWORK_NAME", "")
    try:
        interval = int(env.get("BARRIER_CHECK_INTERVAL_SEC") or 10)
        timeout = int(env.get("BARRIER_CHECK_TIMEOUT_SEC") or 600)
    except ValueError as e:
        say(f"Failed to parse barrier check env: {e}")
        return EXIT_PERMANENT_FAILED
    if not name:
        say("Validation Failed: ${FC_FRAMEWORK_NAME} should not be empty")
        return EXIT_PERMANENT_FAILED
    if interval < 5:
        say(f"Validation Failed: ${{BARRIER_CHECK_INTERVAL_SEC}} {interval} should not be less than 5")
        return EXIT_PERMANENT_FAILED
    if timeout < 60 or timeout > 20 * 60:
        say(f"Validation Failed: ${{BARRIER_CHECK_TIMEOUT_SEC}} {timeout} should not be less than 60 "
            "or greater than 20 * 60")
        return EXIT_PERMANENT_FAILED
    say("Running frameworkbarrier")
    if (pod.get("spec") or {}).get("automountServiceAccountToken") is False:
        say("Failed to create kube client: unable to load in-cluster configuration, no service account token")
        return EXIT_PERMANENT_FAILED
    account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    token = cluster.service_account_token(pod["metadata"]["namespace"], account)
    url = f"{cluster.api_url}/apis/{FRAMEWORKS.group}/{FRAMEWORKS.version}/namespaces/{ns}/{FRAMEWORKS.plural}/{name}"
    tls = ssl.create_default_context(cafile=str(cluster.ca_file))
    deadline = time.monotonic() + timeout
    last_problem = ""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        while True:
            f = None
            try:  # the real one: client-go in-cluster config, as the pod's service account
                async with session.get(url, ssl=tls, timeout=aiohttp.ClientTimeout(total=10)) as r:
                    body = await r.json(content_type=None)
                    if r.status == 200:
                        f = body
                    elif r.status == 404:
                        say(f"BarrierPermanentFailed: {body.get('message', 'not found')}")
                        return EXIT_PERMANENT_FAILED
                    else:  # 401/403/5xx: transient to the barrier, retried until its timeout
                        problem = f"Failed to get Framework object from ApiServer: {body.get('message', r.status)}"
                        if problem != last_problem:
                            say(problem)
                            last_problem = problem
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                problem = f"Failed to get Framework object from ApiServer: {e}"
                if problem != last_problem:
                    say(problem)
                    last_problem = problem
            if f is not None and is_barrier_passed(f):
                say("BarrierSucceeded: All Tasks are ready with not nil PodIP.")
                d = Path(volume_dir)
                d.mkdir(parents=True, exist_ok=True)
                (d / "framework.json").write_text(json.dumps(f, separators=(",", ":")))
                inj = d / "injector.sh"
                inj.write_text(generate_injector(f))
                inj.chmod(0o755)
                return EXIT_SUCCEEDED
            if time.monotonic() >= deadline:
                say("BarrierTransientConflictFailed: Timeout to wait all Tasks are ready with not nil PodIP.")
                return EXIT_TRANSIENT_CONFLICT_FAILED
            await asyncio.sleep(POLL_SECONDS)
