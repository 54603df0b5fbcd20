"""An environment's main object through the API, one way whatever its kind: a Pod (platform
kubernetes) or a custom object (TFJob, PyTorchJob, Framework, AdaptDLJob), always as a dict.
"""
from __future__ import annotations

from typing import Any


class MainObjects:
    """The calls on one kind of main object in one namespace. `custom` is (group, version, plural,
    kind), None for pods."""

    def __init__(self, api: Any, core: Any, custom_api: Any, namespace: str,
                 custom: tuple[str, str, str, str] | None) -> None:
        self.api, self.core, self.custom_api, self.namespace, self.custom = api, core, custom_api, namespace, custom

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self.custom is None:
            pod = await self.core.create_namespaced_pod(self.namespace, obj, field_validation="Strict")
            return dict(self.api.sanitize_for_serialization(pod))
        group, version, plural, _ = self.custom
        return dict(await self.custom_api.create_namespaced_custom_object(group, version, self.namespace, plural, obj,
                                                                          field_validation="Strict"))

    async def get(self, name: str) -> dict[str, Any]:
        """The object (the client's ApiException, status 404, when there is none)."""
        if self.custom is None:
            return dict(self.api.sanitize_for_serialization(await self.core.read_namespaced_pod(name, self.namespace)))
        group, version, plural, _ = self.custom
        return dict(await self.custom_api.get_namespaced_custom_object(group, version, self.namespace, plural, name))

    async def list(self, label_selector: str) -> list[dict[str, Any]]:
        """The objects the selector picks (one list call)."""
        if self.custom is None:
            pods = await self.core.list_namespaced_pod(self.namespace, label_selector=label_selector)
            return [dict(self.api.sanitize_for_serialization(p)) for p in pods.items]
        group, version, plural, _ = self.custom
        listed = await self.custom_api.list_namespaced_custom_object(group, version, self.namespace, plural,
                                                                     label_selector=label_selector)
        return [dict(o) for o in listed.get("items", [])]

    async def delete(self, name: str, **options: Any) -> None:
        if self.custom is None:
            await self.core.delete_namespaced_pod(name, self.namespace, **options)
            return
        group, version, plural, _ = self.custom
        await self.custom_api.delete_namespaced_custom_object(group, version, self.namespace, plural, name, **options)

    async def delete_all(self, label_selector: str) -> None:
        """Every object the selector picks (pods are deleted by the caller in any case)."""
        if self.custom is not None:
            group, version, plural, _ = self.custom
            await self.custom_api.delete_collection_namespaced_custom_object(group, version, self.namespace, plural,
                                                                             label_selector=label_selector)
