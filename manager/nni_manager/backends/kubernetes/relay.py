"""The hub relay: runs in a pod of the experiment (plain Python, standard library only) so that
agents reach a manager the cluster cannot route to (kind, minikube, a laptop behind NAT).

Agents dial the relay's Service on the agent port. The manager keeps a few idle "back"
connections open to the back port, each through the API server's `pods/portforward` (the back
port listens on the pod's loopback only: nothing but a port-forward, which RBAC guards, reaches
it). Each agent connection is paired with one idle back connection: the relay writes one byte
(0x01) on it so the manager dials its hub, then copies bytes both ways until either end closes.
It never reads them: TLS stays end to end between agent and hub. A back connection closing
while idle (the manager gone, a dropped stream) is discarded; an agent finding no back
connection within WAIT seconds is closed and redials.

Any pod can reach the Service, so a connection is paired only once it has proved that it is one of
this experiment's agents: it opens with an HTTP CONNECT (gRPC writes it: the relay is the agent's
proxy) whose Proxy-Authorization carries the experiment's relay token, of which this program knows
only the sha256 (TOKEN_SHA256, no secret) and compares in constant time. The relay answers "200"
once it paired the connection; anything else (no proof, a wrong one, garbage, more than HEAD_MAX
bytes, silence for FIRST_BYTES_S) is closed at once without ever taking a back connection. Of more
than MAX_WAITING connections that have not proved themselves yet the oldest is closed for the
newcomer; a proven one no longer counts among them. Strangers cost the manager nothing and never
delay an agent (nni_manager/hub/relay_token.py).

The relay ends (exit 0: its pod, restartPolicy OnFailure, is Succeeded and holds nothing) once
the manager has had no connection to it for EXPIRE_ENV seconds (the experiment's reconnectWindow):
after that its agents have given up too, and a manager killed for good would otherwise leave it
running forever. A manager that comes back later makes a new relay pod.

Usage: python3 relay.py AGENT_PORT BACK_PORT TOKEN_SHA256 [AGENT_HOST (default: every address)]
"""
import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import socket
import sys

WAIT = 30.0
CHUNK = 65536
FIRST_BYTES_S = 10.0
MAX_WAITING = 1024
HEAD_MAX = 4096  # an agent's CONNECT is about 150 bytes
CONNECT = b"CONNECT "
EXPIRE_ENV = "NNI_RELAY_EXPIRE_S"  # seconds without any connection from the manager; unset or 0: never


def proven(head, token_sha256):
    """Whether an HTTP CONNECT head carries the relay token (Proxy-Authorization: Basic nni:<token>)."""
    lines = head.split(b"\r\n")
    if len(head) > HEAD_MAX or not lines[0].startswith(CONNECT):
        return False
    presented = b""
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"proxy-authorization":
            scheme, _, encoded = value.strip().partition(b" ")
            if scheme.lower() == b"basic":
                try:
                    presented = base64.b64decode(encoded.strip(), validate=True).partition(b":")[2]
                except (binascii.Error, ValueError):
                    return False
    digest = hashlib.sha256(presented).hexdigest().encode()
    return bool(presented) and hmac.compare_digest(digest, token_sha256.encode())


async def read_head(reader):
    """(head, what came after it): the HTTP head up to its blank line; (b"", b"") when none came in
    FIRST_BYTES_S, the connection ended, or the bytes cannot be one (not a CONNECT, over HEAD_MAX)."""
    loop = asyncio.get_event_loop()
    deadline = loop.time() + FIRST_BYTES_S
    data = b""
    while b"\r\n\r\n" not in data:
        left = deadline - loop.time()
        if left <= 0 or len(data) > HEAD_MAX or not (data.startswith(CONNECT) or CONNECT.startswith(data)):
            return b"", b""
        try:
            # noqa below: standard library only, and nothing but the exit cancels the relay's waits
            chunk = await asyncio.wait_for(reader.read(HEAD_MAX), left)  # noqa: TID251
        except (asyncio.TimeoutError, ConnectionError, OSError):
            return b"", b""
        if not chunk:
            return b"", b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


