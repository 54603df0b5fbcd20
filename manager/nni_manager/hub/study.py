"""The hub's end of an Optuna study's storage: calls agents carry for their trials.

An agent forwards its trial's calls of Optuna's storage service as
`/nni_agent.v1.StudyStorage/<method>` on its own channel (nni_agent.study_storage), with its id,
its current session token and the trial id as metadata. The hub answers only when the token is
the agent's, the trial is one the agent runs, and the experiment serves a study; then the bytes
go, unparsed, to the study's storage proxy (nni_manager.optuna.storage).
"""
from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from typing import Protocol

import grpc

from nni_agent.study_storage import HUB_SERVICE, MD_TRIAL


class StudyService(Protocol):
    def allows(self, agent_id: str, trial_id: str) -> bool:
        """Whether `agent_id` runs `trial_id`, a trial of the study."""
        ...

    async def call(self, trial_id: str, method: str, request: bytes) -> bytes:
        """Optuna's storage method `method` (its name alone) for `trial_id`; raises
        grpc.aio.AioRpcError as answered."""
        ...


STUDY_WAIT_S = 60.0


def _raw(data: bytes) -> bytes:
    return data


class StudyHandlers(grpc.GenericRpcHandler):
    """`tokens(agent_id)`: the agent's current token ("" for none, or an unspent enrolment
    credential, which only a Hello may present); `service()`: the study, or None."""

    def __init__(self, tokens: Callable[[str], str], service: Callable[[], StudyService | None]) -> None:
        self._tokens = tokens
        self._service = service

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method
        prefix = f"/{HUB_SERVICE}/"
        if not method.startswith(prefix) or "/" in method[len(prefix):]:
            return None
        name = method[len(prefix):]

        async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            md = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
            agent_id, token, trial_id = md.get("nni-agent-id", ""), md.get("nni-agent-token", ""), md.get(MD_TRIAL, "")
            expected = self._tokens(agent_id)
            if not expected or not hmac.compare_digest(expected.encode(), token.encode()):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"agent {agent_id[:64]}: invalid token")
            study = await self._study()
            if study is None:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this experiment serves no Optuna study")
            assert study is not None
            if not study.allows(agent_id, trial_id):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"trial {trial_id[:64]} is not a trial of agent {agent_id[:64]}")
            try:
                return await study.call(trial_id, name, request)
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
            raise AssertionError("unreachable")

        return grpc.unary_unary_rpc_method_handler(call, request_deserializer=_raw, response_serializer=_raw)

    async def _study(self) -> StudyService | None:
        """The study, waiting up to STUDY_WAIT_S for it: a resumed manager's agents reconnect (and
        their trials' calls, held while it was away, arrive) before the study is served again."""
        deadline = asyncio.get_running_loop().time() + STUDY_WAIT_S
        while (study := self._service()) is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        return study
