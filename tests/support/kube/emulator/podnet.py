"""`--pod-network bridged`: a pod network as a CNI bridge plugin and kube-proxy make it.

Every name below is a network namespace of the emulator's own (test-infrastructure.md §1): the
root namespace gets no address, no interface and no route; everything is deleted at the end.

- `kemu-<id>-br`: the bridge `br0` (the pods' gateway, 10.244.0.1/16) and kube-proxy. Service  # netns only
  ClusterIPs (10.96.0.0/12) are local there (one `local` route, kube-proxy IPVS mode's `kube-ipvs0`  # netns only
  trick without the dummy device); a userspace proxy (kube-proxy's old userspace mode) listens on
  ClusterIP:port and connects to a ready endpoint pod's targetPort.
- `kemu-<id>-p<n>`: one per pod, `eth0` (a veth whose peer is on br0) with the pod IP, `lo` up, a
  default route via the bridge. Deleted with the pod.
- `kemu-<id>-host` (with `--host-netns`): the node / the user's host on the same bridge (10.244.0.2);  # netns only
  `forward(port)` listens there and copies each connection to 127.0.0.1:port in the root namespace,
  as a NAT port-forward does.

Names: pods read an /etc/hosts the kubelet writes and bind-mounts (see README.md, "Pod network").
Sweep: each emulator holds an flock on /run/kemu/<id>.lock; a namespace `kemu-<id>-...` whose lock
is free (its emulator died) is deleted by the next emulator that starts, and by the test fixture.
"""
from __future__ import annotations

import asyncio
import ctypes
import fcntl
import ipaddress
import itertools
import os
import re
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from .api import PODS, SERVICES, Resource

CLONE_NEWNET = 0x40000000
POD_CIDR = ipaddress.ip_network("10.244.0.0/16")  # netns only
GATEWAY = "10.244.0.1"  # netns only: br0 in the bridge namespace
HOST_ADDRESS = "10.244.0.2"  # netns only: the host namespace (nniManagerIp for in-cluster routes)
SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/12")  # netns only
KUBERNETES_IP = "10.96.0.1"  # netns only: the `kubernetes` Service (the API server)
DNS_IP = "10.96.0.10"  # netns only: kube-dns's ClusterIP (nothing answers: names come from /etc/hosts)
LOCK_DIR = Path("/run/kemu")
NAME_RE = re.compile(r"^kemu-([0-9a-f]{10})-(br|host|p\d+)$")


def prefix(instance: str) -> str:
    return f"kemu-{instance[:10]}-"


def list_netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def sweep(instance: str | None = None) -> list[str]:
    """Delete the namespaces of emulators that are gone (their lock is free); with `instance`, that
    emulator's namespaces whatever its lock says (the fixture, after the process exited)."""
    removed, dead = [], set()
    for name in list_netns():
        m = NAME_RE.match(name)
        if not m:
            continue
        if instance is not None:
            if m.group(1) != instance[:10]:
                continue
        else:
            lock = LOCK_DIR / f"{m.group(1)}.lock"
            if not lock.exists() or _held(lock):
                continue        # not ours (no lock: another tool's), or its emulator is alive
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        removed.append(name)
        dead.add(m.group(1))
    for ident in dead | ({instance[:10]} if instance is not None else set()):
        (LOCK_DIR / f"{ident}.lock").unlink(missing_ok=True)
    return removed


