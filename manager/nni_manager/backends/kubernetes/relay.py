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

Any pod can reach the Service, so an agent connection is paired only once it has spoken (an
agent opens with its TLS ClientHello at once): one silent for FIRST_BYTES_S is closed without
ever taking a back connection, and of more than MAX_WAITING unpaired connections the oldest is
closed for the newcomer. Idle connections cost the manager nothing and never delay an agent.

The relay ends (exit 0: its pod, restartPolicy OnFailure, is Succeeded and holds nothing) once
the manager has had no connection to it for EXPIRE_ENV seconds (the experiment's reconnectWindow):
after that its agents have given up too, and a manager killed for good would otherwise leave it
running forever. A manager that comes back later makes a new relay pod.

Usage: python3 relay.py AGENT_PORT BACK_PORT [AGENT_HOST (default: every address)]
"""
import asyncio
import os
import socket
import sys

WAIT = 30.0
CHUNK = 65536
FIRST_BYTES_S = 10.0
MAX_WAITING = 1024
EXPIRE_ENV = "NNI_RELAY_EXPIRE_S"  # seconds without any connection from the manager; unset or 0: never


class Relay:
    def __init__(self, arrived):
        self.idle = []  # [(reader, writer, watcher task)]
        self.waiting = []  # agent connections not paired yet, oldest first (their writers)
        self.arrived = arrived  # asyncio.Event (made in the running loop), set whenever a back connection arrives
        self.paired = 0  # agent connections being copied to the manager now
        self.last_back = asyncio.get_event_loop().time()  # when the manager was last connected

    def manager_connected(self):
        """Whether any connection from the manager is open (idle, or carrying an agent's bytes)."""
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
                await asyncio.wait_for(self.arrived.wait(), left)
            except asyncio.TimeoutError:
                return None

    async def agent(self, reader, writer):
        self.waiting.append(writer)
        if len(self.waiting) > MAX_WAITING:  # the oldest gives way (its read ends, it is closed)
            self.waiting.pop(0).close()
        try:
            first = await asyncio.wait_for(reader.read(CHUNK), FIRST_BYTES_S)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            first = b""
        paired = await self.take() if first and not writer.is_closing() else None
        if writer in self.waiting:
            self.waiting.remove(writer)
        if paired is None or writer.is_closing():
            if first and paired is None:
                sys.stderr.write("relay: no connection from the manager within %gs; closing an agent connection\n"
                                 % WAIT)
            writer.close()
            if paired is not None:  # it gave way meanwhile: the manager replaces the stream it spent
                paired[1].close()
            return
        back_reader, back_writer = paired
        try:
            back_writer.write(b"\x01" + first)
            await back_writer.drain()
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


async def main(agent_port, back_port, agent_host=None):
    relay = Relay(asyncio.Event())
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
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None))
