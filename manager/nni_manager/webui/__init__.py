"""NNI's REST API and WebUI served from our manager (see docs/ARCHITECTURE.md, "WebUI").

`server.WebServer` binds the port and serves `api.routes()`; `model` keeps what the WebUI
polls (in memory or one indexed query away); `views` turns our records into NNI's payloads;
`static` finds the WebUI in the user's installed `nni` package; `manifest` keeps
`~/nni-experiments/.experiment` current for `nnictl` and `Experiment.connect()`; `access`
decides who may call (Host, the caller's user via `peers`, the token) and `limits` bounds writes.
"""
from __future__ import annotations

from nni_manager.webui.server import DEFAULT_PORT, WebServer

__all__ = ["DEFAULT_PORT", "WebServer"]
