"""An Optuna study's storage, offered to a trial on 127.0.0.1 and carried to the manager.

A trial of an Optuna study (the manager puts `NNI_STUDY_STORAGE=agent` in its StartTrial env)
gets `NNI_STUDY_STORAGE=127.0.0.1:<port>` and a per-trial secret `NNI_STUDY_STORAGE_TOKEN`.
Its `optuna.storages.GrpcStorageProxy` (nni_agent.study_runner) calls Optuna's storage service
here; each call must carry the trial id and its token as metadata. The call's bytes go on,
unparsed, over the agent's own channel to the hub (`/nni_agent.v1.StudyStorage/<method>`, with
the agent's id and session token), where the manager answers them from the study's storage: the
worker needs no route to the storage, and another local user who finds the port gets nothing
without a trial's token. The agent never parses Optuna's messages (no Optuna import here).

One more method is the runner's own: `/nni_agent.v1.StudyTrial/EndAs` (body "EARLY_STOPPED")
says the Optuna trial was pruned, so the trial ends EARLY_STOPPED here once its process exits 0.
The server starts with the first study trial, so other agents carry none of it.
"""

from __future__ import annotations

import base64
import logging
import os
from typing import Awaitable, Callable, Dict, Iterable, Optional, Protocol, Tuple

import grpc

log = logging.getLogger(__name__)

ENV_ENDPOINT = "NNI_STUDY_STORAGE"  # from the manager: "agent"; to the trial: 127.0.0.1:<port>
ENV_TOKEN = "NNI_STUDY_STORAGE_TOKEN"
REQUESTED = "agent"
OPTUNA_SERVICE = "optuna.StorageService"
HUB_SERVICE = "nni_agent.v1.StudyStorage"
RUNNER_SERVICE = "nni_agent.v1.StudyTrial"
MD_TRIAL = "nni-trial-id"
MD_TOKEN = "nni-trial-token"
MAX_MESSAGE = 64 * 1024 * 1024  # as the hub's limit

# (trial id, "/<service>/<method>" of Optuna's service, request bytes) -> response bytes; raises
# grpc.aio.AioRpcError as the manager answered, or StudyUnavailable.
Forward = Callable[[str, str, bytes], Awaitable[bytes]]


class StudyUnavailable(Exception):
    """No connection to the manager, and none to wait for: the agent is stopping."""


class StudyTrialHandler(Protocol):
    def study_end_as(self, state: str) -> None: ...


def _raw(data: bytes) -> bytes:
    return data


class StudyStorageServer:
    def __init__(self) -> None:
        self.forward: Optional[Forward] = None  # set once the connection exists
        self._server: Optional[grpc.aio.Server] = None
        self._port = 0
        self._trials: Dict[str, Tuple[str, StudyTrialHandler]] = {}  # trial id -> (token, trial)

    async def start(self) -> None:
        """Listen on 127.0.0.1 (idempotent)."""
        if self._server is not None:
            return
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                          ("grpc.max_send_message_length", MAX_MESSAGE)])
        server.add_generic_rpc_handlers((_Handlers(self),))
        self._port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server

    @property
    def address(self) -> str:
        return "127.0.0.1:%d" % self._port

    def register(self, trial_id: str, trial: StudyTrialHandler) -> str:
        """The trial's token: from now on calls presenting it speak for `trial_id`."""
        token = base64.urlsafe_b64encode(os.urandom(24)).decode()
        self._trials[trial_id] = (token, trial)
        return token

    def unregister(self, trial_id: str) -> None:
        self._trials.pop(trial_id, None)

    async def close(self) -> None:
        self._trials.clear()
        if self._server is not None:
            await self._server.stop(0.5)
            self._server = None

    def trial_of(self, metadata: Optional[Iterable[Tuple[str, object]]]) -> Optional[Tuple[str, StudyTrialHandler]]:
        """(trial id, trial) whose token the call presents, or None."""
        values = dict((k, v) for k, v in (metadata or ()) if isinstance(v, str))
        trial_id, token = values.get(MD_TRIAL, ""), values.get(MD_TOKEN, "")
        known = self._trials.get(trial_id)
        import hmac  # here, not at import: hmac pulls in hashlib and libcrypto, an idle agent's megabyte

        if known is None or not hmac.compare_digest(known[0].encode(), token.encode()):
            return None
        return trial_id, known[1]


class _Handlers(grpc.GenericRpcHandler):
    def __init__(self, server: StudyStorageServer) -> None:
        self._server = server

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Optional[grpc.RpcMethodHandler]:
        method = handler_call_details.method
        service = method.split("/")[1] if method.count("/") == 2 else ""
        if service == OPTUNA_SERVICE:
            return grpc.unary_unary_rpc_method_handler(
                self._storage_call(method), request_deserializer=_raw, response_serializer=_raw)
        if method == "/%s/EndAs" % RUNNER_SERVICE:
            return grpc.unary_unary_rpc_method_handler(self._end_as, request_deserializer=_raw,
                                                       response_serializer=_raw)
        return None

    def _storage_call(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            found = self._server.trial_of(context.invocation_metadata())
            if found is None:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                    "this study storage answers only its trials (NNI_STUDY_STORAGE_TOKEN)")
            forward = self._server.forward
            try:
                if forward is None:
                    raise StudyUnavailable()
                return await forward(found[0], method, request)  # type: ignore[index]
            except StudyUnavailable:
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    "the agent lost its manager and is stopping")
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
            raise AssertionError("unreachable")

        return call

    async def _end_as(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        found = self._server.trial_of(context.invocation_metadata())
        if found is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown trial token")
        state = request.decode("utf-8", "replace")
        if state != "EARLY_STOPPED":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "EndAs takes EARLY_STOPPED only")
        found[1].study_end_as(state)  # type: ignore[index]
        return b""
