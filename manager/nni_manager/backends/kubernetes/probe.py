"""The image probe pod's life (deps.py says what it answers): create it, wait for its report,
delete it. A multi-GB image takes minutes to pull and a GPU node minutes to be made, so the probe
waits while it is pending or pulling, up to the start deadline (`environmentStartTimeout`), and
says the pull's progress in the manager's log; only the check itself, once its container runs,
has a short budget."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

log = logging.getLogger(__name__)

RUN_TIMEOUT = 120.0  # seconds for the check once the probe's container runs
FIRST_SAY = 2.0  # seconds of waiting before the first progress line
PROGRESS_EVERY = 10.0  # seconds between two progress lines while it waits
GIVE_UP = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
           "CreateContainerError", "CrashLoopBackOff"}


async def _waiting_words(core: Any, namespace: str, name: str, got: Any) -> str:
    """What the probe waits for, in the cluster's words: a node (the scheduler's reason) or its image."""
    for cond in (got.status.conditions or []) if got.status else []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"waiting for a node ({cond.reason}: {cond.message})"
    try:
        events = (await core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")).items
    except Exception:  # events are a courtesy
        events = []
    pulling = [e for e in events if e.reason == "Pulling"]
    if pulling and not [e for e in events if e.reason == "Pulled"]:
        return f"pulling its image ({pulling[-1].message})"
    return "starting"


async def run_probe(core: Any, namespace: str, name: str, pod: dict[str, Any], image: str,
                    start_timeout: float) -> dict[str, Any] | None:
    """Run the probe pod and read its report; None when it gives none (the image does not start,
    has no Python, ...: its agent pods then say why, as without shipping)."""
    try:
        await core.create_namespaced_pod(namespace, pod, field_validation="Strict")
    except Exception as e:  # an ApiException: the agent pods will say why
        log.warning("cannot start the probe pod %s: %s", name, getattr(e, "reason", e))
        return None
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        run_deadline: float | None = None
        next_say = began + FIRST_SAY
        while True:
            got = await core.read_namespaced_pod(name, namespace)
            statuses = (got.status.container_statuses or []) if got.status else []
            for cs in statuses:
                if cs.state and cs.state.terminated:
                    try:
                        report = json.loads(cs.state.terminated.message or "")
                    except ValueError:
                        return None
                    return report if isinstance(report, dict) and "version" in report else None
                if cs.state and cs.state.waiting and cs.state.waiting.reason in GIVE_UP:
                    log.warning("the probe pod %s (image %s): %s: %s", name, image, cs.state.waiting.reason,
                                cs.state.waiting.message or "")
                    return None
            now = loop.time()
            if any(cs.state and cs.state.running for cs in statuses):
                run_deadline = run_deadline or now + RUN_TIMEOUT
                if now > run_deadline:
                    log.warning("the probe pod %s gave no answer in %.0f s", name, RUN_TIMEOUT)
                    return None
            else:
                if now - began > start_timeout:
                    words = await _waiting_words(core, namespace, name, got)
                    log.warning("the probe pod %s (image %s) did not start within environmentStartTimeout "
                                "(%g s): %s", name, image, start_timeout, words)
                    return None
                if now >= next_say:
                    next_say = now + PROGRESS_EVERY
                    words = await _waiting_words(core, namespace, name, got)
                    log.info("the probe pod %s (image %s) is %s: %.0f s so far, waiting up to "
                             "environmentStartTimeout (%g s)", name, image, words, now - began, start_timeout)
            await asyncio.sleep(0.3)
    finally:
        try:
            await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except Exception as e:
            log.debug("deleting the probe pod %s: %s", name, e)
