"""The Kubernetes objects as objects.py builds them, without a cluster: where the secrets go
(only the Secret), what the agent pod and the probe pod get from podSpec, the pull Secret's
placeholder. The emulator tests (test_pods_platform.py; tests/platforms/test_job_contract.py for what is submitted) show the
API server takes them; these pin what each builder puts where."""
from __future__ import annotations

import base64
import json
from pathlib import Path

from nni_manager.backends.agent_wheel import AgentWheel
from nni_manager.backends.base import AgentSpec, EnvironmentRequest
from nni_manager.backends.kubernetes import deps, tunnel
from nni_manager.backends.kubernetes.config import KubeConfig, RoleConfig, Storage
from nni_manager.backends.kubernetes.objects import SECRET_MODE, STORAGE_MOUNT, Objects, labels
from nni_manager.hub.relay_token import FILE as RELAY_TOKEN_FILE

TOKEN = "tok-3f9a-do-not-print"
RELAY = "relay-77c1-do-not-print"


def _objects(tmp_path: Path, opts: KubeConfig | None = None, **kw: object) -> Objects:
    wheel = tmp_path / "nni_agent-9.9-py3-none-any.whl"
    wheel.write_bytes(b"PK wheel bytes")
    fields: dict[str, object] = dict(
        opts=opts or KubeConfig(namespace="ns1", roles=[RoleConfig(name="", docker_image="img:1")]),
        experiment_id="Exp1", dry_run_hub="<nniManagerIp>:<hubPort>", hub_tls=True, grace_period=30.0,
        orphan_timeout=360.0, reuse=True, tunnelled=True, agent_env={"FOO": "bar"},
        wheel=AgentWheel(wheel, "9.9", "9.9-abcdef012345", ()), wheel_sha256="ab" * 32, relay_token=RELAY)
    fields.update(kw)
    return Objects(**fields)  # type: ignore[arg-type]


def _env(trial_id: str | None = None) -> EnvironmentRequest:
    member = AgentSpec("nniexpexp1env1", TOKEN, "10.96.0.7:4000", Path("/nonexistent"),  # not dialed
                       ca_certificate=b"-----BEGIN CERTIFICATE-----\n")
    return EnvironmentRequest("env1", (member,), trial_id)


def _meta(o: Objects, env: EnvironmentRequest) -> dict[str, object]:
    return {"name": "nniexpexp1env1", "namespace": o.namespace, "labels": labels(o.experiment_id, env)}


def test_the_tokens_are_in_the_secret_only(tmp_path: Path) -> None:
    o, env = _objects(tmp_path), _env("T1")
    secret = o.secret(env, "nniexpexp1env1", _meta(o, env))
    assert secret["metadata"]["name"] == "nniexpexp1env1-nni"
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {"nniexpexp1env1": TOKEN, "ca.crt": "-----BEGIN CERTIFICATE-----\n", RELAY_TOKEN_FILE: RELAY}
    pod = o.pod_template(o.opts.roles[0], env, _meta(o, env), "trial")
    text = json.dumps(pod)
    assert TOKEN not in text and RELAY not in text
    assert {"name": "nni-secret", "secret": {"secretName": "nniexpexp1env1-nni", "defaultMode": SECRET_MODE}} \
        in pod["spec"]["volumes"]
    assert pod["metadata"]["labels"] == {"app": "nni-kubernetes-trial", "expId": "Exp1", "envId": "env1",
                                         "trialId": "T1"}


def test_without_the_tunnel_the_secret_has_no_relay_token(tmp_path: Path) -> None:
    o, env = _objects(tmp_path, tunnelled=False), _env()
    assert RELAY_TOKEN_FILE not in o.secret(env, "n", _meta(o, env))["data"]


