"""A party that reaches the hub (or the relay in front of it) but holds no secret, flooding what
the hub must hold before a token is proven. Run as its own process, as another pod would:

    python -m tests.support.security.flood HOST:PORT CA_FILE|- IDLE CONNECTIONS STREAMS

`IDLE` TCP connections that never send a byte, and `CONNECTIONS` HTTP/2 connections (gRPC over
the hub's TLS, whose CA certificate is no secret; "-": plain) each holding `STREAMS` Connect
streams that never say Hello, each re-opened the moment the hub ends it. Prints "flooding" once
everything is open, then every second a JSON line of how the hub ended the streams so far.
"""
from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter

import grpc

CONNECT = "/nni_agent.v1.AgentHub/Connect"


async def _silent_stream(channel: grpc.aio.Channel, ended: Counter[str]) -> None:
    while True:
        call = channel.stream_stream(CONNECT, request_serializer=lambda b: b, response_deserializer=lambda b: b)()
        try:
            await call.read()
            ended["EOF"] += 1
        except grpc.aio.AioRpcError as e:
            ended[e.code().name] += 1
        except asyncio.CancelledError:
            call.cancel()
            raise


OPEN_TIMEOUT_S = 20.0  # one idle connection's handshake; a slower one is counted and left out


async def _open_idle(host: str, port: int, count: int) -> list[object]:
    """`count` idle connections, 50 opening at a time, each given OPEN_TIMEOUT_S: on a loaded test
    bed a handshake may wait out SYN retransmissions, which must not hold the rest of the flood."""
    gate = asyncio.Semaphore(50)
    opened: list[object] = []
    failed: Counter[str] = Counter()

    async def one() -> None:
        async with gate:
            try:
                opened.append(await asyncio.wait_for(asyncio.open_connection(host, port), OPEN_TIMEOUT_S))
            except (OSError, asyncio.TimeoutError) as e:
                failed[type(e).__name__] += 1
                return
            if len(opened) % 100 == 0:  # progress for a test that waits on this one (stdout: "flooding")
                print(f"opened {len(opened)} idle connections", file=sys.stderr, flush=True)

    await asyncio.gather(*(one() for _ in range(count)))
    print(f"opened {len(opened)} of {count} idle connections; not opened: {dict(failed)}", file=sys.stderr, flush=True)
    return opened


async def main(target: str, ca_file: str, idle: int, connections: int, streams: int) -> None:
    host, _, port = target.rpartition(":")
    sockets = await _open_idle(host, int(port), idle)
    options = [("grpc.enable_http_proxy", 0), ("grpc.use_local_subchannel_pool", 1)]  # one connection each
    ca = None if ca_file == "-" else open(ca_file, "rb").read()
    channels = [grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca), options=options)
                if ca is not None else grpc.aio.insecure_channel(target, options=options) for _ in range(connections)]
    ended: Counter[str] = Counter()
    tasks = [asyncio.ensure_future(_silent_stream(ch, ended)) for ch in channels for _ in range(streams)]
    print("flooding", flush=True)
    while True:
        await asyncio.sleep(1)
        print(json.dumps(ended), flush=True)
    del sockets, tasks  # held until the process is killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