def _held(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


class NetnsSockets:
    """Sockets made inside a network namespace: one worker thread enters the namespace, makes the
    socket and goes back (a socket stays in the namespace it was made in; only creation needs it)."""

    def __init__(self) -> None:
        self._ex = ThreadPoolExecutor(1, "netns-sockets")
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._root: int | None = None
        self._lock = threading.Lock()

    def _setns(self, fd: int, what: str) -> None:
        if self._libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns {what}: {os.strerror(e)}")

    def _make(self, path: str, kind: int = socket.SOCK_STREAM) -> socket.socket:
        if self._root is None:
            self._root = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        fd = os.open(path, os.O_RDONLY)
        try:
            self._setns(fd, path)
        finally:
            os.close(fd)
        try:
            return socket.socket(socket.AF_INET, kind)
        finally:
            self._setns(self._root, "back to the root namespace")

    async def socket(self, path: str, kind: int = socket.SOCK_STREAM) -> socket.socket:
        return await asyncio.get_running_loop().run_in_executor(self._ex, self._make, path, kind)

    def close(self) -> None:
        self._ex.shutdown(wait=False)


async def _ip(*args: str, stdin: str | None = None) -> None:
    proc = await asyncio.create_subprocess_exec(
        "ip", *args, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    if proc.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {err.decode().strip()}")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def splice(a: tuple, b: tuple) -> None:
    """Copy both ways until both sides closed (half-closes passed on)."""
    try:
        await asyncio.gather(_pipe(a[0], b[1]), _pipe(b[0], a[1]))
    finally:
        a[1].close()
        b[1].close()


async def serve_forward(sock: socket.socket, target_port: int,
                        on_connect: Callable[[], None] | None = None) -> asyncio.AbstractServer:
    """Accept on `sock` (listening, made in some namespace) and copy each connection to
    127.0.0.1:`target_port` of this process's namespace: a NAT port-forward into loopback."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if on_connect is not None:
            on_connect()
        try:
            up = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", target_port), 5)
        except (OSError, asyncio.TimeoutError):
            writer.transport.abort()
            return
        await splice((reader, writer), up)
    return await asyncio.start_server(handle, sock=sock)


class _NoSuchName(asyncio.DatagramProtocol):
    """kube-dns at DNS_IP: every name it is asked is NXDOMAIN. Service names are answered by the
    pod's /etc/hosts, which glibc reads first ("files dns"); what reaches DNS is no Service (the
    search list, ndots:5), and answering at once spares the pod the resolver's timeouts."""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        if len(data) < 12:
            return
        end = 12
        while end < len(data) and data[end]:
            end += 1 + data[end]
        question = data[12:end + 5]      # the name, its terminating 0, QTYPE, QCLASS
        flags = 0x8000 | (data[2] & 0x01) << 8 | 0x0080 | 3  # QR, RD copied, RA, NXDOMAIN
        self.transport.sendto(data[:2] + flags.to_bytes(2, "big") + b"\x00\x01\x00\x00\x00\x00\x00\x00"
                              + question, addr)


class PodNetwork:
    def __init__(self, store, instance: str, state: Path, api_port: Callable[[], int], host_netns: bool) -> None:
        self.store, self.instance, self.api_port = store, instance, api_port
        self.kubernetes_ip = KUBERNETES_IP
        self.prefix = prefix(instance)
        self.bridge = self.prefix + "br"
        self.host = self.prefix + "host" if host_netns else None
        self.hosts_dir = state / "net"
        self.hosts_dir.mkdir(exist_ok=True)
        self.sockets = NetnsSockets()
        self.pods: dict[str, tuple[str, str]] = {}   # uid -> (netns name, pod IP)
        self.meta: dict[str, tuple[str, str]] = {}   # uid -> (namespace, pod name)
        self._seq = itertools.count(1)
        self._free_ips: list[str] = []
        self._next_ip = 256 + 1          # 10.244.1.1 on (10.244.0.x: gateway, host)  netns only
        self._next_svc = 11              # 10.96.0.11 on (.1 kubernetes, .10 kube-dns)  netns only
        self.listeners: dict[tuple[str, int], asyncio.AbstractServer] = {}
        self.forwards: list[asyncio.AbstractServer] = []
        self._rr = itertools.count()
        self._lock_fd: int | None = None
        self._refresh: asyncio.TimerHandle | None = None
        self._sync_task: asyncio.Task | None = None
        self._dns: asyncio.DatagramTransport | None = None
        self._dirty = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        sweep()
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(LOCK_DIR / f"{self.instance[:10]}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        await _ip("netns", "add", self.bridge)
        await _ip("-n", self.bridge, "-batch", "-", stdin="\n".join([
            "link set lo up",
            "link add br0 type bridge",
            f"addr add {GATEWAY}/16 dev br0",  # netns only
            "link set br0 up",
            f"route add local {SERVICE_CIDR} dev lo",  # netns only: every ClusterIP is local here
        ]) + "\n")
        if self.host:
            await self._join(self.host, "vhost", HOST_ADDRESS)
        self.store.allocate_cluster_ip = self.allocate_cluster_ip
        self.store.subscribe(self._on_change)
        await self._listen(KUBERNETES_IP, 443)
        dns = await self.sockets.socket(f"/run/netns/{self.bridge}", socket.SOCK_DGRAM)
        dns.bind((DNS_IP, 53))
        self._dns, _ = await asyncio.get_running_loop().create_datagram_endpoint(_NoSuchName, sock=dns)
        self.schedule_sync()

    async def close(self) -> None:
        for srv in list(self.listeners.values()) + self.forwards:
            srv.close()
        self.listeners.clear()
        self.forwards.clear()
        if self._dns is not None:
            self._dns.close()
        present = set(list_netns())
        for name in [n for n, _ in self.pods.values()] + ([self.host] if self.host else []) + [self.bridge]:
            if name in present:
                await _ip("netns", "del", name)
        self.pods.clear()
        sweep(self.instance)
        self.sockets.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)

    async def _join(self, netns: str, veth: str, address: str) -> None:
        await _ip("netns", "add", netns)
        await _ip("-n", self.bridge, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        await _ip("-n", self.bridge, "link", "set", veth, "master", "br0", "up")
        await _ip("-n", netns, "-batch", "-", stdin="\n".join([
            "link set lo up", f"addr add {address}/16 dev eth0", "link set eth0 up",  # netns only
            f"route add default via {GATEWAY}"]) + "\n")  # netns only

    # ------------------------------------------------------------ pods
    async def add_pod(self, uid: str, ns: str, name: str) -> tuple[str, str]:
        """The pod sandbox's network: (netns path, pod IP)."""
        if uid in self.pods:
            n, ip = self.pods[uid]
            return f"/run/netns/{n}", ip
        n = next(self._seq)
        netns = f"{self.prefix}p{n}"
        if self._free_ips:
            ip = self._free_ips.pop(0)
        else:
            ip = str(POD_CIDR[self._next_ip])
            self._next_ip += 1
        self.pods[uid] = (netns, ip)
        self.meta[uid] = (ns, name)
        await self._join(netns, f"vp{n}", ip)
        self.write_hosts(uid)
        return f"/run/netns/{netns}", ip

    async def remove_pod(self, uid: str) -> None:
        got = self.pods.pop(uid, None)
        self.meta.pop(uid, None)
        if got is None:
            return
        netns, ip = got
        try:
            await _ip("netns", "del", netns)
        except OSError:
            pass
        self._free_ips.append(ip)
        self.hosts_path(uid).unlink(missing_ok=True)
        self.resolv_path(uid).unlink(missing_ok=True)

    def netns_path(self, uid: str) -> str | None:
        got = self.pods.get(uid)
        return f"/run/netns/{got[0]}" if got else None

    def ip_of(self, uid: str) -> str | None:
        got = self.pods.get(uid)
        return got[1] if got else None

    def hosts_path(self, uid: str) -> Path:
        return self.hosts_dir / f"{uid}.hosts"

    def resolv_path(self, uid: str) -> Path:
        return self.hosts_dir / f"{uid}.resolv"

    # ------------------------------------------------------------ names (/etc/hosts)
    def _service_lines(self, pod_ns: str) -> list[str]:
        lines = []
        for svc in self.store.list(SERVICES):
            md, spec = svc["metadata"], svc.get("spec") or {}
            ns, name = md.get("namespace", "default"), md["name"]
            names = ([name] if ns == pod_ns else []) + [f"{name}.{ns}", f"{name}.{ns}.svc",
                                                         f"{name}.{ns}.svc.cluster.local"]
            ip = spec.get("clusterIP")
            if ip and ip != "None":
                lines.append(f"{ip}\t{' '.join(names)}")
            else:   # headless: the ready endpoints' pod IPs
                for pod in self.endpoints(svc):
                    lines.append(f"{pod['status']['podIP']}\t{' '.join(names)}")
        return lines

    def write_hosts(self, uid: str) -> None:
        ns, name = self.meta[uid]
        ip = self.pods[uid][1]
        text = "\n".join(["# Kubernetes-managed hosts file (emulator: Services as cluster DNS answers them).",
                          "127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
                          f"{ip}\t{name}"] + self._service_lines(ns)) + "\n"
        path = self.hosts_path(uid)
        # in place: the file is bind-mounted (a rename would leave the pod with the old inode)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, text.encode(), 0)
        finally:
            os.close(fd)
        rp = self.resolv_path(uid)
        if not rp.exists():  # as the kubelet writes it for dnsPolicy ClusterFirst
            rp.write_text(f"search {ns}.svc.cluster.local svc.cluster.local cluster.local\n"
                          f"nameserver {DNS_IP}\noptions ndots:5\n")  # netns only

    # ------------------------------------------------------------ Services (kube-proxy)
    def allocate_cluster_ip(self) -> str:
        used = {(s.get("spec") or {}).get("clusterIP") for s in self.store.list(SERVICES)}
        while True:
            ip = str(SERVICE_CIDR[self._next_svc])
            self._next_svc += 1
            if ip not in used:
                return ip

    def endpoints(self, svc: dict) -> list[dict]:
        """Ready pods the Service selects (what the EndpointSlice controller lists)."""
        sel = (svc.get("spec") or {}).get("selector") or {}
        if not sel:
            return []
        ns = svc["metadata"].get("namespace", "default")
        out = []
        for pod in self.store.list(PODS, ns):
            labels = pod["metadata"].get("labels") or {}
            st = pod.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
            if all(labels.get(k) == v for k, v in sel.items()) and st.get("podIP") and ready \
                    and not pod["metadata"].get("deletionTimestamp") and pod["metadata"]["uid"] in self.pods:
                out.append(pod)
        return out

    def _on_change(self, type_: str, res: Resource, obj: dict) -> None:
        if res in (SERVICES, PODS):
            self.schedule_sync()

    def schedule_sync(self) -> None:
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.ensure_future(self._sync())
        else:
            self._dirty = True

    async def _sync(self) -> None:
        self._dirty = True
        while self._dirty:
            self._dirty = False
            await asyncio.sleep(0.01)
            want = set()
            for svc in self.store.list(SERVICES):
                ip = (svc.get("spec") or {}).get("clusterIP")
                # a Service without a ready endpoint refuses (kube-proxy's REJECT rule): no listener
                if ip and ip != "None" and ipaddress.ip_address(ip) in SERVICE_CIDR and self.endpoints(svc):
                    for p in svc["spec"].get("ports") or []:
                        if p.get("protocol", "TCP") == "TCP":
                            want.add((ip, int(p["port"])))
            want.add((KUBERNETES_IP, 443))
            for key in list(self.listeners):
                if key not in want:
                    self.listeners.pop(key).close()
            for ip, port in want - set(self.listeners):
                try:
                    await self._listen(ip, port)
                except OSError as e:
                    print(f"kube-proxy: cannot listen on {ip}:{port}: {e}", flush=True)
            for uid in list(self.pods):
                if uid in self.meta:
                    self.write_hosts(uid)

    async def _listen(self, ip: str, port: int) -> None:
        sock = await self.sockets.socket(f"/run/netns/{self.bridge}")
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((ip, port))
            sock.listen(socket.SOMAXCONN)  # kube-proxy's rules queue nothing of their own
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.listeners[(ip, port)] = await asyncio.start_server(
            lambda r, w, ip=ip, port=port: self._proxy(r, w, ip, port), sock=sock)

    def _target(self, ip: str, port: int) -> tuple[str, tuple[str, int]] | None:
        """(netns or "" for the root namespace, address) for one new connection to ip:port."""
        if ip == KUBERNETES_IP:
            return "", ("127.0.0.1", self.api_port())   # the API server (kubernetes.default)
        for svc in self.store.list(SERVICES):
            spec = svc.get("spec") or {}
            if spec.get("clusterIP") != ip:
                continue
            sp = next((p for p in spec.get("ports") or [] if int(p["port"]) == port), None)
            eps = self.endpoints(svc)
            if sp is None or not eps:
                return None
            pod = eps[next(self._rr) % len(eps)]
            target = sp.get("targetPort", port)
            if isinstance(target, str) and not target.isdigit():
                target = next((cp["containerPort"] for c in pod["spec"]["containers"] for cp in c.get("ports") or []
                               if cp.get("name") == target), None)
                if target is None:
                    return None
            return f"/run/netns/{self.bridge}", (pod["status"]["podIP"], int(target))
        return None

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ip: str, port: int) -> None:
        target = self._target(ip, port)
        if target is None:        # no endpoint: refused, as kube-proxy's REJECT rule answers
            writer.transport.abort()
            return
        netns, addr = target
        try:
            sock = await self.sockets.socket(netns) if netns else socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, addr), 5)
            up = await asyncio.open_connection(sock=sock)
        except (OSError, asyncio.TimeoutError):
            writer.transport.abort()
            return
        await splice((reader, writer), up)

    # ------------------------------------------------------------ the host (NAT port-forward)
    async def forward(self, port: int, target_port: int) -> str:
        """HOST_ADDRESS:port in the host namespace -> 127.0.0.1:target_port in the root namespace."""
        if not self.host:
            raise OSError("the emulator was started without --host-netns")
        sock = await self.sockets.socket(f"/run/netns/{self.host}")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST_ADDRESS, port))
        sock.listen(socket.SOMAXCONN)  # a NAT rule queues nothing of its own
        sock.setblocking(False)
        self.forwards.append(await serve_forward(sock, target_port))
        return HOST_ADDRESS