class Relay:
    def __init__(self, arrived, token_sha256):
        self.token_sha256 = token_sha256
        self.idle = []  # [(reader, writer, watcher task)]
        self.waiting = []  # connections not proven yet, oldest first (their writers)
        self.arrived = arrived  # asyncio.Event (made in the running loop), set whenever a back connection arrives
        self.paired = 0  # agent connections being copied to the manager now
        self.last_back = asyncio.get_event_loop().time()  # when the manager was last connected

    def manager_connected(self):
        """Seconds since a connection from the manager was last open (idle, or carrying an agent's bytes)."""
        now = asyncio.get_event_loop().time()
        if self.idle or self.paired:
            self.last_back = now
        return now - self.last_back

    async def expire(self, after):
        """Return once the manager has been away for `after` seconds."""
        while True:
            away = self.manager_connected()
            if away >= after:
                return
            await asyncio.sleep(min(5.0, max(0.1, after - away)))

    async def back(self, reader, writer):
        """An idle back connection: the manager sends nothing until paired, so any read result
        (EOF included) means it is gone."""
        entry = [reader, writer, None]

        async def watch():
            try:
                await reader.read(1)
            except (ConnectionError, OSError):
                pass
            if entry in self.idle:
                self.idle.remove(entry)
            writer.close()

        entry[2] = asyncio.ensure_future(watch())
        self.idle.append(entry)
        self.manager_connected()
        self.arrived.set()

    async def take(self):
        loop = asyncio.get_event_loop()
        deadline = loop.time() + WAIT
        while True:
            while self.idle:
                reader, writer, watcher = self.idle.pop(0)
                watcher.cancel()
                try:
                    await watcher
                except asyncio.CancelledError:
                    pass
                if not writer.is_closing():
                    return reader, writer
            left = deadline - loop.time()
            if left <= 0:
                return None
            self.arrived.clear()
            try:
                # noqa below: standard library only, and nothing but the exit cancels the relay's waits
                await asyncio.wait_for(self.arrived.wait(), left)  # noqa: TID251
            except asyncio.TimeoutError:
                return None

    async def agent(self, reader, writer):
        self.waiting.append(writer)
        if len(self.waiting) > MAX_WAITING:  # the oldest unproven one gives way (its read ends, it is closed)
            self.waiting.pop(0).close()
        head, rest = await read_head(reader)
        if writer in self.waiting:
            self.waiting.remove(writer)
        if not head or writer.is_closing() or not proven(head, self.token_sha256):
            writer.close()  # no proof: dropped at once, having cost nothing shared
            return
        paired = await self.take()
        if paired is None or writer.is_closing():
            if paired is None:
                sys.stderr.write("relay: no connection from the manager within %gs; closing an agent connection\n"
                                 % WAIT)
            writer.close()
            if paired is not None:  # it went meanwhile: the manager replaces the stream it spent
                paired[1].close()
            return
        back_reader, back_writer = paired
        try:
            back_writer.write(b"\x01" + rest)
            await back_writer.drain()
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
        except (ConnectionError, OSError):
            writer.close()
            back_writer.close()
            return
        self.paired += 1
        try:
            await asyncio.gather(copy(reader, back_writer), copy(back_reader, writer))
        finally:
            self.manager_connected()
            self.paired -= 1


def no_delay(writer):
    """Small writes (gRPC frames) go at once, never held for the peer's delayed ACK."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


async def copy(reader, writer):
    no_delay(writer)
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main(agent_port, back_port, token_sha256, agent_host=None):
    relay = Relay(asyncio.Event(), token_sha256)
    agents = await asyncio.start_server(relay.agent, agent_host, agent_port)
    back = await asyncio.start_server(relay.back, "127.0.0.1", back_port)
    sys.stderr.write("relay: agents on port %d, the manager's port-forwards on 127.0.0.1:%d\n" % (agent_port, back_port))
    sys.stderr.flush()
    expire_s = float(os.environ.get(EXPIRE_ENV) or 0)
    async with agents, back:
        serving = asyncio.gather(agents.serve_forever(), back.serve_forever())
        if expire_s <= 0:
            await serving
            return
        await relay.expire(expire_s)
        sys.stderr.write("relay: no connection from the manager for %gs (the experiment's reconnectWindow): "
                         "its experiment is gone or cannot come back; exiting\n" % expire_s)
        serving.cancel()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None))
