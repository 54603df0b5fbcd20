"""Scheduler + kubelet + node lifecycle: pods run as real local process groups."""
from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from .api import CONFIGMAPS, NODES, PODS, SECRETS, ApiError, bad_request, not_found
from .autoscaler import Autoscaler
from .store import Store
from .util import now_rfc3339, now_rfc3339_micro, parse_quantity

INIT = str(Path(__file__).with_name("container_init.py"))
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STARTED_AT = "emulator.nni/started-at"
MARK_INSTANCE, MARK_POD = "KUBE_EMULATOR_INSTANCE", "KUBE_EMULATOR_POD"


def marked_pids(key: str, value: str) -> list[int]:
    needle = f"{key}={value}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(d))
        except OSError:
            pass
    return out


def _kill_pids(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


class Container:
    def __init__(self, spec: dict, init: bool):
        self.spec, self.init = spec, init
        self.name = spec["name"]
        self.proc: asyncio.subprocess.Process | None = None
        self.state: dict = {"waiting": {"reason": "PodInitializing" if not init else "ContainerCreating"}}
        self.last_state: dict = {}
        self.restart_count = 0
        self.ready = False
        self.started = False
        self.oom = False
        self.log_path: Path | None = None
        self.term_file: Path | None = None


class PodRun:
    def __init__(self, pod: dict):
        self.uid = pod["metadata"]["uid"]
        self.ns, self.name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.node = pod["spec"]["nodeName"]
        self.inits = [Container(c, True) for c in pod["spec"].get("initContainers") or []]
        self.containers = [Container(c, False) for c in pod["spec"]["containers"]]
        for c in self.containers:
            c.state = {"waiting": {"reason": "PodInitializing" if self.inits else "ContainerCreating"}}
        self.task: asyncio.Task | None = None
        self.terminating = False
        self.done = False
        self.evicted: str | None = None
        self.netns: str | None = None   # --pod-network bridged: the pod's own network namespace
        self.ip: str | None = None


def tmp_root(instance: str) -> Path:
    """Where an emulator instance's containers have their /tmp (the fixture removes it even when
    the emulator was killed)."""
    return Path("/tmp") / f"kube-emu-tmp-{instance}"


class Kubelet:
    def __init__(self, store: Store, state: Path, instance: str, images: list[str], nodes: list[str],
                 start_delay: float, use_namespaces: bool, net=None):
        self.store, self.state, self.instance = store, state, instance
        # --pod-network bridged (podnet.PodNetwork): every pod gets a network namespace of its own on
        # the emulator's bridge, so pods reach each other but never the manager's loopback
        self.net = net
        self.images = {}
        for spec in images:
            name, _, bindir = spec.partition("=")
            self.images[name] = bindir
        self.start_delay = start_delay
        self.use_namespaces = use_namespaces and os.geteuid() == 0
        self.runs: dict[str, PodRun] = {}
        self.pulls: dict[tuple, asyncio.Future] = {}  # (node, image) -> its pull (done: present on the node)
        self.wake = asyncio.Event()
        self.created_host_paths: list[str] = []
        self.pods_dir = state / "pods"
        # each container's /tmp: under a root any container user may traverse (a runAsUser process
        # cannot reach into the 0700 state directory), removed with its pod and at shutdown
        self.tmp_root = tmp_root(instance)
        self.tmp_root.mkdir(mode=0o711, exist_ok=True)  # exists: this instance's, restarted
        self.tmp_root.chmod(0o711)
        self.pods_dir.mkdir(exist_ok=True)
        for spec in nodes:
            name, _, vals = spec.partition("=")
            cpu, mem, gpus = (vals.split(",") + ["8", "16384", "0"][len(vals.split(",")):])[:3] if vals else ("8", "16384", "0")
            self.set_node(name, cpu, mem, gpus)
        store.pod_deleter = self._on_delete
        store.subscribe(self._on_change)
        self.autoscaler = Autoscaler(store, lambda g, name: self.set_node(name, g.cpu, g.memory_mi, g.gpus, g.labels))

    # ------------------------------------------------------------ nodes
    def set_node(self, name, cpu=None, memory=None, gpus=None, labels=None) -> None:
        cur = self.store.get(NODES, None, name)
        if cur is None:
            node = {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                         "kubernetes.io/arch": "amd64", **(labels or {})}},
                    "spec": {}, "status": {}}
            cur = self.store.create(NODES, node)
        cap = dict(cur["status"].get("capacity") or {"cpu": "8", "memory": "16384Mi", "nvidia.com/gpu": "0", "pods": "110"})
        if cpu is not None:
            cap["cpu"] = str(cpu)
        if memory is not None:
            cap["memory"] = f"{int(memory)}Mi" if str(memory).isdigit() else str(memory)
        if gpus is not None:
            cap["nvidia.com/gpu"] = str(gpus)
        now = now_rfc3339()
        status = {"capacity": cap, "allocatable": dict(cap),
                  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                  "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                                  "lastTransitionTime": now}],
                  "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
                  "nodeInfo": {"kubeletVersion": "v1.33.0-emulator", "operatingSystem": "linux", "architecture": "amd64",
                               "containerRuntimeVersion": "emulator://1", "osImage": "emulated", "kernelVersion": os.uname().release,
                               "machineID": "", "systemUUID": "", "bootID": "", "kubeProxyVersion": ""}}
        if labels:
            self.store.patch_metadata(NODES, None, name, labels=labels)
        self.store.update_status(NODES, None, name, status)
        self.wake.set()

    def node_lost(self, name: str) -> None:
        """The node's machine is gone: its processes die; the node controller marks it NotReady, the cloud
        node lifecycle deletes it, and PodGC marks its pods Failed (DisruptionTarget) and force-deletes them."""
        node = self.store.get(NODES, None, name)
        if node is None:
            raise not_found(NODES, name)
        for run in [r for r in self.runs.values() if r.node == name]:
            run.done = True
            if run.task:
                run.task.cancel()
            self._kill_run(run, signal.SIGKILL)
            if self.net is not None:
                asyncio.ensure_future(self.net.remove_pod(run.uid))
        st = node["status"]
        now = now_rfc3339()
        st["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                             "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": now,
                             "lastTransitionTime": now}]
        self.store.update_status(NODES, None, name, st)
        self.store.record_event(node, "NodeNotReady", f"Node {name} status is now: NodeNotReady", "Normal", "node-controller")
        for pod in self.store.list(PODS):
            if pod["spec"].get("nodeName") != name:
                continue
            s = pod.get("status") or {}
            if s.get("phase") not in ("Succeeded", "Failed"):
                s["phase"] = "Failed"
                conds = [c for c in s.get("conditions") or [] if c["type"] not in ("Ready", "ContainersReady", "DisruptionTarget")]
                conds += [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                           "message": "PodGC: node no longer exists", "lastTransitionTime": now},
                          {"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": now},
                          {"type": "ContainersReady", "status": "False", "reason": "PodFailed", "lastTransitionTime": now}]
                s["conditions"] = conds
                self.store.update_status(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], s)
            self.store.pods_stopped.add(pod["metadata"]["uid"])
            try:
                self.store.remove(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
            except ApiError:
                pass
        self.store.remove(NODES, None, name)
        self.wake.set()

    # ------------------------------------------------------------ scheduler
    def _on_change(self, type_: str, res, obj: dict) -> None:
        if res == PODS and type_ in ("ADDED", "DELETED"):
            self.wake.set()
        elif res == PODS and type_ == "MODIFIED" and obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            self.wake.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            try:
                self.schedule()
            except Exception:
                import traceback
                traceback.print_exc()
            await asyncio.sleep(0.02)

    @staticmethod
    def _requests(pod: dict) -> dict[str, float]:
        tot: dict[str, float] = {}
        for c in pod["spec"]["containers"]:
            r = c.get("resources") or {}
            req = dict(r.get("limits") or {})
            req.update(r.get("requests") or {})
            for k, v in req.items():
                tot[k] = tot.get(k, 0) + parse_quantity(v)
        for c in pod["spec"].get("initContainers") or []:
            r = c.get("resources") or {}
            req = dict(r.get("limits") or {})
            req.update(r.get("requests") or {})
            for k, v in req.items():
                tot[k] = max(tot.get(k, 0), parse_quantity(v))
        return tot

    def schedule(self) -> None:
        pods = self.store.list(PODS)
        nodes = self.store.list(NODES)
        used: dict[str, dict[str, float]] = {n["metadata"]["name"]: {"pods": 0} for n in nodes}
        for p in pods:
            nn = p["spec"].get("nodeName")
            if nn in used and p["status"].get("phase") not in ("Succeeded", "Failed"):
                for k, v in self._requests(p).items():
                    used[nn][k] = used[nn].get(k, 0) + v
                used[nn]["pods"] += 1
        pending = sorted((p for p in pods if not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")),
                         key=lambda p: int(p["metadata"]["resourceVersion"]))
        for pod in pending:
            req = self._requests(pod)
            reasons: dict[str, int] = {}
            chosen = None
            selector_fail = 0
            for n in nodes:
                name = n["metadata"]["name"]
                alloc = n["status"].get("allocatable") or {}
                fail = []
                sel = pod["spec"].get("nodeSelector") or {}
                labels = n["metadata"].get("labels") or {}
                if any(labels.get(k) != v for k, v in sel.items()):
                    fail.append("node(s) didn't match Node's node affinity/selector")
                    selector_fail += 1
                else:
                    for t in n["spec"].get("taints") or []:
                        if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(pod, t):
                            fail.append(f"node(s) had untolerated taint {{{t['key']}: {t.get('value', '')}}}")
                    for k in sorted(set(req) | {"pods"}):
                        want = req.get(k, 0) if k != "pods" else 1
                        if want <= 0:
                            continue
                        have = parse_quantity(alloc.get(k, "0")) - used[name].get(k, 0)
                        if want > have + 1e-9:
                            fail.append("Too many pods" if k == "pods" else f"Insufficient {k}")
                if not fail and chosen is None:
                    chosen = name
                for f in fail:
                    reasons[f] = reasons.get(f, 0) + 1
            if chosen:
                for k, v in req.items():
                    used[chosen][k] = used[chosen].get(k, 0) + v
                used[chosen]["pods"] += 1
                self._bind(pod, chosen)
                continue
            total = len(nodes)
            parts = ", ".join(f"{c} {r}" for r, c in sorted(reasons.items()))
            msg = f"0/{total} nodes are available: {parts}." if total else "no nodes available to schedule pods"
            if total:
                helpful = total - selector_fail
                if helpful > 0:
                    pre = [f"{helpful} No preemption victims found for incoming pod"]
                    if selector_fail:
                        pre.insert(0, f"{selector_fail} Preemption is not helpful for scheduling")
                    msg += f" preemption: 0/{total} nodes are available: {', '.join(pre)}."
                else:
                    msg += f" preemption: 0/{total} nodes are available: {total} Preemption is not helpful for scheduling."
            st = pod["status"]
            old = [c for c in st.get("conditions") or [] if c["type"] == "PodScheduled"]
            if not old or old[0].get("message") != msg:
                st["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": msg, "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}]
                self.store.update_status(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], st)
                self.store.record_event(pod, "FailedScheduling", msg, "Warning", "default-scheduler")
            self.autoscaler.unschedulable(pod, req)

    def _bind(self, pod: dict, node: str) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        cur = self.store.objects[PODS].get(key)
        if cur is None:
            return
        old = copy.deepcopy(cur)
        cur["spec"]["nodeName"] = node
        now = now_rfc3339()
        st = cur["status"]
        st["conditions"] = [{"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now}]
        cur["metadata"]["resourceVersion"] = self.store._next_rv()
        self.store._emit("MODIFIED", PODS, cur, old)
        self.store.record_event(cur, "Scheduled", f"Successfully assigned {key[0]}/{key[1]} to {node}", "Normal", "default-scheduler")
        run = PodRun(copy.deepcopy(cur))
        self.runs[run.uid] = run
        run.task = asyncio.ensure_future(self._pod_main(run))

    # ------------------------------------------------------------ pod status
    def _pod(self, run: PodRun) -> dict | None:
        cur = self.store.objects[PODS].get((run.ns, run.name))
        if cur is None or cur["metadata"]["uid"] != run.uid:
            return None
        return cur

    def _cstatus(self, pod: dict, c: Container) -> dict:
        d = {"name": c.name, "state": copy.deepcopy(c.state), "lastState": copy.deepcopy(c.last_state),
             "ready": c.ready, "restartCount": c.restart_count, "image": c.spec.get("image"),
             "imageID": f"emulator://{c.spec.get('image')}", "started": c.started and "running" in c.state}
        if c.proc is not None or "terminated" in c.state:
            d["containerID"] = f"emulator://{run_cid(pod, c)}"
        return d

    def _publish(self, run: PodRun, phase: str | None = None, reason: str | None = None, message: str | None = None) -> None:
        cur = self._pod(run)
        if cur is None:
            return
        st = copy.deepcopy(cur.get("status") or {})
        now = now_rfc3339()
        st["hostIP"] = "127.0.0.1"
        st["hostIPs"] = [{"ip": "127.0.0.1"}]
        st.setdefault("startTime", now)
        if phase:
            st["phase"] = phase
        if reason:
            st["reason"] = reason
        if message:
            st["message"] = message
        if run.inits:
            st["initContainerStatuses"] = [self._cstatus(cur, c) for c in run.inits]
        st["containerStatuses"] = [self._cstatus(cur, c) for c in run.containers]
        if any("running" in c.state or c.started for c in run.containers) or st.get("phase") == "Running" \
                or any("running" in c.state or "terminated" in c.state for c in run.inits):  # sandbox IP before inits (frameworkbarrier)
            st["podIP"] = run.ip or "127.0.0.1"
            st["podIPs"] = [{"ip": run.ip or "127.0.0.1"}]
        inits_done = all("terminated" in c.state and c.state["terminated"]["exitCode"] == 0 for c in run.inits)
        ready = all(c.ready for c in run.containers) and st.get("phase") == "Running"
        terminal = st.get("phase") in ("Succeeded", "Failed")
        old = {c["type"]: c for c in st.get("conditions") or []}

        def cond(t, ok, r=None):
            prev = old.get(t)
            s = "True" if ok else "False"
            c = {"type": t, "status": s, "lastProbeTime": None,
                 "lastTransitionTime": prev["lastTransitionTime"] if prev and prev["status"] == s else now}
            if r and not ok:
                c["reason"] = r
            return c
        not_ready_reason = "PodCompleted" if terminal and st.get("phase") == "Succeeded" else (
            "PodFailed" if terminal else "ContainersNotReady")
        conds = [cond("PodReadyToStartContainers", True)]
        conds.append(cond("Initialized", inits_done or terminal and st.get("phase") == "Succeeded",
                          "ContainersNotInitialized"))
        conds.append(cond("Ready", ready, not_ready_reason))
        conds.append(cond("ContainersReady", ready, not_ready_reason))
        conds.append(old.get("PodScheduled") or cond("PodScheduled", True))
        if "DisruptionTarget" in old:
            conds.append(old["DisruptionTarget"])
        if not ready and not terminal:
            names = [c.name for c in run.containers if not c.ready]
            conds[2]["message"] = conds[3]["message"] = f"containers with unready status: [{' '.join(names)}]"
        if not inits_done and not terminal:
            pend = [c.name for c in run.inits if not ("terminated" in c.state and c.state["terminated"]["exitCode"] == 0)]
            conds[1]["message"] = f"containers with incomplete status: [{' '.join(pend)}]"
        st["conditions"] = conds
        self.store.update_status(PODS, run.ns, run.name, st)

    # ------------------------------------------------------------ pod lifecycle
    async def _pod_main(self, run: PodRun) -> None:
        try:
            self._publish(run)
            await asyncio.sleep(self.start_delay)
            if self.net is not None:  # the sandbox's network first, as the CNI plugin makes it
                run.netns, run.ip = await self.net.add_pod(run.uid, run.ns, run.name)
            # image pull
            backoff = 1.0
            while True:
                bad = [c for c in run.inits + run.containers
                       if c.spec.get("image") not in self.images and not _is_barrier(c.spec.get("image"))]
                if not bad:
                    break
                pod = self._pod(run)
                if pod is None:
                    return
                for c in bad:
                    img = c.spec.get("image")
                    ref = _docker_ref(img)
                    self.store.record_event(pod, "Pulling", f'Pulling image "{img}"', "Normal", "kubelet")
                    err = (f'failed to pull and unpack image "{ref}": failed to resolve reference "{ref}": '
                           f'pull access denied, repository does not exist or may require authorization: '
                           f'server message: insufficient_scope: authorization failed')
                    c.state = {"waiting": {"reason": "ErrImagePull", "message": f"rpc error: code = NotFound desc = {err}"}}
                    self.store.record_event(pod, "Failed", f'Failed to pull image "{img}": rpc error: code = NotFound desc = {err}', "Warning", "kubelet")
                    self.store.record_event(pod, "Failed", "Error: ErrImagePull", "Warning", "kubelet")
                self._publish(run, "Pending")
                await asyncio.sleep(min(backoff, 1.0))
                pod = self._pod(run)
                if pod is None:
                    return
                for c in bad:
                    img = c.spec.get("image")
                    c.state = {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{img}"'}}
                    self.store.record_event(pod, "BackOff", f'Back-off pulling image "{img}"', "Normal", "kubelet")
                    self.store.record_event(pod, "Failed", "Error: ImagePullBackOff", "Warning", "kubelet")
                self._publish(run, "Pending")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            if not await self._pull_images(run):
                return
            # volumes
            while True:
                pod = self._pod(run)
                if pod is None:
                    return
                try:
                    vols = self._prepare_volumes(run, pod)
                    break
                except _MountError as e:
                    self.store.record_event(pod, "FailedMount", str(e), "Warning", "kubelet")
                    await asyncio.sleep(1.0)
            policy = pod["spec"].get("restartPolicy", "Always")
            # init containers
            for c in run.inits:
                delay = 1.0
                while True:
                    code = await self._run_container(run, c, vols)
                    if code is None:
                        return
                    if code == 0:
                        break
                    if policy == "Never":
                        for m in run.containers:
                            m.state = {"waiting": {"reason": "PodInitializing"}}
                        self._publish(run, "Failed")
                        run.done = True
                        return
                    c.last_state = {"terminated": c.state["terminated"]}
                    c.state = {"waiting": {"reason": "CrashLoopBackOff",
                                           "message": f"back-off {int(delay)}s restarting failed container={c.name} pod={run.name}_{run.ns}({run.uid})"}}
                    c.restart_count += 1
                    self._publish(run, "Pending")
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10)
            # app containers, all concurrently
            results = await asyncio.gather(*(self._container_loop(run, c, vols, policy) for c in run.containers))
            if any(r is None for r in results) or run.terminating:
                return
            phase = "Succeeded" if all(r == 0 for r in results) else "Failed"
            self._publish(run, phase)
            run.done = True
        except asyncio.CancelledError:
            pass
        except Exception:
            import traceback
            traceback.print_exc()

    async def _container_loop(self, run: PodRun, c: Container, vols, policy: str):
        delay = 1.0
        while True:
            code = await self._run_container(run, c, vols)
            if code is None or run.terminating:
                return None
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                return code
            c.last_state = {"terminated": c.state["terminated"]}
            c.state = {"waiting": {"reason": "CrashLoopBackOff",
                                   "message": f"back-off {int(delay)}s restarting failed container={c.name} pod={run.name}_{run.ns}({run.uid})"}}
            c.restart_count += 1
            pod = self._pod(run)
            if pod is None:
                return None
            self.store.record_event(pod, "BackOff", f"Back-off restarting failed container {c.name} in pod {run.name}_{run.ns}({run.uid})", "Warning", "kubelet")
            self._publish(run, "Running")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10)

    async def _run_container(self, run: PodRun, c: Container, vols: dict) -> int | None:
        """Start one attempt of c; return its exit code (None if the pod went away)."""
        pod = self._pod(run)
        if pod is None or run.terminating:
            return None
        cdir = self.pods_dir / run.uid / "containers" / c.name
        cdir.mkdir(parents=True, exist_ok=True)
        c.log_path = cdir / f"{c.restart_count}.log"
        c.term_file = cdir / f"{c.restart_count}.termination-log"
        c.term_file.write_text("")
        c.oom = False
        if _is_barrier(c.spec.get("image")):
            return await self._run_barrier(run, pod, c, vols)
        argv = list(c.spec.get("command") or []) + list(c.spec.get("args") or [])
        try:
            env = self._env(pod, c, run.ip)
            user = _process_user(pod, c.spec)
        except _ConfigError as e:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            self.store.record_event(pod, "Failed", f"Error: {e}", "Warning", "kubelet")
            self._publish(run, "Pending")
            await asyncio.sleep(1.0)
            return await self._run_container(run, c, vols)
        # a container's /tmp is its own and goes with it (a restart gets a fresh one), where here it
        # is the host's: the container's TMPDIR is a directory of its own (the spec's env may name another)
        tmp = self.tmp_root / run.uid / c.name / f"tmp{c.restart_count}"
        tmp.mkdir(parents=True, exist_ok=True)
        for d in (tmp.parent, tmp.parent.parent):
            d.chmod(0o711)
        tmp.chmod(0o1777)  # any runAsUser may write it, as /tmp
        env = {"TMPDIR": str(tmp), **env}
        env = {k: _expand(v, env) if isinstance(v, str) else v for k, v in env.items()}
        argv = [_expand(a, env) for a in argv]
        if not c.spec.get("command"):
            msg = ('failed to create containerd task: failed to create shim task: OCI runtime create failed: '
                   'runc create failed: unable to start container process: error during container init: '
                   'exec: no command specified: unknown')
            c.state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": msg,
                                      "startedAt": "1970-01-01T00:00:00Z", "finishedAt": now_rfc3339(),
                                      "containerID": f"emulator://{run_cid(pod, c)}"}}
            self.store.record_event(pod, "Failed", f"Error: {msg}", "Warning", "kubelet")
            self._publish(run)
            return 128
        mounts = []
        for m in c.spec.get("volumeMounts") or []:
            src = vols[m["name"]]
            if m.get("subPath"):
                src = os.path.join(src, m["subPath"])
                os.makedirs(src, exist_ok=True) if not os.path.exists(src) else None
            mounts.append({"source": str(src), "target": m["mountPath"], "readOnly": bool(m.get("readOnly"))})
        tmp_path = c.spec.get("terminationMessagePath") or "/dev/termination-log"
        if self.use_namespaces:
            mounts.append({"source": str(c.term_file), "target": tmp_path, "readOnly": False})
            if self.net is not None and run.ip:  # the kubelet-managed names (see podnet.py)
                mounts.append({"source": str(self.net.hosts_path(run.uid)), "target": "/etc/hosts", "readOnly": True})
                mounts.append({"source": str(self.net.resolv_path(run.uid)), "target": "/etc/resolv.conf",
                               "readOnly": True})
        scratch = cdir / f"scratch{c.restart_count}"
        scratch.mkdir(exist_ok=True)
        spec = {"namespaces": self.use_namespaces, "hostname": run.name, "scratch": str(scratch), "mounts": mounts,
                "workingDir": c.spec.get("workingDir") or "/", "argv": argv, "env": env, "user": user,
                "netns": run.netns}
        spec_file = cdir / f"spec{c.restart_count}.json"
        spec_file.write_text(json.dumps(spec))
        if self.use_namespaces:
            for _m in mounts:            # fallback host dirs if overlays are unavailable are created inside
                pass
        c.state = {"waiting": {"reason": "ContainerCreating"}}
        log = open(c.log_path, "ab")
        try:
            c.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", INIT, str(spec_file), stdin=asyncio.subprocess.DEVNULL, stdout=log,
                stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True, cwd="/")
        finally:
            log.close()
        started = now_rfc3339()
        self.store.patch_metadata(PODS, run.ns, run.name, annotations={
            STARTED_AT + ("" if c is run.containers[0] else f".{c.name}"): now_rfc3339_micro()}) \
            if not c.init else None
        c.state = {"running": {"startedAt": started}}
        c.started = True
        c.ready = not c.init
        self.store.record_event(pod, "Created", f"Created container: {c.name}", "Normal", "kubelet")
        self.store.record_event(pod, "Started", f"Started container {c.name}", "Normal", "kubelet")
        all_started = all("running" in x.state for x in run.containers)
        self._publish(run, "Running" if (not c.init and (all_started or pod["status"].get("phase") == "Running")) else None)
        rc = await c.proc.wait()
        c.ready = False
        finished = now_rfc3339()
        code = rc if rc >= 0 else 128 + (-rc)
        term = {"exitCode": code, "startedAt": started, "finishedAt": finished,
                "containerID": f"emulator://{run_cid(pod, c)}"}
        if rc < 0:
            term["signal"] = -rc
        reason = "OOMKilled" if c.oom else ("Completed" if code == 0 else "Error")
        term["reason"] = reason
        msg = ""
        try:
            msg = c.term_file.read_text(errors="replace")[:4096] if c.term_file.exists() else ""
        except OSError:
            pass
        if not msg and code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            msg = _log_tail(c.log_path)
        if msg:
            term["message"] = msg
        c.state = {"terminated": term}
        if run.evicted is None and not run.terminating and self._pod(run) is not None:
            self._publish(run)
        return code

    async def _run_barrier(self, run: PodRun, pod: dict, c: Container, vols: dict) -> int:
        """FrameworkController's barrier init container, played in-process by barrier.run_barrier."""
        from . import barrier
        vdir = next((vols[m["name"]] for m in c.spec.get("volumeMounts") or []
                     if m.get("mountPath", "").rstrip("/") == "/mnt/frameworkbarrier"), None)
        if vdir is None:
            vdir = str(self.pods_dir / run.uid / "barrier")
            os.makedirs(vdir, exist_ok=True)
        started = now_rfc3339()
        c.state = {"running": {"startedAt": started}}
        c.started = True
        self._publish(run)

        def log_line(line: str) -> None:
            with open(c.log_path, "a") as f:
                f.write(line if line.endswith("\n") else line + "\n")
        code = await barrier.run_barrier(self.store, pod, vdir, log_line=log_line)
        term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": started,
                "finishedAt": now_rfc3339(), "containerID": f"emulator://{run_cid(pod, c)}"}
        if code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            term["message"] = _log_tail(c.log_path)
        c.state = {"terminated": term}
        if self._pod(run) is not None:
            self._publish(run)
        return code

    # ------------------------------------------------------------ env and volumes
    def _env(self, pod: dict, c: Container, ip: str | None = None) -> dict:
        img_bin = self.images.get(c.spec.get("image"), "")
        env = {"PATH": (img_bin + ":" if img_bin else "") + BASE_PATH, "HOSTNAME": pod["metadata"]["name"],
               "HOME": "/root", "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
        if self.net is not None:  # the `kubernetes` Service, proxied to the API server
            env["KUBERNETES_SERVICE_HOST"] = self.net.kubernetes_ip
        ns = pod["metadata"]["namespace"]
        for ef in c.spec.get("envFrom") or []:
            prefix = ef.get("prefix", "")
            if ef.get("configMapRef"):
                ref = ef["configMapRef"]
                cm = self.store.get(CONFIGMAPS, ns, ref.get("name"))
                if cm is None:
                    if ref.get("optional"):
                        continue
                    raise _ConfigError(f'configmap "{ref.get("name")}" not found')
                for k, v in (cm.get("data") or {}).items():
                    env[prefix + k] = v
            if ef.get("secretRef"):
                ref = ef["secretRef"]
                s = self.store.get(SECRETS, ns, ref.get("name"))
                if s is None:
                    if ref.get("optional"):
                        continue
                    raise _ConfigError(f'secret "{ref.get("name")}" not found')
                for k, v in (s.get("data") or {}).items():
                    env[prefix + k] = base64.b64decode(v).decode(errors="replace")
        for e in c.spec.get("env") or []:
            if "valueFrom" not in e or e.get("valueFrom") is None:
                env[e["name"]] = e.get("value") or ""
                continue
            vf = e["valueFrom"]
            if vf.get("fieldRef"):
                env[e["name"]] = _field(pod, vf["fieldRef"]["fieldPath"], ip)
            elif vf.get("secretKeyRef") or vf.get("configMapKeyRef"):
                is_secret = bool(vf.get("secretKeyRef"))
                ref = vf.get("secretKeyRef") or vf.get("configMapKeyRef")
                obj = self.store.get(SECRETS if is_secret else CONFIGMAPS, ns, ref.get("name"))
                kind = "secret" if is_secret else "configmap"
                if obj is None:
                    if ref.get("optional"):
                        continue
                    raise _ConfigError(f'{kind} "{ref.get("name")}" not found')
                data = obj.get("data") or {}
                if ref.get("key") not in data:
                    if ref.get("optional"):
                        continue
                    raise _ConfigError(f"couldn't find key {ref.get('key')} in {'Secret' if is_secret else 'ConfigMap'} {ns}/{ref.get('name')}")
                v = data[ref["key"]]
                env[e["name"]] = base64.b64decode(v).decode(errors="replace") if is_secret else v
            elif vf.get("resourceFieldRef"):
                rf = vf["resourceFieldRef"]
                res = rf.get("resource", "")
                kind, _, rname = res.partition(".")
                val = ((c.spec.get("resources") or {}).get(kind) or {}).get(rname)
                env[e["name"]] = str(int(-(-parse_quantity(val) // parse_quantity(rf.get("divisor", "1"))))) if val else "0"
        env[MARK_INSTANCE] = self.instance
        env[MARK_POD] = pod["metadata"]["uid"]
        return env

    def _prepare_volumes(self, run: PodRun, pod: dict) -> dict:
        base = self.pods_dir / run.uid / "volumes"
        base.mkdir(parents=True, exist_ok=True)
        out = {}
        ns = pod["metadata"]["namespace"]
        for v in pod["spec"].get("volumes") or []:
            d = base / v["name"]
            if v.get("hostPath"):
                p = v["hostPath"]["path"]
                t = v["hostPath"].get("type", "")
                if not os.path.exists(p):
                    if t == "DirectoryOrCreate":
                        os.makedirs(p, exist_ok=True)
                        self.created_host_paths.append(p)
                    elif t:
                        raise _MountError(f'MountVolume.SetUp failed for volume "{v["name"]}" : hostPath type check failed: {p} is not a directory')
                out[v["name"]] = p
                continue
            shared = self.shared_volume_dir(ns, v)
            if shared is not None:  # nfs / a claim: one directory for every pod, kept after them
                shared.mkdir(parents=True, exist_ok=True)
                out[v["name"]] = str(shared)
                continue
            if d.exists():
                out[v["name"]] = str(d)
                continue
            d.mkdir()
            src = v.get("configMap") or v.get("secret")
            if src is not None:
                is_secret = "secret" in v
                name = src.get("secretName") if is_secret else src.get("name")
                obj = self.store.get(SECRETS if is_secret else CONFIGMAPS, ns, name)
                if obj is None:
                    d.rmdir()
                    if src.get("optional"):
                        d.mkdir()
                        out[v["name"]] = str(d)
                        continue
                    raise _MountError(f'MountVolume.SetUp failed for volume "{v["name"]}" : '
                                      f'{"secret" if is_secret else "configmap"} "{name}" not found')
                files: dict[str, bytes] = {}
                if is_secret:
                    for k, val in (obj.get("data") or {}).items():
                        files[k] = base64.b64decode(val)
                else:
                    for k, val in (obj.get("data") or {}).items():
                        files[k] = val.encode()
                    for k, val in (obj.get("binaryData") or {}).items():
                        files[k] = base64.b64decode(val)
                mode = src.get("defaultMode", 0o644)
                items = src.get("items")
                if items:
                    sel = []
                    for it in items:
                        if it["key"] not in files:
                            if src.get("optional"):
                                continue
                            shutil.rmtree(d)
                            raise _MountError(f'MountVolume.SetUp failed for volume "{v["name"]}" : configmap references non-existent config key: {it["key"]}')
                        sel.append((it.get("path") or it["key"], files[it["key"]], it.get("mode", mode)))
                else:
                    sel = [(k, b, mode) for k, b in files.items()]
                for path, data, m in sel:
                    fp = d / path
                    fp.parent.mkdir(parents=True, exist_ok=True)
                    fp.write_bytes(data)
                    os.chmod(fp, m)
            if "emptyDir" in v:
                os.chmod(d, 0o777)        # as the kubelet makes emptyDir volumes
            _set_volume_ownership(d, (pod["spec"].get("securityContext") or {}).get("fsGroup"),
                                  read_only="secret" in v or "configMap" in v)
            out[v["name"]] = str(d)       # emptyDir, ...: a pod-local dir
        return out

    async def _pull_images(self, run: PodRun) -> bool:
        """Images with a pull time (policy `pullSeconds`) take it on their first pull on a node, the
        containers waiting in ContainerCreating meanwhile, with the kubelet's `Pulling` and `Pulled`
        events; pods on the same node wait for one pull (serializeImagePulls). False: pod gone."""
        for img in dict.fromkeys(c.spec.get("image") for c in run.inits + run.containers):
            seconds = self.store.policy.pull_seconds.get(img or "")
            if not seconds:
                continue
            key = (run.node, img)
            pulling = self.pulls.get(key)
            if pulling is None:
                pod = self._pod(run)
                if pod is None:
                    return False
                self.store.record_event(pod, "Pulling", f'Pulling image "{img}"', "Normal", "kubelet")
                pulling = self.pulls[key] = asyncio.ensure_future(asyncio.sleep(seconds))
                await asyncio.shield(pulling)
                pod = self._pod(run)
                if pod is None:
                    return False
                self.store.record_event(pod, "Pulled", f'Successfully pulled image "{img}" in {seconds:g}s '
                                        f'({seconds:g}s including waiting). Image size: 0 bytes.', "Normal", "kubelet")
            else:
                await asyncio.shield(pulling)
                pod = self._pod(run)
                if pod is None:
                    return False
                self.store.record_event(pod, "Pulled", f'Container image "{img}" already present on machine',
                                        "Normal", "kubelet")
        return True

    def shared_volume_dir(self, ns: str, volume: dict) -> Path | None:
        """The host directory standing for an NFS export (<state>/nfs/<server>/<path>) or a claim
        (<state>/pvc/<namespace>/<claim>): shared by every pod that mounts it and kept after they
        are gone, as the storage is; None for pod-local volumes."""
        if isinstance(volume.get("nfs"), dict):
            nfs = volume["nfs"]
            path = Path(str(nfs.get("path") or "/").lstrip("/"))
            if ".." in path.parts:
                raise _MountError(f'MountVolume.SetUp failed for volume "{volume["name"]}" : mount.nfs: access denied')
            return self.state / "nfs" / str(nfs.get("server")) / path
        if isinstance(volume.get("persistentVolumeClaim"), dict):
            return self.state / "pvc" / ns / str(volume["persistentVolumeClaim"].get("claimName"))
        return None

    # ------------------------------------------------------------ logs
    def read_log(self, pod: dict, container: str | None, previous: bool = False) -> str:
        run = self.runs.get(pod["metadata"]["uid"])
        names = [c["name"] for c in pod["spec"]["containers"]]
        if container is None:
            if len(names) > 1:
                raise bad_request(f"a container name must be specified for pod {pod['metadata']['name']}, "
                                  f"choose one of: [{' '.join(names)}]")
            container = names[0]
        allc = names + [c["name"] for c in pod["spec"].get("initContainers") or []]
        if container not in allc:
            raise bad_request(f"container {container} is not valid for pod {pod['metadata']['name']}")
        c = None
        if run:
            c = next((x for x in run.inits + run.containers if x.name == container), None)
        if c is None or c.log_path is None:
            reason = "ContainerCreating"
            if c is not None and "waiting" in c.state:
                reason = c.state["waiting"].get("reason", reason)
            raise bad_request(f'container "{container}" in pod "{pod["metadata"]["name"]}" is waiting to start: {reason}')
        path = c.log_path
        if previous:
            idx = c.restart_count - (0 if "waiting" in c.state else 1)
            if c.restart_count == 0 or idx < 0:
                raise bad_request(f'previous terminated container "{container}" in pod "{pod["metadata"]["name"]}" not found')
            path = path.with_name(f"{idx}.log") if "waiting" not in c.state else path
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""

    def container_running(self, pod: dict, container: str | None) -> bool:
        run = self.runs.get(pod["metadata"]["uid"])
        if not run:
            return False
        for c in run.inits + run.containers:
            if container in (None, c.name) and "running" in c.state:
                return True
        return False

    # ------------------------------------------------------------ kill paths
    def _kill_run(self, run: PodRun, sig: int) -> None:
        for c in run.inits + run.containers:
            if c.proc is not None and c.proc.returncode is None:
                try:
                    os.killpg(c.proc.pid, sig)
                except OSError:
                    pass
        if sig == signal.SIGKILL:
            _kill_pids(marked_pids(MARK_POD, run.uid), signal.SIGKILL)

    def _on_delete(self, pod: dict, grace: float) -> None:
        run = self.runs.get(pod["metadata"]["uid"])
        if run is None:
            self.store.pods_stopped.add(pod["metadata"]["uid"])
            return
        if run.terminating and getattr(run, "kill_task", None) and grace > 0:
            run.kill_task.cancel()
        run.terminating = True
        run.kill_task = asyncio.ensure_future(self._terminate(run, grace))

    async def _terminate(self, run: PodRun, grace: float) -> None:
        pod = self._pod(run)
        if pod is not None:
            for c in run.containers:
                if "running" in c.state:
                    self.store.record_event(pod, "Killing", f"Stopping container {c.name}", "Normal", "kubelet")
        self._kill_run(run, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if all(c.proc is None or c.proc.returncode is not None for c in run.inits + run.containers):
                break
            await asyncio.sleep(0.05)
        self._kill_run(run, signal.SIGKILL)
        for c in run.inits + run.containers:
            if c.proc is not None and c.proc.returncode is None:
                try:
                    await asyncio.wait_for(c.proc.wait(), 2)
                except asyncio.TimeoutError:
                    pass
        if run.task and not run.task.done():
            run.task.cancel()
        await asyncio.sleep(0)
        if self._pod(run) is not None:
            self._publish(run, "Failed" if any("terminated" in c.state and c.state["terminated"]["exitCode"]
                                                for c in run.containers) or not run.done else None)
        run.done = True
        self.runs.pop(run.uid, None)
        if self.net is not None:  # the sandbox goes with the pod: its namespace, veth and IP
            await self.net.remove_pod(run.uid)
        self.store.pod_stopped(run.ns, run.name, run.uid)
        shutil.rmtree(self.pods_dir / run.uid / "volumes", ignore_errors=True)
        shutil.rmtree(self.tmp_root / run.uid, ignore_errors=True)  # each container's /tmp goes with it
        self.wake.set()

    def oom_kill(self, pod: dict, container: str | None = None) -> None:
        run = self.runs.get(pod["metadata"]["uid"])
        if run is None:
            raise bad_request(f'pod "{pod["metadata"]["name"]}" is not running')
        for c in run.inits + run.containers:
            if container in (None, c.name) and c.proc is not None and c.proc.returncode is None:
                c.oom = True
                try:
                    os.killpg(c.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                if container is None:
                    break

    def evict(self, pod: dict, message: str | None = None) -> None:
        run = self.runs.get(pod["metadata"]["uid"])
        if run is None:
            raise bad_request(f'pod "{pod["metadata"]["name"]}" is not running')
        c0 = run.containers[0].name
        message = message or (f"The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
                              f"Container {c0} was using 1048576Ki, request is 0, has larger consumption of memory. ")
        run.evicted = message
        run.terminating = True
        if run.task:
            run.task.cancel()
        asyncio.ensure_future(self._evict(run, message))

    async def _evict(self, run: PodRun, message: str) -> None:
        pod = self._pod(run)
        if pod is None:
            return
        self.store.record_event(pod, "Evicted", message, "Warning", "kubelet")
        self._kill_run(run, signal.SIGTERM)
        await asyncio.sleep(0.2)
        self._kill_run(run, signal.SIGKILL)
        for c in run.inits + run.containers:
            if c.proc is not None:
                try:
                    await asyncio.wait_for(c.proc.wait(), 2)
                except asyncio.TimeoutError:
                    pass
                if "terminated" not in c.state:
                    rc = c.proc.returncode if c.proc.returncode is not None else -9
                    c.state = {"terminated": {"exitCode": rc if rc >= 0 else 128 - rc, "reason": "Error",
                                              "startedAt": c.state.get("running", {}).get("startedAt", now_rfc3339()),
                                              "finishedAt": now_rfc3339()}}
            c.ready = False
        cur = self._pod(run)
        if cur is not None:
            st = cur["status"]
            st.setdefault("conditions", []).append({"type": "DisruptionTarget", "status": "True",
                                                     "reason": "TerminationByKubelet", "message": message,
                                                     "lastProbeTime": None, "lastTransitionTime": now_rfc3339()})
            self.store.update_status(PODS, run.ns, run.name, st)
        self._publish(run, "Failed", "Evicted", message)
        run.done = True
        self.wake.set()

    def netns_of(self, uid: str) -> str | None:
        """The pod's network namespace (None: the host network)."""
        return self.net.netns_path(uid) if self.net is not None else None

    def pod_processes(self, pod: dict) -> list[int]:
        return sorted(marked_pids(MARK_POD, pod["metadata"]["uid"]))

    async def shutdown(self) -> None:
        for run in list(self.runs.values()):
            if run.task:
                run.task.cancel()
            self._kill_run(run, signal.SIGKILL)
        _kill_pids(marked_pids(MARK_INSTANCE, self.instance), signal.SIGKILL)
        for run in list(self.runs.values()):
            for c in run.inits + run.containers:
                if c.proc is not None and c.proc.returncode is None:
                    try:
                        await asyncio.wait_for(c.proc.wait(), 2)
                    except asyncio.TimeoutError:
                        pass
        for _ in range(20):
            left = marked_pids(MARK_INSTANCE, self.instance)
            if not left:
                break
            _kill_pids(left, signal.SIGKILL)
            await asyncio.sleep(0.05)
        for p in reversed(self.created_host_paths):
            shutil.rmtree(p, ignore_errors=True)
        shutil.rmtree(self.tmp_root, ignore_errors=True)


def _is_barrier(image: str | None) -> bool:
    try:
        from . import barrier
    except ImportError:
        return False
    return barrier.is_barrier_image(image)


def _process_user(pod: dict, container: dict) -> dict:
    """uid, gid and supplementary groups of a container's process from the securityContexts
    (container over pod), as runc gets them: an image user is root here (images are PATH
    prefixes with no /etc/passwd of their own), so runAsUser without runAsGroup runs with gid 0;
    fsGroup and supplementalGroups are added to the groups of every container."""
    psc, csc = pod["spec"].get("securityContext") or {}, container.get("securityContext") or {}
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    gid = csc.get("runAsGroup", psc.get("runAsGroup"))
    if csc.get("runAsNonRoot", psc.get("runAsNonRoot")) and not uid:
        if uid is None:
            raise _ConfigError("container has runAsNonRoot and image will run as root "
                               f"(pod: \"{pod['metadata']['name']}_{pod['metadata']['namespace']}({pod['metadata']['uid']})\", "
                               f"container: {container['name']})")
        raise _ConfigError("container's runAsUser breaks non-root policy "
                           f"(pod: \"{pod['metadata']['name']}_{pod['metadata']['namespace']}({pod['metadata']['uid']})\", "
                           f"container: {container['name']})")
    groups = [int(g) for g in psc.get("supplementalGroups") or []]
    if psc.get("fsGroup") is not None:
        groups.append(int(psc["fsGroup"]))
    return {"uid": None if uid is None else int(uid), "gid": None if gid is None and uid is None else int(gid or 0),
            "groups": groups}


def _set_volume_ownership(root: Path, fs_group: int | None, read_only: bool) -> None:
    """The kubelet's SetVolumeOwnership: with fsGroup, a volume's files belong to that group and
    gain group read (secret, configMap: 0440 mask) or read-write (others: 0660 mask); its
    directories gain setgid and group access."""
    if fs_group is None:
        return
    mask = 0o440 if read_only else 0o660
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chown(dirpath, -1, int(fs_group))
        os.chmod(dirpath, os.stat(dirpath).st_mode & 0o7777 | 0o2000 | mask | 0o110)
        for f in filenames:
            fp = os.path.join(dirpath, f)
            os.chown(fp, -1, int(fs_group), follow_symlinks=False)
            os.chmod(fp, os.stat(fp).st_mode & 0o7777 | mask)


class _MountError(Exception):
    pass


class _ConfigError(Exception):
    pass


def run_cid(pod: dict, c: Container) -> str:
    return f"{pod['metadata']['uid'][:8]}-{c.name}-{c.restart_count}"


def _docker_ref(img: str) -> str:
    name = img or ""
    if "/" not in name.split(":")[0] or "." not in name.split("/")[0]:
        name = "docker.io/" + (name if "/" in name else "library/" + name)
    if ":" not in name.rsplit("/", 1)[-1] and "@" not in name:
        name += ":latest"
    return name


def _field(pod: dict, path: str, ip: str | None = None) -> str:
    import re
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (pod["metadata"].get(m.group(1)) or {}).get(m.group(2), "")
    return {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
            "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": pod["spec"].get("nodeName", ""),
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
            "status.podIP": ip or "127.0.0.1", "status.podIPs": ip or "127.0.0.1", "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1"}.get(path, "")


def _expand(s: str, env: dict) -> str:
    """$(VAR) expansion as the kubelet does for command/args/env; $$ escapes."""
    import re
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), s)


def _log_tail(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    lines = data.splitlines(keepends=True)[-80:]
    out = b"".join(lines)
    if len(out) > 2048:
        out = out[-2048:]
    return out.decode(errors="replace")


def _tolerates(pod: dict, taint: dict) -> bool:
    """Whether one of the pod's tolerations matches the taint (key, operator Equal/Exists, effect)."""
    for tol in pod["spec"].get("tolerations") or []:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator", "Equal") == "Exists":
            if not tol.get("key") or tol["key"] == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False
