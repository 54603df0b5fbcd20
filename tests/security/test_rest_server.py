"""The REST API / WebUI server's trust boundary (issue 20): other local users, foreign Host
headers (DNS rebinding), cross-site writes, the token of a non-loopback bind, write limits.

Real parts: a real served WebServer (aiohttp) over 127.0.0.1, real HTTP clients, and a real
second local user (created with useradd, its client run with setpriv) for the same-user check.
"""
from __future__ import annotations

import http.client
import importlib.util
import io
import json
import logging
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.security.rest_server import stored  # noqa: F401  (the fixture)
from tests.support.webui.fixtures import ServerThread as Served  # a stored experiment's server, own loop thread
from tests.support.webui.fixtures import home  # noqa: F401  (home: the fixture)

API = "/api/v1/nni"

# The other user's client: requests as JSON on stdin (a token never goes into argv).
_CLIENT = r"""
import http.client, json, sys
out = []
for r in json.load(sys.stdin):
    conn = http.client.HTTPConnection("127.0.0.1", r["port"], timeout=30)
    conn.request(r["method"], r["path"], body=r.get("body"), headers=r.get("headers") or {})
    resp = conn.getresponse()
    out.append({"status": resp.status, "body": resp.read().decode("utf-8", "replace"),
                "headers": {k.lower(): v for k, v in resp.getheaders()}})
    conn.close()
json.dump(out, sys.stdout)
"""


# ---------------------------------------------------------------------------- helpers
def request(port: int, method: str, path: str, *, headers: dict[str, str] | None = None,
            body: Any = None) -> tuple[int, dict[str, str], str]:
    """One request from this process (root: the server's own user)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = None if body is None else json.dumps(body)
    hdrs = dict(headers or {})
    if data is not None:
        hdrs.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=data, headers=hdrs)
    resp = conn.getresponse()
    out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode("utf-8", "replace")
    conn.close()
    return out


class OtherUser:
    """A real second local user; `requests()` runs an HTTP client as that user."""

    def __init__(self, name: str) -> None:
        self.name = name
        entry = pwd.getpwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid

    def requests(self, port: int, *reqs: dict[str, Any]) -> list[dict[str, Any]]:
        body = json.dumps([{"port": port, **r} for r in reqs])
        done = subprocess.run(["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                               "/usr/bin/python3", "-c", _CLIENT], input=body, capture_output=True, text=True,
                              cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


def _users_tool(*argv: str) -> subprocess.CompletedProcess[str]:
    """useradd / userdel, retried while another test holds /etc/passwd's lock."""
    for _ in range(50):
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
        if done.returncode != 10 and "lock" not in done.stderr:  # 10: cannot lock the password file
            return done
        time.sleep(0.2)
    return done


