"""The hub's study storage calls over real gRPC, answered by Optuna's own servicer for a real
SQLite study: only an agent's session token, only for its own trial, only when a study is served."""
from __future__ import annotations

from pathlib import Path

import grpc
import pytest

optuna = pytest.importorskip("optuna")

from optuna.storages._grpc.auto_generated import api_pb2  # noqa: E402

from nni_agent.study_storage import HUB_SERVICE, MD_TRIAL  # noqa: E402
from nni_manager.hub import study as study_hub  # noqa: E402
from nni_manager.optuna.storage import StorageProxy, open_storage  # noqa: E402
from tests.support.manager.hubkit import TOKEN, run, started_hub  # noqa: E402


class Study:
    def __init__(self, proxy: StorageProxy, trials: dict[str, str]) -> None:
        self.proxy, self.trials = proxy, trials  # trial id -> its agent

    def allows(self, agent_id: str, trial_id: str) -> bool:
        return self.trials.get(trial_id) == agent_id

    async def call(self, trial_id: str, method: str, request: bytes) -> bytes:
        return await self.proxy.call(method, request)


async def all_studies(socket: Path, agent_id: str, token: str, trial_id: str) -> list[str]:
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        call = channel.unary_unary(f"/{HUB_SERVICE}/GetAllStudies",
                                   request_serializer=api_pb2.GetAllStudiesRequest.SerializeToString,
                                   response_deserializer=api_pb2.GetAllStudiesReply.FromString)
        reply = await call(api_pb2.GetAllStudiesRequest(), metadata=(
            ("nni-agent-id", agent_id), ("nni-agent-token", token), (MD_TRIAL, trial_id)))
        return [s.study_name for s in reply.studies]


def test_study_calls_need_the_agents_token_and_its_own_trial(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(study_hub, "STUDY_WAIT_S", 0.5)  # how long a call waits for the study to be served
    storage = open_storage(f"sqlite:///{short_dir / 'study.db'}")
    optuna.create_study(storage=storage, study_name="s1")

    async def body() -> None:
        hub, rec = await started_hub(short_dir)
        hub.register("a2", "enrol-credential", enrol=True)
        with pytest.raises(grpc.aio.AioRpcError) as err:  # no study served
            await all_studies(hub.socket_path, "a1", TOKEN, "t1")
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        proxy = StorageProxy(storage, short_dir / "study.sock")
        await proxy.start()
        assert (short_dir / "study.sock").stat().st_mode & 0o077 == 0  # the manager's user alone
        hub.study = Study(proxy, {"t1": "a1", "t2": "a2"})
        try:
            assert await all_studies(hub.socket_path, "a1", TOKEN, "t1") == ["s1"]
            refused = [("a1", "wrong", "t1", grpc.StatusCode.UNAUTHENTICATED),
                       ("nobody", TOKEN, "t1", grpc.StatusCode.UNAUTHENTICATED),
                       ("a2", "enrol-credential", "t2", grpc.StatusCode.UNAUTHENTICATED),  # only a Hello spends it
                       ("a1", TOKEN, "t2", grpc.StatusCode.PERMISSION_DENIED),  # another agent's trial
                       ("a1", TOKEN, "t9", grpc.StatusCode.PERMISSION_DENIED)]
            for agent_id, token, trial_id, code in refused:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await all_studies(hub.socket_path, agent_id, token, trial_id)
                assert err.value.code() == code, (agent_id, token, trial_id)
        finally:
            await proxy.stop()
            await hub.stop()
            rec.store.close()
        assert not (short_dir / "study.sock").exists()

    run(body())


def test_a_call_before_the_study_is_served_waits_for_it(short_dir: Path) -> None:
    """A resumed manager's agents reconnect before it serves the study again: their trials' calls,
    held while it was away, wait for the study instead of failing the trial."""
    import asyncio

    storage = open_storage(f"sqlite:///{short_dir / 'study.db'}")
    optuna.create_study(storage=storage, study_name="s1")

    async def body() -> None:
        hub, rec = await started_hub(short_dir)
        proxy = StorageProxy(storage, short_dir / "study.sock")
        await proxy.start()
        try:
            early = asyncio.ensure_future(all_studies(hub.socket_path, "a1", TOKEN, "t1"))
            await asyncio.sleep(0.5)
            assert not early.done()  # no study yet: the call waits
            hub.study = Study(proxy, {"t1": "a1"})
            assert await asyncio.wait_for(early, 30) == ["s1"]
        finally:
            await proxy.stop()
            await hub.stop()
            rec.store.close()

    run(body())
