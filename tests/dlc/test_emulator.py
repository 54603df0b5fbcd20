"""The PAI-DLC emulator through the official SDK (alibabacloud_pai_dlc20201203): the AccessKey
signature is checked (a wrong secret or an unknown key is refused with the gateway's body), and
jobs run their UserCommand as real processes in a bare environment."""
from __future__ import annotations

import time

import pytest
from alibabacloud_pai_dlc20201203.client import Client
from alibabacloud_pai_dlc20201203.models import CreateJobRequest, DataSourceItem, GetJobRequest, JobSpec, ListJobsRequest
from alibabacloud_tea_openapi.exceptions import ClientException
from alibabacloud_tea_openapi.models import Config
from darabonba.runtime import RuntimeOptions

from tests.support.dlc.fixtures import IMAGE


def client(dlc, secret: str | None = None, key: str | None = None) -> Client:
    return Client(Config(access_key_id=key or dlc.access_key_id, access_key_secret=secret or dlc.access_key_secret,
                         region_id="cn-hangzhou", endpoint=dlc.endpoint, protocol="https", ca=dlc.ca_file))


def rt(dlc) -> RuntimeOptions:
    return RuntimeOptions(ca=dlc.ca_file)


def job(command: str, name: str = "emu-job", **kw) -> CreateJobRequest:
    return CreateJobRequest(display_name=name, job_type=kw.get("job_type", "PyTorchJob"), workspace_id="ws-nni",
                            job_specs=[JobSpec(type="Worker", image=IMAGE, pod_count=kw.get("pods", 1),
                                               ecs_spec="ecs.c6.large")],
                            data_sources=[DataSourceItem(data_source_type="nas", data_source_id="data-nas-1")],
                            user_command=command)


def wait(dlc, c: Client, job_id: str, *states: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = c.get_job_with_options(job_id, GetJobRequest(), {}, rt(dlc)).body.status
        if status in states:
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {states}")


def test_a_wrong_secret_or_key_is_refused_as_the_gateway_does(dlc) -> None:
    with pytest.raises(ClientException) as info:
        client(dlc, secret="not-the-secret").list_jobs_with_options(ListJobsRequest(workspace_id="ws-nni"), {}, rt(dlc))
    assert info.value.status_code == 400 and info.value.code == "SignatureDoesNotMatch"
    assert info.value.data["Recommend"].endswith("q=SignatureDoesNotMatch&product=pai-dlc")
    with pytest.raises(ClientException) as info:
        client(dlc, key="LTAInosuchkey").list_jobs_with_options(ListJobsRequest(workspace_id="ws-nni"), {}, rt(dlc))
    assert info.value.status_code == 404 and info.value.code == "InvalidAccessKeyId.NotFound"
    # a key of another workspace's user may not list this one
    other = next(k for k, v in dlc.cfg["accessKeys"].items() if v["user"] == "bob")
    with pytest.raises(ClientException) as info:
        client(dlc, key=other, secret=dlc.cfg["accessKeys"][other]["secret"]).list_jobs_with_options(
            ListJobsRequest(workspace_id="ws-nni"), {}, rt(dlc))
    assert info.value.status_code == 403 and info.value.code == "Forbidden.RAM"
    assert not any(r["action"] == "ListJobs" and r["status"] == 200 for r in dlc.requests())


def test_jobs_run_bare_processes_with_the_pod_environment_and_stop(dlc, tmp_path) -> None:
    c = client(dlc)
    out = tmp_path / "out"
    out.mkdir()
    command = (f'echo "$RANK $WORLD_SIZE ${{VIRTUAL_ENV:-none}} ${{PYTEST_CURRENT_TEST:-none}}" > {out}/rank-$RANK; '
               'command -v python3 >/dev/null')
    ok = c.create_job_with_options(job(command, pods=2), {}, rt(dlc)).body.job_id
    assert wait(dlc, c, ok, "Succeeded", "Failed") == "Succeeded"
    assert sorted(p.name for p in out.iterdir()) == ["rank-0", "rank-1"]
    assert (out / "rank-1").read_text().split() == ["1", "2", "none", "none"]  # nothing of the test's environment
    bad = c.create_job_with_options(job("exit 3"), {}, rt(dlc)).body.job_id
    assert wait(dlc, c, bad, "Succeeded", "Failed") == "Failed"
    long = c.create_job_with_options(job("sleep 60"), {}, rt(dlc)).body.job_id
    wait(dlc, c, long, "Running")
    c.stop_job_with_options(long, {}, rt(dlc))
    assert wait(dlc, c, long, "Stopped") == "Stopped"
    dlc.wait_for(lambda: not dlc.live_pids(), 10, what="no pod process left")
    listed = c.list_jobs_with_options(ListJobsRequest(workspace_id="ws-nni", display_name="emu-"), {}, rt(dlc)).body
    assert listed.total_count == 3 and {j.job_id for j in listed.jobs} == {ok, bad, long}
    c.delete_job_with_options(long, {}, rt(dlc))
    with pytest.raises(ClientException):
        c.get_job_with_options(long, GetJobRequest(), {}, rt(dlc))


def test_create_job_refuses_what_dlc_refuses(dlc) -> None:
    c = client(dlc)
    bad_source = job("true")
    bad_source.data_sources = [DataSourceItem(data_source_type="nas", data_source_id="data-nope")]
    with pytest.raises(ClientException) as info:
        c.create_job_with_options(bad_source, {}, rt(dlc))
    assert info.value.code == "InvalidParameter" and "data-nope" in info.value.data["Message"]
    no_command = job("true")
    no_command.user_command = None
    with pytest.raises(ClientException) as info:
        c.create_job_with_options(no_command, {}, rt(dlc))
    assert info.value.code == "MissingParameter" and "UserCommand" in info.value.data["Message"]
