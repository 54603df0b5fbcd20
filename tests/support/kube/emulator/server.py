"""HTTPS front end: the Kubernetes REST API subset the official client uses, plus /emulator/v1 controls."""
from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import datetime as dt
import importlib
import json
import os
import secrets
import signal
import time
from collections import Counter, deque
from pathlib import Path

from aiohttp import web

from tests.support.emulator_serving import announce, hold_port, make_tls, serve, until_stopped

from .api import (NAMESPACES, NODES, PODS, ApiError, Resource, bad_request, not_found)
from .clientcerts import ClientCA
from . import faults, oidc, rbac

from .store import Store, Watcher
from .util import json_merge_patch, json_patch, parse_field_selector, parse_label_selector, strategic_merge_patch

MAX_REQUEST_BODY = 3 * 1024 * 1024  # k8s.io/apiserver DefaultMaxRequestSizeBytes

NOT_FOUND_TEXT = "404 page not found\n"
SERVER_VERSION = {"major": "1", "minor": "33", "gitVersion": "v1.33.0-emulator", "gitCommit": "emulator",
                  "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                  "compiler": "gc", "platform": "linux/amd64"}
VERBS_MAP = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def page_not_found() -> web.Response:
    return web.Response(status=404, text=NOT_FOUND_TEXT, content_type="text/plain")


def status_response(err: ApiError) -> web.Response:
    return web.json_response(err.status(), status=err.code)


def write_kubeconfig(state: Path, port: int, token: str) -> None:
    import yaml
    ca = base64.b64encode((state / "ca.crt").read_bytes()).decode()
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "emulator", "preferences": {},
           "clusters": [{"name": "emulator", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                         "certificate-authority-data": ca}}],
           "users": [{"name": "emulator-user", "user": {"token": token}}],
           "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator-user",
                                                         "namespace": "default"}}]}
    tmp = state / "kubeconfig.tmp"
    tmp.write_text(yaml.safe_dump(cfg))
    os.replace(tmp, state / "kubeconfig")


# ------------------------------------------------------------------ auth
class Auth:
    """TOKEN=user[:rule,...]; rule = verb/resource[.group][@namespace], '*' wildcards; no rules = all;
    `TOKEN=user:rbac`: the user is authorized by the stored RBAC objects (rbac.py). Service-account
    and issued (expiring) tokens come from `tokens`."""

    def __init__(self, specs: list[str]):
        self.tokens: dict[str, rbac.Identity] = {}
        self.extra = rbac.Tokens()
        self.oidc: oidc.Issuer | None = None  # id-tokens of the emulator's OIDC issuer (--oidc-* flags)
        self.client_ca: ClientCA | None = None  # --client-ca-file: client certificates it signed (clientcerts.py)
        for spec in specs:
            tok, _, rest = spec.partition("=")
            user, rules = rest, ""
            head, sep, tail = rest.rpartition(":")
            if sep and ("/" in tail or tail == "rbac"):  # user names may hold ':' (system:serviceaccount:ns:sa)
                user, rules = head, tail
            if rules == "rbac":
                self.tokens[tok] = rbac.Identity(user, None, True, ["system:authenticated"])
                continue
            parsed = None
            if rules:
                parsed = []
                for r in rules.split(","):
                    r, _, ns = r.partition("@")
                    verb, _, resource = r.partition("/")
                    resource, _, group = resource.partition(".")
                    parsed.append((verb, resource, group or ("*" if resource == "*" else ""), ns or "*"))
            self.tokens[tok] = rbac.Identity(user or "admin", parsed)

    def user(self, request: web.Request, store: Store) -> rbac.Identity | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":  # the scheme is case-insensitive (in-cluster clients send "bearer")
            return self.client_ca.identify(request) if self.client_ca is not None else None
        token = token.strip()
        found = self.tokens.get(token) or self.extra.identify(store, token)
        return found or (self.oidc.authenticate(token) if self.oidc is not None else None)


