"""Single-use enrolment credentials (DLTS, AML: job definitions others can read) with real agent
processes on a real TLS hub. A credential presented a second time means two parties hold it and
the one that enrolled first may be the thief: the session it opened is revoked (nobody can dial
as that agent again, not even with its session token) and the core is told, loudly, to fail the
environment. And where the platform says whether the job runs, a credential is accepted only
once it does: one copied from a queued job's definition opens nothing."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from tests.support.manager.helpers import until
from tests.support.manager.enrolment import CREDENTIAL, enrol_hub, stop_all, token_file
from tests.support.manager.hub_tls import agent


def test_second_presentation_revokes_the_session_it_opened(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="nni_manager.hub.server")

    async def body() -> None:
        hub, rec, ca, store = await enrol_hub(tmp_path / "exp")
        tok = token_file(tmp_path / "job" / "token", CREDENTIAL)
        first = agent(tmp_path / "w1", hub.address, "--ca-file", str(ca), "--token-file", str(tok))
        procs = [first]
        try:
            await until(lambda: hub.connected("a1"), 30, "the agent to enrol")
            session = store.agents()[0]["token"]
            await until(lambda: tok.read_text() == session, 10, "the agent to keep its session token")

            copy = agent(tmp_path / "w2", hub.address, "--ca-file", str(ca), token=CREDENTIAL)
            procs.append(copy)
            out, _ = await asyncio.to_thread(copy.communicate, timeout=40)
            assert copy.returncode == 2, out.decode()[-2000:]  # refused for good
            assert "the session it opened is revoked" in (tmp_path / "w2" / "agent.log").read_text()
            assert [a for a, _ in rec.revoked] == ["a1"] and "presented a second time" in rec.revoked[0][1]
            assert any(r.levelno == logging.ERROR and "revoked" in r.getMessage() for r in caplog.records)
            await until(lambda: not hub.connected("a1"), 20, "the enrolled agent's session to end")
            assert store.agents()[0]["token"] not in (session, CREDENTIAL)  # no token anyone holds works
            await asyncio.sleep(1.5)  # the first agent redials with its session token: refused too
            assert not hub.connected("a1")
            await asyncio.to_thread(first.wait, 40)
            assert first.returncode == 2  # it gave up (UNAUTHENTICATED is final), it did not obey anyone
            assert CREDENTIAL not in caplog.text and session not in caplog.text
        finally:
            await stop_all(procs, hub)

    asyncio.run(body())


def test_enrolment_opens_only_once_the_platform_says_the_job_runs(tmp_path: Path) -> None:
    async def body() -> None:
        hub, rec, ca, store = await enrol_hub(tmp_path / "exp")
        rec.job_runs = False  # the job is still queued on the platform
        tok = token_file(tmp_path / "job" / "token", CREDENTIAL)
        early = agent(tmp_path / "w1", hub.address, "--ca-file", str(ca), "--token-file", str(tok))
        try:
            await until(lambda: "enrolment opens when it does" in _log(tmp_path / "w1"), 30, "a refusal")
            assert not hub.connected("a1") and early.poll() is None  # not enrolled, still redialling
            assert store.agents()[0]["enrol"] == 1 and store.agents()[0]["spent"] == ""  # credential unspent
            rec.job_runs = True  # the platform now lists the job running
            await until(lambda: hub.connected("a1"), 40, "the agent to enrol once the job runs")
            assert store.agents()[0]["enrol"] == 0 and store.agents()[0]["token"] != CREDENTIAL
        finally:
            await stop_all([early], hub)

    asyncio.run(body())


def _log(work: Path) -> str:
    path = work / "agent.log"
    return path.read_text() if path.exists() else ""