@pytest.fixture(scope="module")
def other_user() -> Iterator[OtherUser]:
    if os.geteuid() != 0:
        pytest.skip("a second local user can be created only as root")
    if not (shutil.which("useradd") and shutil.which("userdel") and shutil.which("setpriv")
            and os.path.exists("/usr/bin/python3")):
        pytest.skip("useradd, userdel, setpriv and /usr/bin/python3 are needed for a second local user")
    name = f"nnisec{os.getpid() % 10_000_000}"
    made = _users_tool("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name)
    assert made.returncode == 0, made.stderr
    try:
        yield OtherUser(name)
    finally:
        _users_tool("userdel", name)


# ---------------------------------------------------------------------------- other users
def test_another_local_user_is_refused_and_the_owner_served(stored: Path, other_user: OtherUser) -> None:
    with Served(stored, register=False) as srv:
        got = other_user.requests(srv.port, {"method": "GET", "path": API + "/experiment"},
                                  {"method": "DELETE", "path": API + "/experiment"},
                                  {"method": "GET", "path": "/"})
        assert [r["status"] for r in got] == [403, 403, 403], got
        error = json.loads(got[0]["body"])["error"]
        assert f"uid {other_user.uid}" in error and f"uid {os.geteuid()}" in error and "owner" in error
        assert not srv.stopped.is_set()  # the other user's DELETE /experiment was not obeyed

        status, _, body = request(srv.port, "GET", API + "/experiment")  # the owner, as nnictl is
        assert status == 200 and json.loads(body)["id"] == "synth001"
        status, _, _ = request(srv.port, "DELETE", API + "/experiment")
        assert status == 200 and srv.stopped.wait(10)


def test_running_experiment_refuses_other_users_and_bounds_writes(tmp_path: Path, home: Path,  # noqa: F811 (fixture)
                                                                  other_user: OtherUser) -> None:
    if importlib.util.find_spec("nni") is None:  # found, not imported: importing it here costs seconds
        pytest.skip("RunningExperiment's GridSearch runs in NNI's dispatcher here: pip install nni==3.0")
    from tests.support.webui.experiments import RunningExperiment

    exp = RunningExperiment(tmp_path, home, "sleepy.py", trialConcurrency=1, maxTrialNumber=3)
    try:
        jobs = exp.wait_trials(lambda js: [j["status"] for j in js] == ["RUNNING"])
        trial = jobs[0]["trialJobId"]
        profile = json.loads(request(exp.port, "GET", API + "/experiment")[2])
        raise_concurrency = json.dumps({**profile, "params": {**profile["params"], "trialConcurrency": 100_000}})
        got = other_user.requests(
            exp.port,
            {"method": "PUT", "path": API + "/experiment?update_type=TRIAL_CONCURRENCY", "body": raise_concurrency,
             "headers": {"Content-Type": "application/json"}},
            {"method": "DELETE", "path": f"{API}/trial-jobs/{trial}"},
            {"method": "DELETE", "path": API + "/experiment"})
        assert [r["status"] for r in got] == [403, 403, 403], got
        jobs = json.loads(request(exp.port, "GET", API + "/trial-jobs")[2])
        assert [j["status"] for j in jobs] == ["RUNNING"] and exp.proc.poll() is None

        # the owner's writes are bounded: 400 naming the field and the limit, nothing changed
        status, _, body = request(exp.port, "PUT", API + "/experiment?update_type=TRIAL_CONCURRENCY",
                                  body={**profile, "params": {**profile["params"], "trialConcurrency": 100_000}})
        assert status == 400, body
        assert "trialConcurrency" in json.loads(body)["error"] and "10000" in json.loads(body)["error"]
        status, _, body = request(exp.port, "PUT", API + "/experiment?update_type=MAX_TRIAL_NUM",
                                  body={**profile, "params": {**profile["params"], "maxTrialNumber": 10**9}})
        assert status == 400 and "maxTrialNumber" in body and "1000000" in body, body
        status, _, body = request(exp.port, "PUT", API + "/experiment?update_type=MAX_EXEC_DURATION",
                                  body={**profile, "params": {**profile["params"], "maxExperimentDuration": "9999d"}})
        assert status == 400 and "maxExperimentDuration" in body and "31622400" in body, body
        params = json.loads(request(exp.port, "GET", API + "/experiment")[2])["params"]
        assert (params["trialConcurrency"], params["maxTrialNumber"]) == (1, 3)
        status, _, body = request(exp.port, "PUT", API + "/experiment?update_type=TRIAL_CONCURRENCY",
                                  body={**profile, "params": {**profile["params"], "trialConcurrency": 2}})
        assert status == 200, body  # within the limit: obeyed
        assert json.loads(request(exp.port, "GET", API + "/experiment")[2])["params"]["trialConcurrency"] == 2
    finally:
        exp.close()


# ---------------------------------------------------------------------------- Host and Origin
def test_foreign_host_and_cross_site_writes_are_refused(stored: Path) -> None:
    with Served(stored, register=False) as srv:
        status, _, body = request(srv.port, "GET", API + "/experiment",
                                  headers={"Host": f"rebound.attacker.example:{srv.port}"})
        assert status == 403 and "DNS rebinding" in json.loads(body)["error"], body
        status, _, _ = request(srv.port, "DELETE", API + "/experiment", headers={"Host": "rebound.attacker.example"})
        assert status == 403 and not srv.stopped.is_set()
        for host in (f"localhost:{srv.port}", f"127.0.0.1:{srv.port}", f"[::1]:{srv.port}", "LOCALHOST"):
            status, _, body = request(srv.port, "GET", API + "/experiment", headers={"Host": host})
            assert status == 200, (host, body)

        status, _, body = request(srv.port, "DELETE", API + "/experiment",
                                  headers={"Origin": "http://attacker.example"})
        assert status == 403 and "another site" in body and not srv.stopped.is_set()
        origin = f"http://127.0.0.1:{srv.port}"  # the WebUI's own page
        status, _, _ = request(srv.port, "DELETE", API + "/experiment", headers={"Origin": origin})
        assert status == 200 and srv.stopped.wait(10)


# ---------------------------------------------------------------------------- the token
def test_token_is_required_unless_bound_to_loopback() -> None:
    from nni_manager.webui.access import token_required

    for bind in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert not token_required(bind), bind
    for bind in ("0.0.0.0", "::", "10.1.2.3", "fd00::1", "gpu-box-1.example"):  # not dialed: only judged
        assert token_required(bind), bind


def test_token_url_cookie_and_header_and_never_logged(stored: Path, home: Path, other_user: OtherUser,  # noqa: F811
                                                      caplog: pytest.LogCaptureFixture) -> None:
    from nni_manager.webui.runner import _announce

    caplog.set_level(logging.DEBUG)
    with Served(stored, require_token=True, register=True) as srv:
        token = srv.server.access.token
        assert token and len(token) >= 40
        assert token not in srv.server.url and srv.server.login_url == f"{srv.server.url}?token={token}"
        printed = io.StringIO()
        _announce(srv.server, printed)
        assert printed.getvalue().startswith(f"WebUI: {srv.server.login_url}")

        cookie_name = f"nni-manager-token-{srv.port}"
        got = other_user.requests(
            srv.port,
            {"method": "GET", "path": API + "/experiment"},                                        # no token
            {"method": "GET", "path": API + "/experiment", "headers": {"Authorization": "token wrong-token"}},
            {"method": "GET", "path": API + f"/experiment?token={token}"},                         # once in the URL
            {"method": "GET", "path": API + "/experiment", "headers": {"Cookie": f"{cookie_name}={token}"}},
            {"method": "GET", "path": API + "/experiment", "headers": {"Authorization": f"token {token}"}},
            {"method": "GET", "path": f"/?token={token}&x=1"},                                    # the browser's first visit
        )
        assert [r["status"] for r in got] == [403, 403, 200, 200, 200, 302], got
        assert "token" in json.loads(got[0]["body"])["error"]
        assert all(token not in r["body"] and "wrong-token" not in r["body"] for r in got)
        cookie = got[2]["headers"]["set-cookie"]
        assert cookie.startswith(f"{cookie_name}={token};") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
        assert got[5]["headers"]["location"] == "/?x=1" and got[5]["headers"]["set-cookie"].startswith(cookie_name)

        status, _, _ = request(srv.port, "GET", API + "/experiment")  # the owner's nnictl needs no token
        assert status == 200
        manifest = (home / "nni-experiments" / ".experiment").read_text()
        assert str(srv.port) in manifest and token not in manifest
    assert caplog.records and token not in caplog.text  # refusals were logged, never the token
