"""What the Kubernetes platforms share: a job platform (jobs.py) whose jobs are the environments'
main objects, on the cluster side in cluster.py (client, access, relay, wheel, dependencies).

A platform subclass only says what one environment's main object is (`main_object`) and how
its pods are named (`pod_names`); everything else lives here. Per environment we create:
- a Secret `<object>-nni` holding `ca.crt`, one token file per member (named for its pod) and,
  with the hub tunnel, `relay.token` (what the agents prove to the hub relay), mounted read-only:
  tokens never appear in a pod spec, argv or log;
- the main object (Pod / TFJob / PyTorchJob / Framework), whose pods run `nni-agent`.
Once per experiment: a ConfigMap with the manager's own agent wheel, and the image pull
Secret when `privateRegistryAuthPath` is set. Everything carries the labels `app`, `expId`
(and `envId`, `trialId`), so cleanup finds it after a manager restart too.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, ClassVar

from nni_manager.backends import agent_deps
from nni_manager.backends.agent_wheel import build_agent_wheel
from nni_manager.backends.base import BackendContext, EnvironmentRequest
from nni_manager.backends.jobs import Job, JobView, Phase, StateTable
from nni_manager.backends.kubernetes import nodes, owner, tunnel
from nni_manager.backends.kubernetes.client import KubeError, api_error
from nni_manager.backends.kubernetes.cluster import DRY_RUN_TRIAL, ClusterBackend, KubeOptionsT
from nni_manager.backends.kubernetes.main_objects import MainObjects
from nni_manager.backends.kubernetes.objects import APP, labels, selector
from nni_manager.backends.kubernetes.tracking import Platform, PodTracker
from nni_manager.backends.kubernetes.verdicts import MemberVerdicts
from nni_manager.backends.kubernetes.watch import describe_pod, watch_events, watch_pods

log = logging.getLogger(__name__)

__all__ = ["APP", "DRY_RUN_TRIAL", "KubeBackend", "labels", "selector"]


class KubeBackend(ClusterBackend[KubeOptionsT]):
    """Base of the Kubernetes platforms: a job platform (jobs.py) whose job is an environment's main
    object, named `object_name`, found by the experiment's labels; its pods' ends (the watch) and
    start verdicts (tracking.py) end members and jobs through jobs.py as the listing's do."""

    service = "Kubernetes"
    # how long an environment may stay stuck (image pull, crash loop) before it fails
    start_timeout: ClassVar[float] = 300.0
    # the main object's states (`state_of`) mapped onto the job phases, as every job platform's (jobs.py)
    states: ClassVar[StateTable] = StateTable.of(waiting=["Pending"], running=["Running"], succeeded=["Succeeded"],
                                                 failed=["Failed"])  # a pod's status.phase
    start_check_interval: ClassVar[float] = 2.0  # how often environments without running pods are looked at

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._stopping = False  # stop-all: objects are deleted without waiting for their operator's verdict
        self._deleted: set[str] = set()  # objects this manager deleted (release, then forget: once)
        self._retiring: set[asyncio.Task[None]] = set()  # deletions of jobs that ended on their own
        self._verdicts = MemberVerdicts(self)  # the tracker's context: pod verdicts through jobs.py
        self._watch: asyncio.Task[None] | None = None
        self._event_watch: asyncio.Task[None] | None = None  # why environments wait (the start checks read it)
        self._nodes: list[nodes.Node] | None = None  # None: unknown (nodes may not be listed), no check
        self._start_check: asyncio.Task[None] | None = None
        self._tracker = self._new_tracker(self._verdicts)

    @property
    def start_deadline(self) -> float:
        """jobs.py fails an environment none of whose pods all run by then (`environmentStartTimeout`)."""
        return self.kube.environment_start_timeout

    def object_name(self, env_id: str) -> str:
        """NNI's naming: nniexp<exp>env<n> (lower-case: Kubernetes names are DNS labels)."""
        return f"nniexp{self.experiment_id.lower()}{env_id.replace('-', '')}"

    def pod_names(self, object_name: str) -> list[tuple[str, str, int]]:
        """(pod name, role, index) of an environment's pods."""
        raise NotImplementedError

    def main_object(self, env: EnvironmentRequest, name: str, meta: dict[str, Any]) -> dict[str, Any]:
        """The object that makes the environment's pods (use `pod_template`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ Backend contract
    def member_names(self, env_id: str) -> list[tuple[str, str, int]]:
        return self.pod_names(self.object_name(env_id))

    def _new_tracker(self, ctx: Any) -> PodTracker:
        return PodTracker(Platform(self.kube, self.start_timeout, self.custom, self.operator_name, self.object_name,
                                   self.member_names, self.agent_of_pod), ctx)

    async def _unserved(self, custom_api: Any) -> str:
        """Why the main object's kind is not served, in one line (kubeflow.py: which operator to install)."""
        assert self.custom is not None
        group, version, _, kind = self.custom
        return (f"{kind} ({group}/{version}) is not served by this cluster: is the {self.operator_name} installed, "
                f"and does it serve {version}?")

    async def _prepare(self) -> None:
        """Platform objects made once per experiment, after the checks (FrameworkController's account)."""

    async def _cleanup_extra(self) -> None:
        """Delete what `_prepare` made (by the experiment's labels)."""

    async def start(self, ctx: BackendContext) -> None:
        """jobs.py's start (`open`, re-attach, polls), then the pod and event watches and the start checks."""
        self._tracker = self._new_tracker(self._verdicts)  # now: a platform may set `custom` in its __init__
        await super().start(ctx)
        ours = selector({"app": APP, "expId": self.experiment_id})
        self._watch = asyncio.create_task(watch_pods(self._api, self.namespace, ours, self._tracker.pod_event),
                                          name=f"{self.platform}-pod-watch")
        self._event_watch = asyncio.create_task(watch_events(self._api, self.namespace, self._tracker.events.seen),
                                                name=f"{self.platform}-event-watch")
        self._start_check = asyncio.create_task(self._tracker.check_starts(self._clients, self.start_check_interval),
                                                name=f"{self.platform}-start-check")
        self._api.retry_connections = True

    async def open(self) -> None:
        """Check access, the namespace and the operator, and make the per-experiment objects (the
        agent's wheel and dependencies, the pull secret, the tunnel), before any trial."""
        ctx = self.ctx
        assert ctx is not None
        core, custom = await self._client()
        self._api.retry_connections = False  # until started: an unreachable server is reported at once
        await self._check_access()
        ns = self.namespace
        try:  # fail at start, before any trial, when credentials or the operator are missing
            await core.list_namespaced_pod(ns, limit=1)
        except Exception as e:
            raise api_error(e, f"listing pods in namespace {ns}") from None
        if self.custom is not None:
            group, version, plural, kind = self.custom
            try:
                await custom.list_namespaced_custom_object(group, version, ns, plural, limit=1)
            except Exception as e:
                err = api_error(e, f"listing {plural}.{group}/{version} in namespace {ns}")
                if getattr(e, "status", None) == 404:
                    err = KubeError(await self._unserved(custom))
                raise err from None
        await owner.sweep_expired(core, ns, self.experiment_id)  # what dead managers left (owner.py)
        await self._prepare()
        self._wheel = await asyncio.to_thread(build_agent_wheel, ctx.experiment_dir / "agent-wheel")
        self._wheel_sha256 = await asyncio.to_thread(agent_deps.sha256_file, self._wheel.path)
        await self._ensure_wheel_configmap()
        await self._ensure_pull_secret()
        await self._ship_deps()
        self._nodes = await nodes.list_nodes(self._api)
        if self.tunnelled:
            self._tunnel = tunnel.Tunnel(self._api, ns, tunnel.relay_name(self.experiment_id),
                                         ctx.hub_listen_address, on_gone=self._ensure_relay_pod)
            await self._tunnel.start()

    def build_request(self, env: EnvironmentRequest, hub: str | None = None) -> list[dict[str, Any]]:
        """The environment's objects, in creation order: its Secret (the agents' tokens and the CA)
        and its main object (pod, TFJob, Framework, AdaptDLJob), for `provision` and the dry run."""
        name = self.object_name(env.env_id)
        meta = {"name": name, "namespace": self.namespace, "labels": labels(self.experiment_id, env)}
        return [self.objects.secret(env, name, meta), self.main_object(env, name, meta)]

    async def prepare(self, job: Job, env: EnvironmentRequest) -> list[dict[str, Any]]:
        await self._note_fit()
        return [await self._owned(o) for o in self.build_request(env)]

    async def submit(self, job: Job, request: list[dict[str, Any]]) -> None:
        """The environment's Secret, then its main object (`_create_main`); the Secret is owned by it."""
        core, _ = await self._client()
        name = job.name
        secret, obj = request
        self._deleted.discard(name)
        try:
            await core.create_namespaced_secret(self.namespace, secret, field_validation="Strict")
        except Exception as e:
            if getattr(e, "status", None) != 409:  # a restarted manager re-provisioning the same env
                raise api_error(e, f"creating secret {secret['metadata']['name']}") from None
        created = await self._create_main(obj, name, job)
        owner = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": name,
                 "uid": created["metadata"]["uid"], "controller": False, "blockOwnerDeletion": False}
        try:  # the Secret goes when its object goes (garbage collection), also if we are gone
            await core.patch_namespaced_secret(secret["metadata"]["name"], self.namespace,
                                               {"metadata": {"ownerReferences": [owner]}})
        except Exception as e:
            log.warning("cannot set the owner of secret %s: %s", secret["metadata"]["name"], e)
        self._tracker.starting.add(job.env_id)

    async def _create_main(self, obj: dict[str, Any], name: str, job: Job) -> dict[str, Any]:
        """Create the environment's main object. A namespace ResourceQuota that has no room for one
        more pod now (count/pods, pods, cpu, memory: other experiments' pods hold it) makes the
        environment wait, its reason said on its members, until the start deadline; a 409 adopts the
        object this environment made already."""
        deadline = time.monotonic() + self.start_deadline
        delay = 2.0
        while True:
            try:
                return await (await self._mains()).create(obj)
            except Exception as e:
                status = getattr(e, "status", None)
                created = await self._existing_main(name, obj) if status == 409 else None
                if created is not None:
                    return created
                error = api_error(e, f"creating {obj['kind']} {name}")
                if not (status == 403 and obj["kind"] == "Pod" and "exceeded quota" in str(getattr(e, "body", ""))
                        and time.monotonic() + delay < deadline):
                    raise error from None
                self._say(job, f"waiting for room in the namespace's quota: {error}")
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, 15.0)

    async def _note_fit(self) -> None:
        """A request bigger than every node now is said while its pod waits, never refused here: on
        an autoscaled cluster a node that holds it is made for the pending pod (the autoscaler says
        when it cannot, and the start deadline bounds the wait)."""
        if not self._nodes:  # unknown (nodes may not be listed), or no node yet (an autoscaler may add one)
            self._tracker.fit_note = ""
            return
        problem = nodes.too_big(self.kube, self._nodes)
        if problem:  # nodes may have grown since start: look once more
            self._nodes = await nodes.list_nodes(self._api)
            problem = nodes.too_big(self.kube, self._nodes) if self._nodes else ""
        self._tracker.fit_note = problem

    async def _existing_main(self, name: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        """After a 409: the object this environment made already (a create retried after a lost
        answer, a restarted manager), or None when the name belongs to something else."""
        try:
            found = await (await self._mains()).get(name)
        except Exception:
            return None
        mine = obj["metadata"]["labels"]
        have = (found.get("metadata") or {}).get("labels") or {}
        return found if all(have.get(k) == v for k, v in mine.items()) else None

    def state_of(self, obj: dict[str, Any]) -> str:
        """The main object's state as its operator records it (a key of `states`)."""
        return str((obj.get("status") or {}).get("phase") or "")

    def object_phase(self, obj: dict[str, Any]) -> Phase:
        """The main object's phase (jobs.py's: waiting, running, succeeded, failed, stopped, unknown)."""
        return self.states.phase(self.state_of(obj))

    async def _await_verdict(self, name: str) -> None:
        """reuseMode false: the trial is over and its replicas are ending by themselves; let the
        operator record the outcome on its object (so the object's status agrees with the trial)
        before deleting it. Bounded: a stuck object is deleted anyway."""
        if self.custom is None or self.reuse:
            return
        mains = await self._mains()
        deadline = time.monotonic() + self.config.trial_grace_period + 15
        while time.monotonic() < deadline:
            try:
                obj = await mains.get(name)
            except Exception:
                return
            if self.object_phase(obj) != "running":
                return
            await asyncio.sleep(0.2)

    async def cancel(self, job: Job) -> None:
        """Verdict, then delete: a released environment's object is deleted once its operator has
        recorded the trial's outcome (not at stop-all, nor for an object nothing wants)."""
        if job.released and job.env_id and not self._stopping:
            await self._await_verdict(job.name)
        await self._delete_env_objects(job.name)

    async def forget(self, job: Job) -> None:
        """A job that ended on its own (or was released): its object and Secret go, after its
        operator's verdict, in the background (its members are told at once)."""
        self._tracker.starting.discard(job.env_id)
        if job.name in self._deleted or self._stopping:
            return
        task = asyncio.create_task(self._retire(job), name=f"{self.platform}-delete-{job.name}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, job: Job) -> None:
        try:
            await self.cancel(dataclasses.replace(job, released=True))
        except self.errors as e:
            log.warning("deleting %s: %s", job.name, e)

    async def _delete_env_objects(self, name: str) -> None:
        """The environment's main object (its pods with it) and Secret; gone already is fine."""
        core, _ = await self._client()
        try:
            await (await self._mains()).delete(name, propagation_policy="Background")
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise api_error(e, f"deleting {name}") from None
        self._deleted.add(name)
        try:
            await core.delete_namespaced_secret(f"{name}-nni", self.namespace)
        except Exception as e:
            if getattr(e, "status", None) != 404:
                log.warning("deleting secret %s-nni: %s", name, e)

    async def stop(self) -> None:
        """The watch and start checks end; jobs.py's stop-all (every object of the experiment,
        retried, "may still run" when the cluster cannot be listed), then `close`."""
        self._stopping = True
        for task in (self._watch, self._event_watch, self._start_check, *self._verdicts.tasks, *self._retiring):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await super().stop()

    async def close(self) -> None:
        """Everything else the experiment made (by its labels), the tunnel, the relay, the owner."""
        if self._core is None:
            return
        core, custom = self._core, self._custom
        assert custom is not None
        ours = selector(labels(self.experiment_id))
        ns = self.namespace
        try:
            await MainObjects(self._api, core, custom, ns, self.custom).delete_all(ours)
            await core.delete_collection_namespaced_pod(ns, label_selector=ours)
            await core.delete_collection_namespaced_secret(ns, label_selector=ours)
            await core.delete_collection_namespaced_config_map(ns, label_selector=ours)
            await self._cleanup_extra()
            deadline = time.monotonic() + self.stop_deadline
            while time.monotonic() < deadline:  # pods end after their grace period
                if not (await core.list_namespaced_pod(ns, label_selector=ours)).items:
                    break
                await asyncio.sleep(0.5)
            else:
                log.error("pods of experiment %s are still terminating in namespace %s", self.experiment_id, ns)
        except Exception as e:
            log.error("cleaning up experiment %s: %s", self.experiment_id, api_error(e, "deleting objects"))
        finally:
            if self._tunnel is not None:
                await self._tunnel.stop()
                self._tunnel = None
            await self._delete_relay()
            await self._delete_owner()
            await self._api.close()
            self._core = self._custom = None

    # ------------------------------------------------------------------ the job pattern (jobs.py)
    @property
    def prefix(self) -> str:
        return f"nniexp{self.experiment_id.lower()}"

    def job_name(self, env_id: str, trial_id: str | None) -> str:
        return self.object_name(env_id)

    def job_label(self, job: Job) -> str:
        return self.object_label(job.name)

    def object_label(self, name: str) -> str:
        """An environment's main object in messages ("TFJob nniexp...", "pod nniexp...")."""
        return f"{self.custom[3] if self.custom else 'pod'} {name}"

    def submitted_words(self, job: Job) -> str:
        return f"{self.job_label(job)} is created in namespace {self.namespace}"

    def check_hint(self, job: Job) -> str:
        return (f"check its pods' logs (kubectl logs -n {self.namespace} -l envId={job.env_id}): the image needs "
                "Python >= 3.8, and the pods must reach the hub (the relay with hubTunnel, else nniManagerIp)")

    def enrolment_open(self, agent_id: str) -> bool | None:
        return None  # the pods' token files are not single-use: the hub need not ask

    async def list_jobs(self) -> dict[str, JobView]:
        """One list call, by the experiment's labels: every environment's main object."""
        try:
            found = await (await self._mains()).list(selector(labels(self.experiment_id)))
        except Exception as e:
            raise api_error(e, f"listing the {self.custom[2] if self.custom else 'pods'} of experiment "
                               f"{self.experiment_id} in namespace {self.namespace}") from None
        views: dict[str, JobView] = {}
        for obj in found:
            meta = obj.get("metadata") or {}
            if "envId" in (meta.get("labels") or {}):  # not the relay, nor a probe pod
                views[str(meta.get("name", ""))] = self._view(obj)
        return views

    def _view(self, obj: dict[str, Any]) -> JobView:
        """An object as a job view; its members' phases and words are what the pod watch saw."""
        name = str(obj["metadata"]["name"])
        state = self.state_of(obj)
        phase = self.states.phase(state)
        words = describe_pod(obj)[1] if self.custom is None else f"{self.object_label(name)} is {state or 'created'}"
        if self.custom is not None and phase == "stopped":  # never ours: this manager deletes what it stops
            words = self._stopped_words(name, state)
        job = next((j for j in self.jobs.values() if j.name == name), None)
        if job is None:
            return JobView(name, phase, words, state=state)
        members: dict[str, tuple[Phase, str]] = {}
        for m in job.members:
            pod = self._tracker.pod_states.get(m)
            if pod in ("failed", "oom", "succeeded", "gone"):
                said = self._tracker.last_words.get(m, words)
                if phase == "stopped" and pod == "gone":  # its pod went because its object was stopped
                    said = f"{words}: {said}" if said != words else words
                members[m] = ("failed" if pod in ("failed", "oom") else "stopped", said)
            else:  # live: what the watch and the start checks said last stays said
                members[m] = ("running" if pod == "running" else "waiting", job.said.get(m, words))
        return JobView(name, phase, words, state=state, members=members)

    async def ended_words(self, job: Job, view: JobView) -> str:
        """The last pod of an environment went away and its trial did not fail: when the main object
        itself was stopped (FrameworkController's `executionType: Stop`, a suspended job) or deleted
        by someone, say that in the platform's words, not only that the pod is being deleted."""
        if view.phase != "stopped" or self.custom is None or self._stopping or view.state:
            return view.words  # a listing's view (`state` set) says it already (`_view`)
        try:  # before jobs.py's forget deletes the object (jobs.py `_ended`)
            obj = await (await self._mains()).get(job.name)
        except Exception as e:
            if getattr(e, "status", None) == 404 and job.name not in self._deleted:
                return f"{self.object_label(job.name)} was deleted outside this experiment: {view.words}"
            return view.words  # the pod's words stand
        state = self.state_of(obj)
        if self.states.phase(state) == "stopped":
            return f"{self._stopped_words(job.name, state)}: {view.words}"
        return view.words

    def _stopped_words(self, name: str, state: str) -> str:
        return f"{self.object_label(name)} was stopped outside this experiment ({state})"

    def agent_of_pod(self, pod: dict[str, Any]) -> str:
        """The agent a pod runs: the pod's name (platforms whose operator names pods unpredictably
        say otherwise)."""
        return str(pod.get("metadata", {}).get("name", ""))
