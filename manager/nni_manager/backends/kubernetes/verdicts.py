"""The pod watch's and the start checks' verdicts (tracking.PodTracker) through the job pattern:
a member whose pod ended ends alone, the last one ends its job by jobs.py's `_ended`, as the
listing's verdicts do; what they say of a live member goes to the core and is remembered as said.
"""
from __future__ import annotations

import asyncio
from typing import Any

from nni_manager.backends.jobs import Job, JobBackend, JobView, Phase


class MemberVerdicts:
    """The PodTracker's context: what the pod watch and the start checks say of a member goes to
    the core, and a member's end ends it alone or, the last one, its job, through jobs.py."""

    def __init__(self, backend: JobBackend[Any, Any]) -> None:
        self.backend = backend
        self.tasks: set[asyncio.Task[None]] = set()  # jobs being ended (stop cancels them)

    def _job(self, agent_id: str) -> Job | None:
        return next((j for j in self.backend.jobs.values() if agent_id in j.members), None)

    def agent_status(self, agent_id: str, message: str) -> None:
        job, ctx = self._job(agent_id), self.backend.ctx
        if job is None or ctx is None or job.done or job.released or agent_id in job.ended:
            return
        job.said[agent_id] = message
        ctx.agent_status(agent_id, message)

    def agent_failed(self, agent_id: str, reason: str, *, failed: bool = False) -> None:
        job, b = self._job(agent_id), self.backend
        if job is None or job.done or agent_id in job.ended:
            return
        phase: Phase = "failed" if failed else "stopped"
        view = JobView(job.name, phase, reason, members={agent_id: (phase, reason)})
        if all(m == agent_id or m in job.ended for m in job.members):
            if not failed:  # its pod went away: the job's words (ended_words) may say who stopped it
                view = JobView(job.name, phase, reason)
            task = asyncio.create_task(b._ended(job, view), name=f"{b.platform}-ended-{job.name}")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        else:
            b._members_ended(job, view)
