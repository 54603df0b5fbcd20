"""`pods/{name}/portforward` over WebSocket, as the API server and kubelet serve it to `kubectl
port-forward` and the official client (`kubernetes.stream.portforward`).

Protocol `v4.channel.k8s.io` (also accepted: `v5.channel.k8s.io`): per listed port i a data
channel 2i and an error channel 2i+1; every binary frame starts with its channel byte; the first
frame on each channel is the port, 2 bytes little-endian. One TCP connection into the pod per
port per request. A pod that is not running: 400 while unscheduled (the API server), else 500
from the kubelet (no running sandbox: an evicted or ended pod). The connection is dialled inside the pod's own network namespace (with
`--pod-network bridged`), so a port on the pod's 127.0.0.1 is reachable, as through the kubelet.
"""
from __future__ import annotations

import asyncio
import socket

from aiohttp import WSMsgType, web

from .api import PODS, ApiError, bad_request, not_found
from .podnet import NetnsSockets

PROTOCOLS = ("v4.channel.k8s.io", "v5.channel.k8s.io")
_sockets = NetnsSockets()
ACTIVE: set[web.WebSocketResponse] = set()  # open streams (a test control drops them all)
served = 0  # streams served so far


def _connect(s: socket.socket, port: int) -> socket.socket:
    try:
        # as Go (kubelet, container runtime) dials: no Nagle. asyncio would not set it for a socket
        # made with proto 0, and small writes would then wait for the peer's delayed ACK (~40 ms)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(5)
        s.connect(("127.0.0.1", port))  # the pod's own loopback
        s.setblocking(False)
        return s
    except OSError:
        s.close()
        raise


async def dial(netns: str | None, port: int) -> socket.socket:
    """A TCP connection to `port` on the pod's loopback, from a socket made inside the pod's network
    namespace (a socket stays in the namespace it was made in)."""
    loop = asyncio.get_running_loop()
    if netns is None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    else:
        s = await _sockets.socket(netns)
    return await loop.run_in_executor(None, _connect, s, port)


def _ports(raw: list[str]) -> list[int]:
    out = []
    for value in raw:
        for part in value.split(","):
            try:
                port = int(part)
            except ValueError:
                raise bad_request(f'invalid port "{part}"') from None
            if not 0 < port < 65536:
                raise bad_request(f"port {port} must be > 0 and < 65536")
            out.append(port)
    if not out:
        raise bad_request("at least 1 port must be specified")
    return out


async def serve(request: web.Request, store, netns_of, ns: str, name: str) -> web.StreamResponse:
    """netns_of(uid): the pod's network namespace (None: the host network)."""
    pod = store.get(PODS, ns, name)
    if pod is None:
        raise not_found(PODS, name)
    netns = netns_of(pod["metadata"]["uid"])
    ports = _ports(request.query.getall("ports", []))
    if (pod.get("status") or {}).get("phase") != "Running":
        if not pod["spec"].get("nodeName"):  # the API server: no kubelet to send it to
            raise ApiError(400, "BadRequest", f"pod {name} does not have a host assigned")
        # the kubelet: the pod has no running sandbox (not started yet, or evicted / failed / ended);
        # its streaming server answers 500 with the bare error text, which the API server passes on
        # (Kubelet.GetPortForward lists running pods only; streaming/errors.go WriteError)
        return web.Response(status=500, text=f'pod not found ("{name}_{ns}")')
    ws = web.WebSocketResponse(protocols=PROTOCOLS, max_msg_size=0, autoping=True)
    if not ws.can_prepare(request).ok or ws.can_prepare(request).protocol is None:
        raise bad_request("unable to upgrade connection: the request must be a WebSocket upgrade offering "
                          "v4.channel.k8s.io")
    await ws.prepare(request)
    global served
    served += 1
    ACTIVE.add(ws)
    uid = pod["metadata"].get("uid", "")
    writers: dict[int, asyncio.StreamWriter] = {}
    pumps: list[asyncio.Task] = []
    send_lock = asyncio.Lock()

    async def send(channel: int, data: bytes) -> None:
        async with send_lock:
            if not ws.closed:
                await ws.send_bytes(bytes((channel,)) + data)

    async def pump(i: int, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await send(2 * i, data)
        except (ConnectionError, OSError):
            pass
        finally:  # the pod closed its end: the forward is over (as the kubelet ends the stream)
            await ws.close()

    for i, port in enumerate(ports):
        head = port.to_bytes(2, "little")
        await send(2 * i, head)
        await send(2 * i + 1, head)
        try:
            sock = await dial(netns, port)
        except OSError as e:
            await send(2 * i + 1, (f"error forwarding port {port} to pod {uid}, uid : failed to connect to "
                                   f"localhost:{port} inside namespace \"{uid}\": {e.strerror or e}").encode())
            continue
        reader, writer = await asyncio.open_connection(sock=sock)
        writers[2 * i] = writer
        pumps.append(asyncio.create_task(pump(i, reader)))
    if not writers:  # no port could be forwarded: the stream ends after its errors
        await ws.close()
    try:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or not msg.data:
                continue
            writer = writers.get(msg.data[0])
            if writer is not None and len(msg.data) > 1:
                writer.write(msg.data[1:])
                await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        for p in pumps:
            p.cancel()
        for w in writers.values():
            w.close()
        await ws.close()
        ACTIVE.discard(ws)
    return ws


async def drop_all() -> int:
    """Close every open port-forward stream (and so its connection into the pod)."""
    dropped = list(ACTIVE)
    for ws in dropped:
        await ws.close()
    return len(dropped)