def forbidden(user: str, verb: str, res_plural: str, group: str, ns: str | None, name: str | None) -> ApiError:
    subject = f'{res_plural} "{name}"' if name else res_plural.split("/")[0]
    where = f'in the namespace "{ns}"' if ns else "at the cluster scope"
    msg = (f'{subject} is forbidden: User "{user}" cannot {verb} resource "{res_plural}" in API group '
           f'"{group}" {where}')
    details = {**({"name": name} if name else {}), **({"group": group} if group else {}),
               "kind": res_plural.split("/")[0]}
    return ApiError(403, "Forbidden", msg, details)


def strip_for_list(res: Resource, obj: dict, is_custom: bool) -> dict:
    if not is_custom:
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
    return obj


# ------------------------------------------------------------------ the app
class ApiServer:
    def __init__(self, store: Store, kubelet, auth: Auth):
        self.store, self.kubelet, self.auth = store, kubelet, auth
        self.stopping = asyncio.Event()
        self.faults = faults.Faults()
        self.requests: Counter[tuple[str, str, str]] = Counter()  # (verb, resource, namespace) -> served
        self.restart = None  # set by amain: async (down_seconds) -> None
        self.operators: dict = {}  # name -> (start function, task or None); set by amain
        store.service_account_token = self.auth.extra.service_account_token  # for the kubelet's pods
        self.auth.oidc = self.oidc = oidc.Issuer(lambda: store.api_url)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/oidc/"):  # the identity provider's endpoints, not the API server's
            return await self.oidc.handle(request)
        u = self.auth.user(request, self.store)
        if u is None:
            return status_response(ApiError(401, "Unauthorized", "Unauthorized"))
        try:
            path = request.path.rstrip("/")
            parts = [p for p in path.split("/") if p]
            if parts[:2] == ["emulator", "v1"]:
                if u.rules is not None or u.rbac:
                    raise ApiError(403, "Forbidden", "the emulator's controls need an unrestricted token")
                return await self.control(request, parts[2:])
            stormy = self.faults.intercept(request)
            if stormy is not None:
                return stormy
            if parts == ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]:
                return await self.self_subject_access_review(request, u)
            if path == "/version":
                return web.json_response(SERVER_VERSION)
            if path == "/api":
                return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
            if path == "/apis":
                return web.json_response(self.group_list())
            if path in ("/healthz", "/readyz", "/livez"):
                return web.Response(text="ok")
            return await self.resource_request(request, parts, u)
        except ApiError as e:
            return status_response(e)

    def group_list(self) -> dict:
        groups: dict[str, list[str]] = {}
        for r in self.store.objects:
            if r.group:
                groups.setdefault(r.group, [])
                if r.version not in groups[r.group]:
                    groups[r.group].append(r.version)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
             "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}} for g, vs in groups.items()]}

    def resource_list(self, group: str, version: str) -> dict:
        out = []
        for r in self.store.objects:
            if r.group == group and r.version == version:
                out.append({"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced,
                            "kind": r.kind, "verbs": ["create", "delete", "deletecollection", "get", "list",
                                                      "patch", "update", "watch"]})
                if r == PODS or r in self.store.custom:
                    out.append({"name": r.plural + "/status", "singularName": "", "namespaced": r.namespaced,
                                "kind": r.kind, "verbs": ["get", "patch", "update"]})
                if r == PODS:
                    out.append({"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]})
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}

    async def resource_request(self, request: web.Request, parts: list[str], user) -> web.StreamResponse:
        if not parts or parts[0] not in ("api", "apis"):
            return page_not_found()
        if parts[0] == "api":
            if len(parts) < 2:
                return page_not_found()
            group, version, rest = "", parts[1], parts[2:]
        else:
            if len(parts) < 3:
                return page_not_found()
            group, version, rest = parts[1], parts[2], parts[3:]
        if not self.store.has_group_version(group, version):
            return page_not_found()
        if not rest:
            return web.json_response(self.resource_list(group, version))
        ns = name = sub = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            ns, plural, tail = rest[1], rest[2], rest[3:]
        else:
            plural, tail = rest[0], rest[1:]
        if len(tail) > 2:
            return page_not_found()
        name = tail[0] if tail else None
        sub = tail[1] if len(tail) > 1 else None
        res = self.store.resource_for(group, version, plural)
        if res is None or (ns is not None and not res.namespaced):
            return page_not_found()
        is_custom = res in self.store.custom
        if sub is not None:
            allowed_subs = {"status"} if (is_custom or res in (PODS, NAMESPACES, NODES)) else set()
            if res == PODS:
                allowed_subs |= {"log", "portforward"}
            if sub not in allowed_subs:
                return page_not_found()
        if ns is None and res.namespaced and name is not None:
            return page_not_found()
        q = request.query
        method = request.method
        watch = q.get("watch") in ("true", "1", "True")
        verb = VERBS_MAP.get(method, "")
        if method == "GET" and name is None:
            verb = "watch" if watch else "list"
        if method == "DELETE" and name is None:
            verb = "deletecollection"
        if not verb:
            return web.json_response(ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource").status(), status=405)
        res_name = plural + (f"/{sub}" if sub else "")
        if not rbac.authorize(self.store, user, verb, res_name, group, ns, name):
            raise forbidden(user.user, verb, res_name, group, ns, name)
        self.requests[(verb, res_name, ns or "")] += 1
        if sub == "portforward" and method == "GET" and self.store.policy.websocket_create_check:
            # a WebSocket upgrade is a GET, authorized as `get` above; 1.35's
            # AuthorizePodWebsocketUpgradeCreatePermission adds `create`, as SPDY's POST has
            if not rbac.authorize(self.store, user, "create", res_name, group, ns, name):
                raise forbidden(user.user, "create", res_name, group, ns, name)
        fv = q.get("fieldValidation", "Warn")
        if fv not in ("Strict", "Warn", "Ignore"):
            raise bad_request(f'fieldValidation parameter unsupported: "{fv}"; supported values are Ignore, Warn, Strict')
        if method == "GET":
            if name is not None:
                if sub == "log":
                    return await self.pod_log(request, ns, name)
                if sub == "portforward":
                    from . import portforward
                    return await portforward.serve(request, self.store, self.kubelet.netns_of, ns, name)
                obj = self.store.get(res, ns, name)
                if obj is None:
                    raise not_found(res, name)
                return web.json_response(obj)
            lmatch = parse_label_selector(q.get("labelSelector", ""))
            fmatch = parse_field_selector(q.get("fieldSelector", ""), res.plural, res.kind)
            match = lambda o: lmatch(o["metadata"].get("labels") or {}) and fmatch(o)  # noqa: E731
            if watch:
                return await self.watch(request, res, ns, match)
            items = [strip_for_list(res, o, is_custom) for o in self.store.list(res, ns) if match(o)]
            return web.json_response({"kind": res.list_kind, "apiVersion": res.api_version,
                                      "metadata": {"resourceVersion": str(self.store.rv)}, "items": items})
        if method == "POST":
            if name is not None:
                return web.json_response(ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource").status(), status=405)
            body = await self.json_body(request)
            if isinstance(body, dict):
                md = body.setdefault("metadata", {}) if isinstance(body.get("metadata", {}), dict) else None
                if md is not None and res.namespaced:
                    if md.get("namespace") and md["namespace"] != ns:
                        raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
                    md["namespace"] = ns
            if res in (rbac.ROLES, rbac.ROLEBINDINGS) and isinstance(body, dict):
                refused = rbac.escalation(self.store, user, body, res.kind, ns)
                if refused:
                    bname = (body.get("metadata") or {}).get("name", "")
                    raise ApiError(403, "Forbidden", f'{res.plural}.{res.group} "{bname}" is forbidden: {refused}',
                                   {"name": bname, "group": res.group, "kind": res.plural})
            if q.get("dryRun"):
                obj = copy.deepcopy(body)
                self.store._validate(res, obj, None, fv)
                return self.with_warnings(web.json_response(obj, status=201))
            obj = self.store.create(res, body, field_validation=fv)
            return self.with_warnings(web.json_response(obj, status=201))
        if method == "PUT":
            body = await self.json_body(request)
            if not isinstance(body, dict):
                raise bad_request("the object provided is unrecognized (must be of type object)")
            md = body.setdefault("metadata", {})
            if md.get("name") and md["name"] != name:
                raise bad_request("the name of the object (%s) does not match the name on the URL (%s)" % (md["name"], name))
            md["name"] = name
            if res.namespaced:
                md["namespace"] = ns
            obj = self.store.replace(res, body, subresource=sub or "", field_validation=fv)
            return self.with_warnings(web.json_response(obj))
        if method == "PATCH":
            ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
            body = await self.json_body(request)
            if ctype == "application/json-patch+json":
                fn = lambda o: json_patch(o, body)  # noqa: E731
            elif ctype == "application/merge-patch+json":
                fn = lambda o: json_merge_patch(o, body)  # noqa: E731
            elif ctype == "application/strategic-merge-patch+json":
                if is_custom:
                    return web.json_response(ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml").status(), status=415)
                fn = lambda o: strategic_merge_patch(o, body)  # noqa: E731
            else:
                return web.json_response(ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json").status(), status=415)

            def wrapped(o):
                new = fn(o)
                if not isinstance(new, dict):
                    raise bad_request("the object provided is unrecognized (must be of type object)")
                explicit = isinstance(body, dict) and isinstance(body.get("metadata"), dict) and \
                    body["metadata"].get("resourceVersion")
                if not explicit:
                    new.setdefault("metadata", {}).pop("resourceVersion", None)
                return new
            obj = self.store.patch(res, ns, name, wrapped, subresource=sub or "", field_validation=fv)
            return self.with_warnings(web.json_response(obj))
        if method == "DELETE":
            opts = {}
            raw = await request.read()
            if raw:
                try:
                    opts = json.loads(raw) or {}
                except ValueError:
                    raise bad_request("invalid DeleteOptions body") from None
            grace = q.get("gracePeriodSeconds", opts.get("gracePeriodSeconds"))
            grace = float(grace) if grace is not None else None
            prop = q.get("propagationPolicy", opts.get("propagationPolicy")) or "Background"
            if prop == "Orphan" or q.get("orphanDependents") == "true" or opts.get("orphanDependents"):
                prop = "Orphan"
            if name is not None:
                cur = self.store.get(res, ns, name)
                if cur is None:
                    raise not_found(res, name)
                pre = (opts.get("preconditions") or {})
                if pre.get("uid") and pre["uid"] != cur["metadata"]["uid"]:
                    raise ApiError(409, "Conflict", f'Precondition failed: UID in precondition: {pre["uid"]}, UID in object meta: {cur["metadata"]["uid"]}')
                obj = self.store.delete(res, ns, name, grace, prop)
                still = self.store.get(res, ns, name) is not None
                if res == PODS or is_custom:
                    return web.json_response(obj, status=202 if still else 200)
                return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                          "details": {"name": name, **({"group": group} if group else {}),
                                                      "kind": plural, "uid": cur["metadata"]["uid"]}},
                                         status=202 if still else 200)
            lmatch = parse_label_selector(q.get("labelSelector", ""))
            fmatch = parse_field_selector(q.get("fieldSelector", ""), res.plural, res.kind)
            deleted = []
            for o in self.store.list(res, ns):
                if lmatch(o["metadata"].get("labels") or {}) and fmatch(o):
                    try:
                        deleted.append(strip_for_list(res, self.store.delete(res, o["metadata"].get("namespace"), o["metadata"]["name"], grace, prop), is_custom))
                    except ApiError:
                        pass
            return web.json_response({"kind": res.list_kind, "apiVersion": res.api_version,
                                      "metadata": {"resourceVersion": str(self.store.rv)}, "items": deleted})
        return page_not_found()

    async def self_subject_access_review(self, request: web.Request, user: rbac.Identity) -> web.Response:
        """authorization.k8s.io/v1 SelfSubjectAccessReview: create only (system:basic-user)."""
        if request.method != "POST":
            return web.json_response(ApiError(405, "MethodNotAllowed", "the server does not allow this method on "
                                              "the requested resource").status(), status=405)
        body = await self.json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise bad_request("the object provided is unrecognized (must be of type object)")
        spec = body["spec"]
        if not spec.get("resourceAttributes") and not spec.get("nonResourceAttributes"):
            raise ApiError(422, "Invalid", 'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: '
                           "spec.resourceAttributes: Invalid value: \"null\": exactly one of "
                           "nonResourceAttributes or resourceAttributes must be specified")
        return web.json_response({"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                                  "metadata": {"creationTimestamp": None}, "spec": spec,
                                  "status": rbac.access_review(self.store, user, spec)}, status=201)

    def with_warnings(self, resp: web.Response) -> web.Response:
        for w in self.store.last_warnings:
            resp.headers.add("Warning", '299 - ' + json.dumps(w))
        self.store.last_warnings = []
        return resp

    async def json_body(self, request: web.Request):
        raw = await request.read()
        if len(raw) > MAX_REQUEST_BODY:  # the API server's MaxRequestBodyBytes (3 MiB), before decoding
            raise ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_REQUEST_BODY}")
        if not raw:
            raise bad_request("the body of the request was empty")
        try:
            return json.loads(raw)
        except ValueError as e:
            try:
                import yaml
                return yaml.safe_load(raw)
            except Exception:
                raise bad_request(f"couldn't get version/kind; json parse error: {e}") from None

    async def watch(self, request: web.Request, res: Resource, ns: str | None, match) -> web.StreamResponse:
        q = request.query
        rv = q.get("resourceVersion")
        since = None if rv in (None, "", "0") else None
        if rv not in (None, "", "0"):
            try:
                since = int(rv)
            except ValueError:
                raise bad_request(f'invalid resource version: "{rv}"') from None
        timeout = float(q.get("timeoutSeconds") or 1800)
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       "Transfer-Encoding": "chunked"})
        await resp.prepare(request)
        try:
            w, initial = self.store.watch(res, ns, match, since)
        except ApiError as e:
            await resp.write((json.dumps({"type": "ERROR", "object": e.status()}) + "\n").encode())
            await resp.write_eof()
            return resp
        deadline = time.monotonic() + timeout
        last_bm = time.monotonic()
        try:
            for t, o in initial:
                await resp.write((json.dumps({"type": t, "object": o}) + "\n").encode())
            while not self.stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    t, o = await asyncio.wait_for(w.queue.get(), timeout=min(left, 1.0))
                    if t == Watcher.END:  # ended by the control below; an ERROR event first when expired
                        if o is not None:
                            await resp.write((json.dumps({"type": "ERROR", "object": o}) + "\n").encode())
                        break
                except asyncio.TimeoutError:
                    if bookmarks and time.monotonic() - last_bm > 5:
                        last_bm = time.monotonic()
                        bm = {"kind": res.kind, "apiVersion": res.api_version,
                              "metadata": {"resourceVersion": str(self.store.rv)}}
                        await resp.write((json.dumps({"type": "BOOKMARK", "object": bm}) + "\n").encode())
                    continue
                await resp.write((json.dumps({"type": t, "object": o}) + "\n").encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.unwatch(w)
        try:
            await resp.write_eof()
        except Exception:
            pass
        return resp

    async def pod_log(self, request: web.Request, ns: str, name: str) -> web.StreamResponse:
        q = request.query
        pod = self.store.get(PODS, ns, name)
        if pod is None:
            raise not_found(PODS, name)
        tail = int(q["tailLines"]) if q.get("tailLines") else None
        text = self.kubelet.read_log(pod, q.get("container"), previous=q.get("previous") in ("true", "1"))
        if q.get("follow") in ("true", "1"):
            resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            sent = _tail(text, tail)
            await resp.write(sent.encode())
            pos = len(text)
            while not self.stopping.is_set():
                await asyncio.sleep(0.2)
                try:
                    text = self.kubelet.read_log(pod, q.get("container"), previous=False)
                except ApiError:
                    break
                if len(text) > pos:
                    await resp.write(text[pos:].encode())
                    pos = len(text)
                if not self.kubelet.container_running(pod, q.get("container")):
                    text = self.kubelet.read_log(pod, q.get("container"), previous=False)
                    if len(text) > pos:
                        await resp.write(text[pos:].encode())
                    break
            await resp.write_eof()
            return resp
        return web.Response(text=_tail(text, tail), content_type="text/plain")

    # -------------------------------------------------------------- test controls
    async def control(self, request: web.Request, parts: list[str]) -> web.Response:
        body = {}
        raw = await request.read()
        if raw:
            body = json.loads(raw)
        k = self.kubelet
        if len(parts) == 5 and parts[0] == "namespaces" and parts[2] == "pods":
            ns, name, action = parts[1], parts[3], parts[4]
            pod = self.store.get(PODS, ns, name)
            if pod is None:
                raise not_found(PODS, name)
            if action == "oomkill":
                k.oom_kill(pod, body.get("container"))
                return web.json_response({"ok": True})
            if action == "evict":
                k.evict(pod, body.get("message"))
                return web.json_response({"ok": True})
            if action == "processes":
                return web.json_response({"pids": k.pod_processes(pod)})
        if len(parts) == 3 and parts[0] == "nodes" and parts[2] == "lost":
            k.node_lost(parts[1])
            return web.json_response({"ok": True})
        if len(parts) == 2 and parts[0] == "nodes" and request.method == "PUT":
            k.set_node(parts[1], body.get("cpu"), body.get("memory"), body.get("gpus"), body.get("labels"))
            return web.json_response({"ok": True})
        if len(parts) == 4 and parts[0] == "history":
            plural, ns, name = parts[1], parts[2], parts[3]
            return web.json_response({"statuses": self.store.status_history.get((plural, "" if ns == "-" else ns, name), [])})
        if parts == ["network", "forward"] and request.method == "POST":  # a NAT port-forward to the host
            if k.net is None:
                raise bad_request("the emulator runs with --pod-network host: no pod network to forward into")
            try:
                addr = await k.net.forward(int(body["port"]), int(body.get("targetPort", body["port"])))
            except OSError as e:
                raise bad_request(f"network forward: {e}") from None
            return web.json_response({"address": addr})
        if parts == ["policy"] and request.method == "PUT":  # the cluster operator's choices (policy.py)
            self.store.policy.update(body)
            self.kubelet.wake.set()  # the autoscaler looks at pending pods again
            return web.json_response({"ok": True})
        if parts == ["portforward", "drop"]:  # every open port-forward stream ends, as when the API server restarts
            from . import portforward
            return web.json_response({"dropped": await portforward.drop_all()})
        if parts == ["tokens"] and request.method == "POST":  # what an exec plugin's identity provider issues
            tok, expires = self.auth.extra.issue(body.get("user", "exec-user"), float(body.get("lifetime", 60)),
                                                 bool(body.get("rbac", False)))
            stamp = dt.datetime.fromtimestamp(expires, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            return web.json_response({"token": tok, "expirationTimestamp": stamp})
        if parts == ["certificates"] and request.method == "POST" and self.auth.client_ca is not None:
            # what a Pinniped / Teleport exec plugin obtains: a short-lived client certificate
            cert, key, expires = self.auth.client_ca.issue(body.get("user", "cert-user"), list(body.get("groups", [])),
                                                           float(body.get("lifetime", 60)))
            stamp = dt.datetime.fromtimestamp(expires, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            return web.json_response({"certificate": cert, "key": key, "expirationTimestamp": stamp})
        if parts == ["certificates"] and request.method == "GET" and self.auth.client_ca is not None:
            return web.json_response({"issued": self.auth.client_ca.issued})
        if parts == ["tokens", "revoke"] and request.method == "POST":  # the identity provider revokes a token
            return web.json_response({"revoked": self.auth.extra.issued.pop(str(body.get("token")), None) is not None})
        if parts[:1] == ["oidc"]:
            answer = self.oidc.control(request.method, parts[1:], body)
            if answer is not None:
                return answer
        if parts == ["requests"] and request.method == "GET":  # what clients asked, served after RBAC
            return web.json_response({"requests": [{"verb": v, "resource": r, "namespace": n, "count": c}
                                                   for (v, r, n), c in sorted(self.requests.items())]})
        if parts == ["watches", "end"] and request.method == "POST":
            return web.json_response({"ended": self.store.end_watches(body.get("resource"), bool(body.get("expire")))})
        if parts == ["faults", "storm"] and request.method == "POST":
            self.faults.start_storm(body)
            return web.json_response({"ok": True})
        if parts == ["faults"] and request.method == "GET":
            storm = self.faults.storm
            return web.json_response({"answered": {str(k): v for k, v in self.faults.answered.items()},
                                      "left": storm.count if storm else 0})
        if parts == ["restart"] and request.method == "POST" and self.restart is not None:
            asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(
                self.restart(float(body.get("down", 1.0)), body.get("deletePods") or [])))
            return web.json_response({"ok": True})
        if len(parts) == 2 and parts[0] == "operators" and request.method == "PUT":
            if parts[1] not in self.operators:
                raise ApiError(404, "NotFound", f"no operator {parts[1]!r}; known: {sorted(self.operators)}")
            start, task = self.operators[parts[1]]
            running = bool(body.get("running", True))
            if not running and task is not None:
                task.cancel()
                self.operators[parts[1]] = (start, None)
            elif running and task is None:
                self.operators[parts[1]] = (start, asyncio.ensure_future(start(self.store)))
            return web.json_response({"ok": True})
        if parts == ["shutdown"]:
            asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)
            return web.json_response({"ok": True})
        return page_not_found()


def _tail(text: str, n: int | None) -> str:
    if n is None:
        return text
    if n <= 0:
        return ""
    lines = text.splitlines(keepends=True)
    return "".join(lines[-n:])


# ------------------------------------------------------------------ main
def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.support.kube.emulator")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", action="append", default=[])
    p.add_argument("--node", action="append", default=[])
    p.add_argument("--image", action="append", default=[])
    p.add_argument("--crd-group", action="append", default=[])
    p.add_argument("--pod-start-delay", type=float, default=0.3)
    p.add_argument("--namespace", action="append", default=[])
    p.add_argument("--instance-id", default=None)
    p.add_argument("--watch-history", type=int, default=2000)
    p.add_argument("--no-namespaces", action="store_true", help="run containers without mount namespaces")
    p.add_argument("--pod-network", choices=("host", "bridged"), default="host",
                   help="bridged: every pod in a network namespace of its own on a bridge of the emulator's "
                        "own (pod IPs, ClusterIPs), out of reach of the host's loopback (podnet.py)")
    p.add_argument("--host-netns", action="store_true",
                   help="bridged: a namespace for the node / the user's host on the bridge (10.244.0.2), "  # netns only
                        "for NAT-style port-forwards to the root loopback (POST /emulator/v1/network/forward)")
    p.add_argument("--sidecar-image", default=None,
                   help="Istio's sidecar injector: pods in namespaces labelled istio-injection=enabled get an "
                        "istio-proxy container of this image unless they opt out (sidecar.py)")
    p.add_argument("--client-ca", action="store_true",
                   help="authenticate client certificates of the emulator's client CA (STATE/client-ca.crt) and "
                        "issue short-lived ones (POST /emulator/v1/certificates): clientcerts.py")
    return p.parse_args(argv)


