"""The backend context a Kubernetes backend reports to (`agent_status`, `agent_failed`), recorded:
for tests that drive the pod tracker or a backend's job hooks without a manager."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Ctx:
    status: dict[str, str] = field(default_factory=dict)
    failed: list[tuple[str, str, bool]] = field(default_factory=list)

    def agent_status(self, agent_id: str, message: str) -> None:
        self.status[agent_id] = message

    def agent_failed(self, agent_id: str, reason: str, *, failed: bool = False) -> None:
        self.failed.append((agent_id, reason, failed))
