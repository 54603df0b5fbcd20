"""Single-use enrolment credentials (platforms whose job definitions others can read: DLTS, AML),
with real agent processes on a real TLS hub: the credential works once, the enrolled agent
redials with its session token (also after a hub restart, and as a new agent process reading
its token file). A second use of the credential is refused and revokes the session it opened
(tests/security/test_enrolment.py)."""
from __future__ import annotations

import asyncio
import logging
import stat
from pathlib import Path

from nni_manager.hub.server import credential_digest
from tests.support.manager.helpers import until
from tests.support.manager.hub_tls import agent
from tests.support.manager.enrolment import CREDENTIAL, enrol_hub, stop_all, token_file


def test_credential_works_once_then_the_session_token_everywhere(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="nni_manager.hub.server")
    exp = tmp_path / "exp"

    async def body() -> None:
        hub, rec, ca, store = await enrol_hub(exp)
        tok = token_file(tmp_path / "job" / "token", CREDENTIAL)
        first = agent(tmp_path / "w1", hub.address, "--ca-file", str(ca), "--token-file", str(tok))
        procs = [first]
        try:
            await until(lambda: hub.connected("a1"), 30, "the agent to enrol")
            session = store.agents()[0]["token"]
            assert session != CREDENTIAL and store.agents()[0]["enrol"] == 0
            assert store.agents()[0]["spent"] == credential_digest(CREDENTIAL)
            # the agent keeps its session token where its credential was (0600): a restart of it needs it
            await until(lambda: tok.read_text() == session, 10, "the token file to hold the session token")
            assert stat.S_IMODE(tok.stat().st_mode) == 0o600

            # the hub restarts (same port, same store): the agent redials with its session token
            port = int(hub.address.rsplit(":", 1)[1])
            await hub.stop()
            hub, rec, ca, store = await enrol_hub(exp, port)
            await until(lambda: hub.connected("a1"), 40, "the enrolled agent to redial the restarted hub")
            assert store.agents()[0]["token"] == session  # no second enrolment

            # a new agent process on the same token file (an agent restart) gets in too
            first.terminate()
            await asyncio.to_thread(first.wait, 20)
            await until(lambda: not hub.connected("a1"), 20, "the first agent to go")
            again = agent(tmp_path / "w1", hub.address, "--ca-file", str(ca), "--token-file", str(tok))
            procs.append(again)
            await until(lambda: hub.connected("a1"), 30, "the restarted agent to connect with its session token")
        finally:
            await stop_all(procs, hub)

    asyncio.run(body())
