"""Transient API-server failures on demand, as clients meet them in the field.

- A storm: the next `count` API requests (controls excluded; optionally only those with `method`
  and a path that `path`, a regular expression, is found in) answer `status`: 429 TooManyRequests with `Retry-After` (API Priority and Fairness, the
  max-in-flight filter), or 500 / 503 (an etcd leader change, an apiserver behind a load balancer
  going away), each with the Status body the real server sends.
- A restart: the listener closes and every open connection (watches included) drops; the server
  listens again on the same port after `down` seconds, as a restarted kube-apiserver does.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from aiohttp import web

from .api import ApiError

_MESSAGES = {
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: etcdserver: leader changed"),
    502: ("InternalError", "Internal error occurred: bad gateway"),
    503: ("ServiceUnavailable", "The server is currently unable to handle the request"),
    504: ("Timeout", "Timeout: request did not complete within the allotted timeout"),
}


@dataclass
class Storm:
    status: int
    count: int
    retry_after: int = 1
    path: str = ""
    method: str = ""
    served: int = 0  # how many requests it answered (tests read it back)


class Faults:
    def __init__(self) -> None:
        self.storm: Storm | None = None
        self.answered: dict[int, int] = {}

    def start_storm(self, body: dict) -> None:
        status = int(body.get("status", 429))
        if status not in _MESSAGES:
            raise ApiError(400, "BadRequest", f"storm status must be one of {sorted(_MESSAGES)}")
        self.storm = Storm(status, int(body.get("count", 1)), int(body.get("retryAfter", 1)), body.get("path", ""),
                           str(body.get("method", "")).upper())

    def intercept(self, request: web.Request) -> web.Response | None:
        storm = self.storm
        if storm is None or storm.count <= 0 or (storm.path and not re.search(storm.path, request.path_qs)) or (
                storm.method and storm.method != request.method):
            return None
        storm.count -= 1
        storm.served += 1
        self.answered[storm.status] = self.answered.get(storm.status, 0) + 1
        reason, message = _MESSAGES[storm.status]
        body = ApiError(storm.status, reason, message).status()
        headers = {}
        if storm.status == 429:
            body["details"] = {"retryAfterSeconds": storm.retry_after}
            headers["Retry-After"] = str(storm.retry_after)
        return web.json_response(body, status=storm.status, headers=headers)
