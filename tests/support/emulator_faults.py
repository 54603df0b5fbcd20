"""Injected faults and the request log, shared by the DLTS, AML and DLC emulators (their `/_emulator`
controls: tests/support/emulator_serving.py `common_control`).

A fault answers the next `count` matching requests with `status` (each emulator renders the
body as its real server would), optionally after hanging `hang` seconds, and with a
`Retry-After` header when `retry_after` is set. The log keeps method, path, query keys and
status of every API request; secret query values are never kept.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

SECRET_QUERY_KEYS = {"password", "token"}


@dataclass
class Fault:
    status: int | None = 503          # None: only hang, then serve the request normally
    count: int = 1
    method: str | None = None         # None: any method
    path: str | None = None           # regular expression searched in the path; None: any
    retry_after: int | None = None
    hang: float = 0.0
    message: str | None = None
    lose_answer: bool = False         # serve the request, then drop the connection before the answer (AML)

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method.upper() == method) and (
            self.path is None or re.search(self.path, path) is not None)


@dataclass
class Faults:
    pending: list[Fault] = field(default_factory=list)

    def add(self, spec: dict) -> Fault:
        known = set(Fault.__dataclass_fields__)
        unknown = set(spec) - known
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        f = Fault(**spec)
        if f.count < 1:
            raise ValueError("count must be >= 1")
        self.pending.append(f)
        return f

    def take(self, method: str, path: str) -> Fault | None:
        for f in self.pending:
            if f.matches(method, path):
                f.count -= 1
                if f.count <= 0:
                    self.pending.remove(f)
                return f
        return None

    def clear(self) -> None:
        self.pending.clear()


@dataclass
class RequestLog:
    entries: list[dict] = field(default_factory=list)

    def add(self, method: str, path: str, query: dict[str, str], status: int, **extra) -> None:
        q = {k: ("***" if k.lower() in SECRET_QUERY_KEYS else v) for k, v in query.items()}
        self.entries.append({"time": time.time(), "method": method, "path": path, "query": q,
                             "status": status, **extra})
