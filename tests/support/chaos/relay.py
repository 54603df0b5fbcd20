"""A TCP relay between agents and the hub that misbehaves on purpose, reproducibly.

Agents dial the relay (127.0.0.1, any free port); each connection is piped to the hub's
127.0.0.1 address. `chaos()` then picks, with a seeded `random.Random`, among the live
connections and does one of:

* cut: both sides closed at once with RST (SO_LINGER 0), as a dead NAT or a crashed router;
* stall: nothing forwarded either way for a while (bytes pile up in the kernel), as a
  saturated or flapping link; shorter than the heartbeat silence limits, so only delay;
* half-close: the agent's side gets FIN (its reads see EOF) while the hub's side stays open
  a little longer, then both are closed.

Every action is counted, so a test can say how much chaos it survived.
"""
from __future__ import annotations

import asyncio
import random
import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Pipe:
    agent: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    hub: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST, not FIN: the peer sees 'connection reset', as after a crash."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class ChaosRelay:
    def __init__(self, seed: int, target: str = "") -> None:
        self.rng = random.Random(seed)
        self.target = target  # "127.0.0.1:<port>" of the hub; may be set after construction
        self.port = 0
        self.counts: Counter[str] = Counter()
        self._pipes: list[_Pipe] = []
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            self._close(pipe, reset=True)

    @property
    def live(self) -> list[_Pipe]:
        return [p for p in self._pipes if not p.closed]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, _, port = self.target.rpartition(":")
        assert host == "127.0.0.1", f"the relay dials loopback only, not {self.target!r}"
        try:
            hub = await asyncio.open_connection(host, int(port))
        except OSError:
            _reset(writer)
            self.counts["refused"] += 1
            return
        self.counts["connections"] += 1
        pipe = _Pipe((reader, writer), hub)
        pipe.flowing.set()
        pipe.tasks = [asyncio.create_task(self._pump(pipe, reader, hub[1])),
                      asyncio.create_task(self._pump(pipe, hub[0], writer))]
        self._pipes.append(pipe)

    async def _pump(self, pipe: _Pipe, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                await pipe.flowing.wait()
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        except RuntimeError:  # the hub answered after a half-close ended the agent's side (write_eof)
            pass
        finally:
            self._close(pipe, reset=False)

    def _close(self, pipe: _Pipe, *, reset: bool) -> None:
        if pipe.closed:
            return
        pipe.closed = True
        for _, w in (pipe.agent, pipe.hub):
            if reset:
                _reset(w)
            else:
                w.close()
        for t in pipe.tasks:
            if t is not asyncio.current_task():
                t.cancel()

    # ------------------------------------------------------------------ misbehaviour
    async def chaos(self, stop: asyncio.Event, *, every: tuple[float, float] = (0.03, 0.25),
                    stall: tuple[float, float] = (0.1, 1.5)) -> None:
        """Misbehave on live connections until `stop` is set."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.rng.uniform(*every))
                return
            except asyncio.TimeoutError:
                pass
            live = self.live
            if not live:
                continue
            pipe = self.rng.choice(live)
            action = self.rng.choices(("cut", "stall", "half-close"), weights=(5, 3, 2))[0]
            self.counts[action] += 1
            if action == "cut":
                self._close(pipe, reset=True)
            elif action == "stall":
                pipe.flowing.clear()
                self._later(self.rng.uniform(*stall), pipe.flowing.set)
            else:
                try:
                    pipe.agent[1].write_eof()
                except OSError:
                    pass
                self._later(self.rng.uniform(0.05, 0.5), lambda p=pipe: self._close(p, reset=False))

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        """Run `action` after `delay` without holding up the next misbehaviour."""
        asyncio.get_running_loop().call_later(delay, action)
