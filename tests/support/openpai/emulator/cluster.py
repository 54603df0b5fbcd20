"""The cluster behind the rest-server: virtual-cluster capacity (gang or per-task allocation),
FrameworkController's attempt lifecycle (completion policy, stop, job/task retries) and the runtime
that runs each task's commands as a local process with the environment PAI injects."""
from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from . import exitspec, protocol, runtime
from .model import DELETING_STATES, WAITING_STATES, Job, Task, completion_status, convert_name, now_ms

log = logging.getLogger("pai-emulator")
RESOURCE_KEYS = ("tasks", "cpu", "memoryMB", "gpu")


class Cluster:
    def __init__(self, state_dir: Path, config: dict, instance: str, grace: float):
        self.state_dir, self.instance, self.grace = state_dir, instance, grace
        self.users: dict[str, dict] = {}
        for name, u in (config.get("users") or {}).items():
            self.users[name] = {"username": name, "admin": bool(u.get("admin")),
                                "virtualClusters": list(u.get("virtualClusters") or ["default"]),
                                "storages": list(u.get("storages") or []),
                                "defaultStorages": list(u.get("defaultStorages", u.get("storages") or []))}
        self.tokens = {u["token"]: name for name, u in (config.get("users") or {}).items()}
        self.vcs: dict[str, dict] = {n: {k: (c or {}).get(k) for k in RESOURCE_KEYS}
                                     for n, c in (config.get("virtualClusters") or {"default": {}}).items()}
        # storage name -> the directory that backs it (the NFS export), mounted into tasks
        self.storage_dirs: dict[str, str] = dict(config.get("storageServers") or {})
        # docker image -> a bin dir put first on PATH, standing for what the image holds (others: the host's)
        self.images: dict[str, str] = dict(config.get("images") or {})
        self.jobs: dict[str, Job] = {}
        self._seq = 0
        self._ports: set[int] = set()
        self._kick = asyncio.Event()
        self._closing = False

    # ------------------------------------------------------------------ submit / stop
    def add_job(self, user: str, vc: str, raw: str, proto: dict) -> Job:
        self._seq += 1
        roles = {}
        for name, r in proto["taskRoles"].items():
            inst = r.get("instances") or 1
            comp = r.get("completion") or {}
            ports = dict((r["resourcePerInstance"].get("ports") or {}))
            for p in ("ssh", "http"):
                ports.setdefault(p, 1)
            roles[convert_name(name)] = {
                "name": name, "instances": inst, "minFailed": comp.get("minFailedInstances") or 1,
                "minSucceeded": comp.get("minSucceededInstances") or inst,
                "taskRetryCount": r.get("taskRetryCount") or 0, "ports": ports,
                "resources": {k: r["resourcePerInstance"][k] for k in ("cpu", "memoryMB", "gpu")}}
        extras = proto.get("extras") or {}
        job = Job(user=user, name=proto["name"], vc=vc, raw=protocol.mask(raw), protocol=proto,
                  secrets=proto.get("secrets"), seq=self._seq, submission=now_ms(), roles=roles,
                  gang=extras.get("gangAllocation") is not False, max_retry=proto.get("jobRetryCount") or 0)
        self._new_attempt(job)
        self.jobs[job.framework_name] = job
        self.kick()
        return job

    def stop(self, job: Job, execution_type: str) -> None:
        job.execution_type = execution_type
        self.kick()

    def kick(self) -> None:
        self._kick.set()

    # ------------------------------------------------------------------ capacity
    def used(self, vc: str) -> dict:
        use = dict.fromkeys(RESOURCE_KEYS, 0)
        for j in self.jobs.values():
            if j.vc != vc:
                continue
            for t in j.all_tasks():
                if t.holds:
                    use["tasks"] += 1
                    for k in ("cpu", "memoryMB", "gpu"):
                        use[k] += t.resources[k]
        return use

    def _fits(self, vc: str, tasks: list[Task]) -> bool:
        cap, use = self.vcs.get(vc) or {}, self.used(vc)
        need = {"tasks": len(tasks), **{k: sum(t.resources[k] for t in tasks) for k in ("cpu", "memoryMB", "gpu")}}
        return all(cap.get(k) is None or use[k] + need[k] <= cap[k] for k in RESOURCE_KEYS)

    def set_capacity(self, vc: str, capacity: dict) -> None:
        cur = self.vcs.setdefault(vc, dict.fromkeys(RESOURCE_KEYS))
        for k in RESOURCE_KEYS:
            if k in capacity:
                cur[k] = capacity[k]
        self.kick()

    # ------------------------------------------------------------------ the controller loop
    async def run(self) -> None:
        while not self._closing:
            await self._kick.wait()
            self._kick.clear()
            try:
                await self.reconcile()
            except Exception:          # keep serving; the log shows the bug
                log.exception("reconcile failed")

    async def reconcile(self) -> None:
        for job in sorted(self.jobs.values(), key=lambda j: j.seq):
            if job.state == "Completed":
                continue
            if job.execution_type == "STOP" and job.state not in DELETING_STATES:
                self._complete_attempt(job, completion_status(
                    exitspec.STOP_REQUESTED, "User has requested to stop the Framework"))
            if job.state in WAITING_STATES:
                await self._schedule(job)
            if job.state == "AttemptRunning":
                await self._task_retries(job)
                self._completion_policy(job)
            if job.state in DELETING_STATES and not any(t.holds for t in job.all_tasks()):
                self._finish_attempt(job)

    async def _schedule(self, job: Job) -> None:
        job.state = "AttemptPreparing"
        pending = [t for t in job.all_tasks() if t.state in WAITING_STATES]
        for t in pending:
            t.state = "AttemptPreparing"
        if job.gang:
            if pending and self._fits(job.vc, pending):
                for t in pending:
                    t.ip = "127.0.0.1"
                for t in pending:
                    await self._start(job, t)
        else:
            for t in pending:
                if self._fits(job.vc, [t]):
                    t.ip = "127.0.0.1"
                    await self._start(job, t)
        if any(t.state == "AttemptRunning" for t in job.all_tasks()):
            job.state = "AttemptRunning"
            job.attempt_launched = job.attempt_launched or now_ms()
            job.launched = job.launched or job.attempt_launched

    async def _task_retries(self, job: Job) -> None:
        """Per-task retry (taskRetryCount), effective only without gang allocation, as in PAI."""
        if job.gang:
            return
        for t in job.all_tasks():
            role = job.roles[t.fc_role]
            if (t.state == "Completed" and t.code not in (0, None, -210, -220)
                    and t.retries < role["taskRetryCount"] and not exitspec.is_permanent(t.code)):
                t.retries += 1
                t.accountable += 1
                self._reset_task(t)
                t.state = "AttemptPreparing"
                if self._fits(job.vc, [t]):
                    t.ip = "127.0.0.1"
                    await self._start(job, t)

    def _completion_policy(self, job: Job) -> None:
        """FrameworkAttemptCompletionPolicy: first role whose failed/succeeded count reaches its minimum
        decides; else all tasks completed -> succeeded."""
        first: tuple | None = None
        for fc_role, tasks in job.tasks.items():
            spec = job.roles[fc_role]
            done = sorted((t for t in tasks if t.state == "Completed" and t.code not in (-210, -220)
                           and not self._will_retry(job, t)), key=lambda t: (t.completed or 0, t.index))
            for minc, word, pred in ((spec["minFailed"], "Failed", lambda t: t.code != 0),
                                     (spec["minSucceeded"], "Succeeded", lambda t: t.code == 0)):
                hits = [t for t in done if pred(t)]
                if minc >= 1 and len(hits) >= minc:
                    trig = hits[minc - 1]
                    if first is None or (trig.completed or 0) < (first[0].completed or 0):
                        first = (trig, f"{word}TaskCount {len(hits)} has reached Min{word}TaskCount {minc} "
                                       "in the TaskRole")
        if first is not None:
            t, msg = first
            cs = dict(t.completion)
            cs["trigger"] = {"message": msg, "taskRoleName": t.fc_role, "taskIndex": t.index}
            self._complete_attempt(job, cs)
            return
        tasks = job.all_tasks()
        if tasks and all(t.state == "Completed" for t in tasks):
            last = max(tasks, key=lambda t: (t.completed or 0, t.index))
            diag = (f"CompletedTaskCount {len(tasks)} has reached TotalTaskCount {len(tasks)} and no user "
                    "specified conditions in FrameworkAttemptCompletionPolicy have ever been triggered")
            self._complete_attempt(job, completion_status(
                0, diag, {"message": diag, "taskRoleName": last.fc_role, "taskIndex": last.index}))

    def _will_retry(self, job: Job, t: Task) -> bool:
        role = job.roles[t.fc_role]
        return (not job.gang and t.code not in (0, None) and t.retries < role["taskRetryCount"]
                and not exitspec.is_permanent(t.code))

    def _complete_attempt(self, job: Job, cs: dict) -> None:
        """Attempt decided: force-complete every task still there (-220), then wait for the pods."""
        job.completion = cs
        job.state = "AttemptDeletionRequested"
        for t in job.all_tasks():
            if t.state == "Completed":
                continue
            if t.alive:
                t.kill_code = exitspec.ATTEMPT_COMPLETION
                t.completion = completion_status(exitspec.ATTEMPT_COMPLETION,
                                                 "Stop to complete current FrameworkAttempt")
                t.state = "AttemptDeletionRequested"
                asyncio.ensure_future(runtime.kill_tree(t.proc.pid, self.instance, t.key, self.grace))
            else:
                t.completion = completion_status(exitspec.ATTEMPT_COMPLETION,
                                                 "Stop to complete current FrameworkAttempt")
                t.kill_code = exitspec.ATTEMPT_COMPLETION
                t.state, t.completed = "Completed", now_ms()
        self.kick()

    def _finish_attempt(self, job: Job) -> None:
        job.attempt_completed = now_ms()
        code = job.code
        if (code != 0 and job.execution_type != "STOP" and job.retries < job.max_retry
                and not exitspec.is_permanent(code)):
            job.history[job.attempt_id] = job.detail()
            job.history[job.attempt_id]["jobStatus"]["attemptState"] = "FAILED"
            job.retries += 1
            job.accountable += 1
            job.attempt_id += 1
            job.attempt_uid = str(uuid.uuid4())
            job.completion = None
            self._new_attempt(job)
            self.kick()
            return
        job.state, job.completed = "Completed", job.attempt_completed

    def _new_attempt(self, job: Job) -> None:
        job.state = "AttemptCreationPending"
        job.attempt_created, job.attempt_launched, job.attempt_completed = now_ms(), None, None
        job.tasks = {}
        for fc_role, spec in job.roles.items():
            job.tasks[fc_role] = []
            for i in range(spec["instances"]):
                t = Task(role=spec["name"], fc_role=fc_role, index=i, resources=spec["resources"],
                         port_spec=spec["ports"])
                self._reset_task(t)
                job.tasks[fc_role].append(t)

    def _reset_task(self, t: Task) -> None:
        if t.pod_uid is not None:
            t.attempt_id += 1
        t.state, t.pod_uid, t.ip, t.proc, t.kill_code, t.completion = "AttemptCreationPending", str(uuid.uuid4()), \
            None, None, None, None
        t.created = t.created or now_ms()
        t.attempt_created, t.attempt_launched, t.completed = now_ms(), None, None
        t.ports = {k: runtime.free_ports(n, self._ports) for k, n in t.port_spec.items()}

    # ------------------------------------------------------------------ the runtime
    async def _start(self, job: Job, t: Task) -> None:
        base = self.state_dir / "jobs" / job.debug_id / f"attempt-{job.attempt_id}" / \
            f"{t.fc_role}-{t.index}-{t.attempt_id}"
        work = base / "work"
        work.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o700)
        t.key = f"{job.debug_id}/{job.attempt_id}/{t.fc_role}/{t.index}/{t.attempt_id}"
        entry = job.protocol["taskRoles"][t.role]["entrypoint"]
        script = base / "user.sh"
        runtime.write_script(script, protocol.render_secrets(entry, job.secrets))
        env = self.task_env(job, t, work)
        t.state = "AttemptRunning"
        t.attempt_launched = now_ms()
        t.launched = t.launched or t.attempt_launched
        t.proc = await runtime.spawn(script, work, env, base / "logs", mounts=self.mounts(job))
        asyncio.ensure_future(self._watch(job, t, t.proc, base / "logs"))

    async def _watch(self, job: Job, t: Task, proc: Any, logs: Path) -> None:
        rc = await proc.wait()
        await runtime.kill_now(None, self.instance, t.key)     # the container's other processes go too
        user_code = rc if rc >= 0 else 128 - rc
        if t.proc is not proc:
            return
        if t.kill_code is not None:
            reason = {exitspec.ATTEMPT_COMPLETION: "Stop to complete current FrameworkAttempt",
                      exitspec.NODE_LOST: "Pod lost due to node lost"}.get(t.kill_code, "")
            t.completion = completion_status(t.kill_code, reason)
        else:
            user_log = ""
            for name in ("user.pai.stderr", "user.pai.stdout"):
                try:
                    user_log += (logs / name).read_text(errors="replace")[-16384:]
                except OSError:
                    pass
            code = exitspec.runtime_exit(user_code, user_log)
            diag = "" if code == 0 else exitspec.container_diagnostics(code, user_code, user_log)
            t.completion = completion_status(code, diag or "Pod succeeded")
        t.state, t.completed, t.proc = "Completed", now_ms(), None
        self.kick()

    def mounts(self, job: Job) -> list[tuple[str, str]]:
        """(backing dir, path in the container) of the job's storages, as PAI's storage plugin
        mounts them: at `mountPath`, else at /mnt/<name>."""
        out = []
        for s in ((job.protocol.get("extras") or {}).get("storages") or []):
            name = s.get("name") if isinstance(s, dict) else None
            if name in self.storage_dirs:
                out.append((self.storage_dirs[name], s.get("mountPath") or f"/mnt/{name}"))
        return out

    def task_env(self, job: Job, t: Task, work: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PAI_", "FC_"))}
        proto = job.protocol
        roles = list(proto["taskRoles"])
        total = sum(r["instances"] for r in job.roles.values())
        fw = {"PAI_FRAMEWORK_NAME": job.framework_name, "PAI_JOB_NAME": job.framework_name,
              "PAI_USER_NAME": job.user, "PAI_DEFAULT_FS_URI": "", "PAI_TASK_ROLE_COUNT": len(roles),
              "PAI_TASK_ROLE_LIST": ",".join(roles), "PAI_VIRTUAL_CLUSTER": job.vc}
        for name, r in proto["taskRoles"].items():
            spec = job.roles[convert_name(name)]
            rp, eco = r["resourcePerInstance"], r.get("extraContainerOptions") or {}
            fw[f"PAI_TASK_ROLE_TASK_COUNT_{name}"] = spec["instances"]
            fw[f"PAI_RESOURCE_{name}"] = f"{rp['gpu']},{rp['cpu']},{rp['memoryMB']},{eco.get('shmMB', 0)}"
            fw[f"PAI_MIN_FAILED_TASK_COUNT_{name}"] = spec["minFailed"]
            fw[f"PAI_MIN_SUCCEEDED_TASK_COUNT_{name}"] = spec["minSucceeded"]
        fw.update({"PAI_USERNAME": job.user, "PAI_TASKS_NUM": total, "PAI_JOB_TASK_COUNT": total,
                   "PAI_TASK_ROLES_NUM": len(roles), "PAI_JOB_TASK_ROLE_COUNT": len(roles),
                   "PAI_JOB_TASK_ROLE_LIST": ",".join(roles),
                   "PAI_CURRENT_TASK_ROLE_NAME": t.role, "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": t.index,
                   "PAI_TASK_INDEX": t.index})
        if t.resources["gpu"] == 0:
            fw["NVIDIA_VISIBLE_DEVICES"] = "none"
        fw.update({"FC_FRAMEWORK_NAMESPACE": "default", "FC_FRAMEWORK_NAME": job.debug_id,
                   "FC_TASKROLE_NAME": t.fc_role, "FC_TASK_INDEX": t.index,
                   "FC_CONFIGMAP_NAME": f"{job.debug_id}-attempt",
                   "FC_POD_NAME": f"{job.debug_id}-{t.fc_role}-{t.index}", "FC_FRAMEWORK_UID": job.uid,
                   "FC_FRAMEWORK_ATTEMPT_ID": job.attempt_id, "FC_FRAMEWORK_ATTEMPT_INSTANCE_UID": job.attempt_uid,
                   "FC_TASK_UID": t.uid, "FC_TASK_ATTEMPT_ID": t.attempt_id, "FC_POD_UID": t.pod_uid})
        # openpai-runtime framework_parser.py generate_runtime_env
        instances = []
        for fc_role, tasks in job.tasks.items():
            hosts = []
            for o in tasks:
                instances.append(f"{fc_role}:{o.index}")
                for label, ports in o.ports.items():
                    s = ",".join(map(str, ports))
                    fw[f"PAI_PORT_LIST_{fc_role}_{o.index}_{label}"] = s
                    fw[f"PAI_{fc_role}_{o.index}_{label}_PORT"] = s
                if o.ip:
                    fw[f"PAI_HOST_IP_{fc_role}_{o.index}"] = o.ip
                    hosts.append(f"{o.ip}:{o.ports['http'][0]}")
            fw[f"PAI_TASK_ROLE_{fc_role}_HOST_LIST"] = ",".join(hosts)
        fw["PAI_TASK_ROLE_INSTANCES"] = ",".join(instances)
        fw.update({"PAI_CURRENT_CONTAINER_IP": t.ip, "PAI_CURRENT_CONTAINER_PORT": t.ports["http"][0],
                   "PAI_CONTAINER_HOST_IP": t.ip, "PAI_CONTAINER_HOST_PORT": t.ports["http"][0],
                   "PAI_CONTAINER_SSH_PORT": t.ports["ssh"][0]})
        port_str = ""
        for label, ports in t.ports.items():
            s = ",".join(map(str, ports))
            fw[f"PAI_CONTAINER_HOST_{label}_PORT_LIST"] = s
            port_str += f"{label}:{s};"
        fw["PAI_CONTAINER_HOST_PORT_LIST"] = port_str
        fw["PAI_WORK_DIR"] = str(work)
        fw[runtime.INSTANCE_ENV] = self.instance
        fw[runtime.TASK_ENV] = t.key
        env.update({k: str(v) for k, v in fw.items()})
        image_bin = self.images.get(self.image_of(job, t.role) or "")
        if image_bin:
            env["PATH"] = image_bin + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        return env

    @staticmethod
    def image_of(job: Job, role: str) -> str | None:
        """The uri of the dockerimage prerequisite the task role names."""
        ref = job.protocol["taskRoles"][role].get("dockerImage")
        image = ((job.protocol.get("prerequisites") or {}).get("dockerimage") or {}).get(ref)  # by type, then name
        return image.get("uri") if isinstance(image, dict) else None

    # ------------------------------------------------------------------ test controls
    def find_task(self, framework_name: str, role: str, index: int) -> Task | None:
        job = self.jobs.get(framework_name)
        if job is None:
            return None
        for t in job.tasks.get(role) or job.tasks.get(convert_name(role)) or []:
            if t.index == index:
                return t
        return None

    async def kill_task(self, t: Task, node_lost: bool) -> bool:
        """A node failure: the task's processes die at once (SIGKILL -> 137, or -1001 PodNodeLost)."""
        if not t.alive:
            return False
        if node_lost:
            t.kill_code = exitspec.NODE_LOST
        await runtime.kill_now(t.proc.pid, self.instance, t.key)
        return True

    def live_pids(self) -> list[dict]:
        out = []
        for j in self.jobs.values():
            for t in j.all_tasks():
                if t.key:
                    for pid in runtime.marked_pids(self.instance, t.key):
                        out.append({"pid": pid, "job": j.framework_name, "taskRole": t.fc_role,
                                    "taskIndex": t.index})
        seen = {p["pid"] for p in out}
        out += [{"pid": p, "job": None, "taskRole": None, "taskIndex": None}
                for p in runtime.marked_pids(self.instance) if p not in seen]
        return out

    async def shutdown(self) -> None:
        """SIGTERM: every task process tree goes (grace, then SIGKILL)."""
        self._closing = True
        self.kick()
        waits = [runtime.kill_tree(t.proc.pid if t.alive else None, self.instance, t.key, self.grace)
                 for j in self.jobs.values() for t in j.all_tasks() if t.key]
        await asyncio.gather(*waits, return_exceptions=True)
        for pid in runtime.marked_pids(self.instance):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
