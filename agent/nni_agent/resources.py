"""CPU and memory of a trial's whole process tree.

psutil.Process objects are cached across samples: cpu_percent() measures since the
previous call on the same object, and the cache also guards against PID reuse.
"""

from __future__ import annotations

import psutil

from nni_agent.process import MARKER_ENV, descendants
from nni_agent.v1 import agent_pb2 as pb


class TreeSampler:
    """Samples the root process, its descendants and the agent's descendants with the marker.

    `key` is the trial's marker value `<agent_key>/<trial_id>` (Trial.marker).
    """

    def __init__(self, root_pid: int, key: str) -> None:
        self._root_pid = root_pid
        self._key = key
        self._trial_id = key.rpartition("/")[2]
        self._procs: dict[int, psutil.Process] = {}
        self._not_ours: dict[int, psutil.Process] = {}  # agent descendants without the marker

    def sample(self) -> pb.TrialResources:
        cpu = 0.0
        rss = 0
        count = 0
        for proc in self._members():
            try:
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue
                    cpu += proc.cpu_percent()
                    rss += proc.memory_info().rss
                count += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._procs.pop(proc.pid, None)
        return pb.TrialResources(trial_id=self._trial_id, cpu_percent=cpu, rss_bytes=rss, num_processes=count)

    def _members(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self._root_pid)
            found[root.pid] = root
            found.update((p.pid, p) for p in descendants(root.pid))
        except psutil.NoSuchProcess:
            pass
        agent_descendants = descendants()
        for proc in agent_descendants:
            if proc.pid not in found and self._has_marker(proc):
                found[proc.pid] = proc
        alive = {p.pid for p in agent_descendants}
        for pid in [pid for pid in self._not_ours if pid not in alive]:
            del self._not_ours[pid]
        members = []
        for pid, proc in found.items():
            cached = self._procs.get(pid)
            if cached is None or not cached.is_running():  # new, or the pid was reused
                cached = self._procs[pid] = proc
            members.append(cached)
        for pid in [pid for pid in self._procs if pid not in found]:
            del self._procs[pid]
        return members

    def _has_marker(self, proc: psutil.Process) -> bool:
        if proc.pid in self._procs and self._procs[proc.pid].is_running():
            return True
        known = self._not_ours.get(proc.pid)
        if known is not None and known.is_running():
            return False
        try:
            ours = proc.environ().get(MARKER_ENV) == self._key
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
        if not ours:
            self._not_ours[proc.pid] = proc
        return ours
