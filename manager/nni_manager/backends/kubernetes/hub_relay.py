"""The hub relay's life in the cluster (tunnel.py builds its objects and carries the streams):
its program ConfigMap, Pod and Service made before the hub starts (found again after a
restart), the pod re-created when it ended or was evicted, and all three deleted at stop.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nni_manager.backends import agent_deps
from nni_manager.backends.kubernetes import deps, tunnel
from nni_manager.backends.kubernetes.client import KubeError, api_error

log = logging.getLogger(__name__)


class HubRelay:
    """One experiment's relay. `build()` gives its (ConfigMap, Pod, Service) as tunnel.relay_objects
    makes them; `owned(obj)` names the experiment's owner in `obj` (owner.py), so the garbage
    collector takes the relay after a crash."""

    def __init__(self, core: Any, namespace: str, experiment_id: str,
                 build: Callable[[], list[dict[str, Any]]],
                 owned: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> None:
        self.core, self.namespace, self.experiment_id = core, namespace, experiment_id
        self.build, self.owned = build, owned

    async def ensure(self) -> str:
        """Create (or find again, after a restart) the relay's ConfigMap, Pod and Service; the
        Service's cluster IP."""
        core, ns = self.core, self.namespace
        _, pod, service = [await self.owned(o) for o in self.build()]
        name = pod["metadata"]["name"]
        await self.ensure_pod(pod)
        try:
            created = await core.create_namespaced_service(ns, service, field_validation="Strict")
        except Exception as e:
            if getattr(e, "status", None) != 409:
                raise api_error(e, f"creating the hub relay's Service {name}") from None
            created = await core.read_namespaced_service(name, ns)
        cluster_ip = created.spec.cluster_ip
        if not cluster_ip or cluster_ip == "None":
            raise KubeError(f"the hub relay's Service {name} got no cluster IP; delete it and start again")
        return cluster_ip

    async def ensure_program(self) -> None:
        """The relay program's ConfigMap, before every relay pod: immutable and named for its content,
        one already there is kept only when it holds the program (one someone planted or made again
        under the name is replaced; the pod checks the program's sha256 besides)."""
        config_map = await self.owned(self.build()[0])  # the GC takes it after a crash
        name = config_map["metadata"]["name"]
        try:
            await deps.ensure_config_map(self.core, self.namespace, name, config_map)
        except agent_deps.DependencyError as e:
            raise KubeError(str(e)) from None
        except Exception as e:
            raise api_error(e, f"creating the hub relay's ConfigMap {name}") from None

    async def ensure_pod(self, pod: dict[str, Any] | None = None) -> None:
        """The relay pod, re-created when it ended or is being deleted (an eviction, a node drain)."""
        core, ns = self.core, self.namespace
        pod = pod or await self.owned(self.build()[1])
        name = pod["metadata"]["name"]
        try:
            existing = await core.read_namespaced_pod(name, ns)
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise api_error(e, f"reading the hub relay pod {name}") from None
            existing = None
        if existing is not None and existing.status.phase in ("Failed", "Succeeded") or (
                existing is not None and existing.metadata.deletion_timestamp):
            log.warning("hub relay pod %s is %s: re-creating it", name, existing.status.phase)
            try:
                await core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            except Exception:
                pass
            for _ in range(100):
                try:
                    await core.read_namespaced_pod(name, ns)
                except Exception:
                    break
                await asyncio.sleep(0.1)
            existing = None
        if existing is None:
            await self.ensure_program()
            try:
                await core.create_namespaced_pod(ns, pod, field_validation="Strict")
            except Exception as e:
                if getattr(e, "status", None) == 403 and tunnel.SCC_REFUSAL in str(getattr(e, "body", "")):
                    # OpenShift: the namespace's UID range, not ours; its SCC picks the relay's user
                    log.info("the hub relay pod %s runs as a UID of the namespace's range (OpenShift SCC)", name)
                    try:
                        await core.create_namespaced_pod(ns, tunnel.without_fixed_user(pod), field_validation="Strict")
                        return
                    except Exception as again:
                        e = again
                if getattr(e, "status", None) != 409:
                    raise api_error(e, f"creating the hub relay pod {name}") from None

    async def delete(self) -> None:
        """The Service, the Pod and the ConfigMap (each logged when the cluster refuses)."""
        core, ns = self.core, self.namespace
        name = tunnel.relay_name(self.experiment_id)
        # the answers (the object or a Status, by server version) are not needed: not parsed
        for what, call, called in (("Service", core.delete_namespaced_service_without_preload_content, name),
                                   ("Pod", core.delete_namespaced_pod_without_preload_content, name),
                                   ("ConfigMap", core.delete_namespaced_config_map_without_preload_content,
                                    tunnel.program_config_map_name(self.experiment_id))):
            try:
                response = await call(called, ns)
                if response.status >= 400 and response.status != 404:
                    log.error("deleting the hub relay's %s %s: %s %s", what, name, response.status,
                              (await response.read())[:300].decode(errors="replace"))
            except Exception as e:
                if getattr(e, "status", None) != 404:
                    log.error("deleting the hub relay's %s %s: %s", what, name, api_error(e, "deleting"))
