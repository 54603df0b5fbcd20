"""NNI's REST API and WebUI served from our manager (see docs/ARCHITECTURE.md, "WebUI").

`server.WebServer` binds the port and serves `api.routes()`; `model` keeps what the WebUI
polls (in memory or one indexed query away); `views` turns our records into NNI's payloads;
`static` finds the WebUI in the user's installed `nni` package; `manifest` keeps
`~/nni-experiments/.experiment` current for `nnictl` and `Experiment.connect()`; `access`
decides who may call (Host, the caller's user via `peers`, the token) and `limits` bounds writes.
"""
from __future__ import annotations

# Here, not in `server`: the CLI's other commands (list, trials, stop) read these and the
# manifest without importing aiohttp (a fifth of a second each time)
DEFAULT_PORT = 8080  # NNI's default
DEFAULT_BIND = "127.0.0.1"
