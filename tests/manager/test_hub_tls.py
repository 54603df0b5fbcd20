"""The network hub over TLS with real agent processes: the experiment's CA is trusted, a
wrong CA or a plain-text agent never gets through, a wrong token is refused, and the
certificate survives a restart (running agents keep trusting it)."""
from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from cryptography import x509

from nni_manager.hub import Hub
from nni_manager.hub.tls import experiment_tls
from nni_manager.store import Store
from tests.support.manager.helpers import until
from tests.support.manager.hub_tls import Recorder, TOKEN, agent
from tests.support.manager.hubkit import StoreOwningHub


async def tls_hub(exp_dir: Path) -> tuple[Hub, Recorder, Path]:
    store = Store.open(exp_dir)
    store.add_agent("a1", "a1", TOKEN, {})
    material = experiment_tls(exp_dir / "tls", ["127.0.0.1"], "ExpTls1")
    rec = Recorder(exp_dir)
    hub = StoreOwningHub(experiment_id="ExpTls1", experiment_dir=exp_dir, store=store, handler=rec, tcp="127.0.0.1:0",
              tls=material)
    hub.register("a1", TOKEN)
    await hub.start()
    return hub, rec, exp_dir / "tls" / "ca.crt"


def test_agent_trusting_the_experiment_ca_connects(tmp_path: Path) -> None:
    async def body() -> None:
        hub, rec, ca = await tls_hub(tmp_path / "exp")
        proc = agent(tmp_path / "w", hub.address, "--ca-file", str(ca))
        try:
            await until(lambda: hub.connected("a1"), 30, "the TLS agent to connect")
            assert rec.hellos == ["a1"]
        finally:
            proc.terminate()
            proc.wait(20)
            await hub.stop()

    asyncio.run(body())


@pytest.mark.parametrize("how", ["wrong CA", "plain text"])
def test_wrong_ca_or_plain_text_never_gets_through(tmp_path: Path, how: str) -> None:
    async def body() -> None:
        hub, rec, _ = await tls_hub(tmp_path / "exp")
        other = experiment_tls(tmp_path / "other", ["127.0.0.1"], "Other")  # a CA the hub does not use
        (tmp_path / "other.crt").write_bytes(other.ca_certificate)
        args = ("--ca-file", str(tmp_path / "other.crt")) if how == "wrong CA" else ()
        proc = agent(tmp_path / "w", hub.address, *args, "--orphan-timeout", "3")
        try:
            code = await asyncio.to_thread(proc.wait, 40)
            assert code == 3  # gave up as an orphan: it never reached the manager
            assert rec.hellos == [] and not hub.connected("a1")
            if how == "wrong CA":
                log = (tmp_path / "w" / "agent.log").read_text()
                assert "CERTIFICATE_VERIFY_FAILED" in log or "certificate verify failed" in log.lower()
        finally:
            if proc.poll() is None:
                proc.kill()
            await hub.stop()

    asyncio.run(body())


def test_wrong_token_refused_over_tls_and_never_echoed(tmp_path: Path) -> None:
    async def body() -> None:
        hub, rec, ca = await tls_hub(tmp_path / "exp")
        proc = agent(tmp_path / "w", hub.address, "--ca-file", str(ca), token="not-the-token-4242")
        try:
            out, _ = await asyncio.to_thread(proc.communicate, timeout=40)
            assert proc.returncode == 2 and rec.hellos == []
            log = (tmp_path / "w" / "agent.log").read_text()
            assert "invalid token" in log and "not-the-token-4242" not in log + out.decode()
        finally:
            await hub.stop()

    asyncio.run(body())


def test_certificate_is_kept_across_restarts_and_covers_new_addresses(tmp_path: Path) -> None:
    first = experiment_tls(tmp_path / "tls", ["127.0.0.1"], "Exp1")
    again = experiment_tls(tmp_path / "tls", ["127.0.0.1"], "Exp1")
    assert again == first  # same CA and certificate: running agents keep trusting the hub
    assert oct((tmp_path / "tls" / "ca.key").stat().st_mode & 0o777) == "0o600"
    moved = experiment_tls(tmp_path / "tls", ["127.0.0.2", "hub.example"], "Exp1")
    assert moved.ca_certificate == first.ca_certificate and moved.certificate != first.certificate
    cert = x509.load_pem_x509_certificate(moved.certificate)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "hub.example" in names.get_values_for_type(x509.DNSName)
    assert "TlsMaterial(" in repr(moved) and "PRIVATE KEY" not in repr(moved)


def _holder() -> tuple[socket.socket, int]:
    """A socket holding a loopback port the way a client's outgoing connection holds its
    ephemeral one (bound, no SO_REUSEADDR)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


def test_a_remembered_port_held_for_a_while_is_waited_for(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A restarted manager's port was taken meanwhile by another socket (the kernel hands listening
    ports out again as ephemeral ones): the running agents dial only that port, so the hub waits
    for it, saying so once, and listens there when it is free."""
    async def body() -> None:
        exp_dir = tmp_path / "exp"
        holder, port = _holder()
        asyncio.get_running_loop().call_later(1.5, holder.close)
        hub = StoreOwningHub(experiment_id="ExpPort1", experiment_dir=exp_dir, store=Store.open(exp_dir),
                             handler=Recorder(exp_dir), tcp=f"127.0.0.1:{port}")
        await hub.start()
        try:
            assert hub.address == f"127.0.0.1:{port}"
            _, writer = await asyncio.open_connection("127.0.0.1", port)  # listening there now
            writer.close()
        finally:
            await hub.stop()

    with caplog.at_level("WARNING", logger="nni_manager.console"):  # what `nni-manager run` shows on stderr
        asyncio.run(body())
    waits = [r.getMessage() for r in caplog.records if "is taken" in r.getMessage()]
    assert len(waits) == 1 and "the running agents dial it" in waits[0], waits


def test_a_port_held_past_the_wait_is_one_clear_error(tmp_path: Path) -> None:
    async def body() -> None:
        exp_dir = tmp_path / "exp"
        holder, port = _holder()
        store = Store.open(exp_dir)
        hub = Hub(experiment_id="ExpPort2", experiment_dir=exp_dir, store=store, handler=Recorder(exp_dir),
                  tcp=f"127.0.0.1:{port}")
        hub.rebind_wait = 1.0
        try:
            with pytest.raises(OSError) as e:
                await hub.start()
        finally:
            holder.close()
            store.close()
        assert str(e.value) == (f"the hub cannot listen on 127.0.0.1:{port}: the port is taken or the address is not "
                                "on this machine (free the port, or set trainingService.hubPort / nniManagerIp)")

    asyncio.run(body())