def test_pod_resources_gpus_storage_and_overrides(tmp_path: Path) -> None:
    role = RoleConfig(name="worker", docker_image="img:gpu", gpu_number=2, cpu_number=1.5, memory_mb=2048,
                      pod_spec={"tolerations": [{"key": "role", "operator": "Exists"}]})
    opts = KubeConfig(namespace="ns1", roles=[role], storage=Storage("nfs", server="nfs.example", path="/x"),
                      service_account_name="sa1", pod_spec={"tolerations": [{"key": "ts"}], "priorityClassName": "p"},
                      pod_annotations={"sidecar.istio.io/inject": "false"})
    o, env = _objects(tmp_path, opts, pull_secret="nni-registry-exp1"), _env()
    pod = o.pod_template(role, env, _meta(o, env), "tensorflow", command_prefix="export A=1")
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    assert c["name"] == "tensorflow" and c["image"] == "img:gpu"
    assert c["resources"]["limits"] == {"cpu": "1.5", "memory": "2048Mi", "nvidia.com/gpu": "2"}
    names = [e["name"] for e in c["env"]]
    assert "CUDA_VISIBLE_DEVICES" not in names and {"name": "FOO", "value": "bar"} in c["env"]
    assert {"name": "nni-vol", "mountPath": STORAGE_MOUNT} in c["volumeMounts"]
    assert {"name": "nni-vol", "nfs": {"server": "nfs.example", "path": "/x"}} in spec["volumes"]  # not dialed
    assert spec["imagePullSecrets"] == [{"name": "nni-registry-exp1"}] and spec["serviceAccountName"] == "sa1"
    assert spec["tolerations"] == [{"key": "role", "operator": "Exists"}]  # the role's podSpec last: it wins
    assert spec["priorityClassName"] == "p" and spec["terminationGracePeriodSeconds"] == 45
    assert pod["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert "export A=1" in " ".join(c["command"])
    cpu_only = o.pod_template(RoleConfig(name=""), env, _meta(o, env), "trial")["spec"]["containers"][0]
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in cpu_only["env"]


def test_shipped_dependencies_are_mounted_for_their_image_only(tmp_path: Path) -> None:
    shipped = deps.Shipped(("nni-deps-a-0", "nni-deps-a-1"), "cp38", 10, (("x.whl", "00" * 32),))
    o, env = _objects(tmp_path, shipped={"img:1": shipped}), _env()
    c = o.pod_template(RoleConfig(name="", docker_image="img:1"), env, _meta(o, env), "trial")["spec"]["containers"][0]
    assert [m["mountPath"] for m in c["volumeMounts"] if m["name"].startswith("nni-deps-")] == \
        [f"{deps.DEPS_DIR}/0", f"{deps.DEPS_DIR}/1"]
    other = o.pod_template(RoleConfig(name="", docker_image="img:2"), env, _meta(o, env), "trial")
    assert not [m for m in other["spec"]["containers"][0]["volumeMounts"] if m["name"].startswith("nni-deps-")]


def test_probe_pod_keeps_container_fields_but_not_the_gpu_pool_or_the_secret(tmp_path: Path) -> None:
    opts = KubeConfig(namespace="ns1", roles=[RoleConfig(name="", docker_image="img:1")], pod_spec={
        "nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "gpu"}],
        "containers": [{"name": "trial", "imagePullPolicy": "IfNotPresent",
                        "securityContext": {"runAsNonRoot": True}},
                       {"name": "sidecar", "image": "proxy:1"}]})
    o = _objects(tmp_path, opts)
    pod = o.probe_pod(opts.roles[0], 0)
    spec = pod["spec"]
    assert pod["metadata"]["name"] == "nni-probe-exp1-0" and pod["metadata"]["namespace"] == "ns1"
    assert pod["metadata"]["annotations"] == tunnel.SAFE_TO_EVICT
    assert [c["name"] for c in spec["containers"]] == ["probe"]  # no imageless second container, no sidecar
    c = spec["containers"][0]
    assert c["imagePullPolicy"] == "IfNotPresent" and c["securityContext"] == {"runAsNonRoot": True}
    assert "nodeSelector" not in spec and "tolerations" not in spec
    assert not [v for v in spec["volumes"] if v["name"] == "nni-secret"]
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}


def test_pull_secret_dry_run_shows_the_path_not_the_credentials(tmp_path: Path) -> None:
    auth = tmp_path / "config.json"
    auth.write_text('{"auths": {"registry.example": {"auth": "c2VjcmV0LXB3"}}}')
    opts = KubeConfig(namespace="ns1", roles=[RoleConfig(name="", private_registry_auth_path=auth)])
    o = _objects(tmp_path, opts)
    shown = o.dry_run_shared("9.9")
    assert [x["kind"] for x in shown] == ["ConfigMap", "Secret"]
    assert "c2VjcmV0LXB3" not in json.dumps(shown) and str(auth) in json.dumps(shown)
    made = o.pull_secret_object(auth)
    assert made["metadata"]["name"] == "nni-registry-exp1"
    assert base64.b64decode(made["data"][".dockerconfigjson"]) == auth.read_bytes()
    cm = o.wheel_config_map()
    assert cm["immutable"] is True and base64.b64decode(cm["binaryData"]["nni_agent-9.9-py3-none-any.whl"]) == \
        b"PK wheel bytes"