async def amain(args) -> None:
    from .kubelet import Kubelet
    state = Path(args.state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    instance = args.instance_id or secrets.token_hex(8)
    store = Store(instance)
    store.history = deque(maxlen=args.watch_history)
    store.sidecar_image = args.sidecar_image
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] + args.namespace:
        if store.get(NAMESPACES, None, ns) is None:
            store.create(NAMESPACES, {"metadata": {"name": ns}})
    tokens = args.token or ["emulator-admin-token=admin"]
    auth = Auth(tokens)
    net = None
    api_port = [0]
    if args.pod_network == "bridged":
        from .podnet import PodNetwork
        net = PodNetwork(store, instance, state, lambda: api_port[0], args.host_netns)
        await net.start()
    kubelet = Kubelet(store, state, instance, images=args.image, nodes=args.node or ["node-1=8,16384,0"],
                      start_delay=args.pod_start_delay, use_namespaces=not args.no_namespaces, net=net)
    if args.crd_group:
        try:
            crds = importlib.import_module(__package__ + ".crds")
        except ModuleNotFoundError as e:
            if e.name != __package__ + ".crds":
                raise
            crds = None
        if crds is not None:
            crds.install(store, list(args.crd_group))
    server = ApiServer(store, kubelet, auth)
    tls = make_tls(state, ca_name="kube-emulator-ca", server_name="kube-apiserver",
                   extra_ips=("10.96.0.1",))  # netns only: the in-cluster `kubernetes` Service
    if args.client_ca:
        auth.client_ca = ClientCA(state)
        auth.client_ca.configure(tls)
    runner, port = await serve(server.app(), port=args.port, ssl_context=tls)
    api_port[0] = port
    store.api_url, store.ca_file = f"https://127.0.0.1:{port}", state / "ca.crt"  # for in-cluster clients (barrier)

    async def restart(down: float, delete_pods: list) -> None:
        """Close the listener and every connection, then listen again on the same port. Pods in
        `delete_pods` ({namespace, name}) are force-deleted while it is down (as through another
        API server replica, or by the node's PodGC): a watcher sees the change only by listing."""
        nonlocal runner
        await runner.cleanup()
        holder = hold_port(port)  # refused meanwhile; a CI run lost the port to another worker's emulator
        try:
            for ref in delete_pods:
                try:
                    store.delete(PODS, ref.get("namespace", "default"), ref["name"], 0)
                except ApiError:
                    pass
            await asyncio.sleep(down)
        finally:
            holder.close()
        runner, _ = await serve(server.app(), port=port, ssl_context=tls)
    server.restart = restart
    write_kubeconfig(state, port, tokens[0].split("=", 1)[0])
    (state / "instance").write_text(instance)
    tasks = [asyncio.ensure_future(kubelet.run())]
    for c in store.controllers:  # named for "operator down": start_tfjob_controller -> tfjob
        server.operators[c.__name__.removeprefix("start_").removesuffix("_controller")] = (
            c, asyncio.ensure_future(c(store)))
    announce(state, port)
    await until_stopped()
    server.stopping.set()
    for t in tasks + [t for _, t in server.operators.values() if t is not None]:
        t.cancel()
    await kubelet.shutdown()
    await runner.cleanup()
    if net is not None:
        await net.close()


def main(argv=None) -> None:
    args = parse_args(argv)
    args.instance_id = args.instance_id or secrets.token_hex(8)
    try:
        asyncio.run(amain(args))
    finally:  # also on a crash: no namespace of this emulator outlives it
        if args.pod_network == "bridged":
            from .podnet import sweep
            sweep(args.instance_id)
