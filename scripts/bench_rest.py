"""Benchmark the REST-job platforms (OpenPAI, AML, DLTS) on their emulators against the local
backend, in one run. Prints:
  * per-trial overhead in reuse mode (OpenPAI and AML: 2 environments kept warm):
    submit -> SUCCEEDED of a trivial trial, sequential, vs the local backend (target <= 1.5x);
  * non-reuse (OpenPAI reuseMode false, DLTS): submit -> RUNNING, vs the same emulator running
    the bare command of a job that exits at once (submit -> its process ended, polled as fast as
    the platform's listing allows): what the agent, its TLS dial and our polling add.

  * --shipped: a bare-Python image (the system Python alone) whose agent and dependencies the
    manager ships (AML: a code asset in Azurite; OpenPAI: the job's storage): experiment start ->
    first trial RUNNING for the first experiment (shipped), the second (already there), and an
    image that has them (nothing shipped); ratios to the last, and the bytes shipped.

    python scripts/bench_rest.py [--trials 20] [--shipped [--rounds 3]]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nni_manager.loader import load_config  # noqa: E402
from nni_manager.service import create_training_service  # noqa: E402
from tests.support.aml.fixtures import AZURE_IDENTITY_VARS, start_aml  # noqa: E402
from tests.support.dlts.fixtures import start_dlts  # noqa: E402
from tests.support.manager.helpers import TRIAL, form, until, wait_status  # noqa: E402
from tests.support.openpai.fixtures import start_emulator as start_pai  # noqa: E402

POLL = "0.2s"


def config(work: Path, code: Path, ts: dict[str, Any], concurrency: int, **top: Any) -> Any:
    return load_config({"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
                        "trialConcurrency": concurrency, "trialGracePeriod": 2,
                        "experimentWorkingDirectory": str(work), "trainingService": ts, **top})


async def sequential(cfg: Any, n: int, warm: int = 0) -> list[float]:
    times = []
    async with create_training_service(cfg) as ts:
        for i in range(warm):
            await wait_status(ts, (await ts.submit_trial_job(form(i, steps=0))).id, "SUCCEEDED", timeout=120)
        for i in range(n):
            t0 = time.perf_counter()
            job = await ts.submit_trial_job(form(i, steps=0))
            await wait_status(ts, job.id, "SUCCEEDED", timeout=60)
            times.append(time.perf_counter() - t0)
    return times


async def to_running(cfg: Any, n: int, settled: Any) -> list[float]:
    """Non-reuse: submit -> RUNNING per trial; the next one starts once the previous job has ended
    (`settled()`), as trialConcurrency 1 would wait for it anyway."""
    out = []
    async with create_training_service(cfg) as ts:
        for i in range(n):
            t0 = time.perf_counter()
            job = await ts.submit_trial_job(form(i, steps=0))
            await wait_status(ts, job.id, "RUNNING", "SUCCEEDED", timeout=120)
            out.append(time.perf_counter() - t0)
            await wait_status(ts, job.id, "SUCCEEDED", timeout=60)
            await until(settled, 60, "the trial's job to end")
    return out


async def bare_pai(pai: Any, n: int) -> list[float]:
    """A job whose command exits at once: submit -> SUCCEEDED in the emulator's listing."""
    import aiohttp
    out = []
    headers = {"Authorization": f"Bearer {pai.token}"}
    async with aiohttp.ClientSession() as http:
        for i in range(n):
            name = f"bare_{i}_{os.getpid()}"
            job = (f"protocolVersion: 2\nname: {name}\ntype: job\nprerequisites:\n- {{type: dockerimage, uri: img, "
                   f"name: img}}\ntaskRoles:\n  t:\n    instances: 1\n    dockerImage: img\n    resourcePerInstance: "
                   f"{{cpu: 1, memoryMB: 512, gpu: 0}}\n    commands: [\"true\"]\n")
            t0 = time.perf_counter()
            async with http.post(f"{pai.api}/jobs", data=job, headers={**headers, "Content-Type": "text/yaml"}) as r:
                assert r.status == 202, await r.text()
            while True:
                async with http.get(f"{pai.api}/jobs/{pai.username}~{name}", headers=headers) as r:
                    if (await r.json())["jobStatus"]["state"] == "SUCCEEDED":
                        break
                await asyncio.sleep(0.2)
            out.append(time.perf_counter() - t0)
    return out


# ----------------------------------------------------------------------------- --shipped
WHEELHOUSE = Path(__file__).resolve().parents[1] / ".venv" / "agent-wheelhouse"  # scripts/test.sh fills it


def _shipped_bytes(backend: Any) -> int:
    code = getattr(backend, "code", None)
    return code.uploaded if code is not None else int(getattr(backend, "shipped_bytes", 0))


async def first_running(cfg: Any) -> tuple[float, float, int]:
    """(experiment start -> first trial RUNNING, of it submit -> RUNNING, bytes shipped)."""
    t0 = time.perf_counter()
    async with create_training_service(cfg) as ts:
        t1 = time.perf_counter()
        job = await ts.submit_trial_job(form(0, steps=0))
        await wait_status(ts, job.id, "RUNNING", "SUCCEEDED", timeout=120)
        t2 = time.perf_counter()
        shipped = _shipped_bytes(ts.core.backend)
        await wait_status(ts, job.id, "SUCCEEDED", timeout=60)
    return t2 - t0, t2 - t1, shipped


def _azurite(tmp: Path) -> tuple[Any, str]:
    import socket
    import subprocess
    from tests.support.storage.fixtures import AZURITE_ACCOUNT
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp / "azurite").mkdir(exist_ok=True)
    proc = subprocess.Popen([shutil.which("azurite-blob") or "azurite-blob", "--blobHost", "127.0.0.1", "--blobPort",
                             str(port), "--location", str(tmp / "azurite"), "--silent", "--skipApiVersionCheck"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("azurite-blob did not start (scripts/test.sh installs it)") from None
            time.sleep(0.1)


async def shipped(rounds: int) -> None:
    import uuid
    from azure.storage.blob import BlobServiceClient
    from tests.support.aml.fixtures import SLIM_IMAGE
    from tests.support.storage.fixtures import AZURITE_ACCOUNT, AZURITE_KEY
    from nni_manager.backends import agent_deps

    if not any(WHEELHOUSE.glob("grpcio-*cp311*.whl")) or not Path("/usr/bin/python3").exists():
        raise SystemExit(f"needs {WHEELHOUSE} (scripts/test.sh fills it) and /usr/bin/python3 (the bare image)")
    tmp = Path(tempfile.mkdtemp(prefix="nbs", dir="/tmp"))
    azurite, blob = _azurite(tmp)
    slim = tmp / "slim"
    slim.mkdir()
    for n in ("python3", "python"):
        (slim / n).symlink_to("/usr/bin/python3")
    code = tmp / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    for var in AZURE_IDENTITY_VARS:
        os.environ.pop(var, None)
    results: dict[str, dict[str, list[tuple[float, float, int]]]] = {"aml": {}, "openpai": {}}
    emulators: list[Any] = []
    try:
        pai = start_pai(tmp, rate_limits={"list": 0, "submit": 0}, images={SLIM_IMAGE: str(slim)})
        emulators.append(pai)
        storage = pai.storage_dir("confignfs")
        pai_ts = {"platform": "openpai", "host": pai.url, "username": pai.username, "token": pai.token,
                  "nniManagerIp": "127.0.0.1", "trialMemorySize": "1gb", "pollInterval": POLL}
        pai_bare = {**pai_ts, "dockerImage": SLIM_IMAGE, "storageConfigName": "confignfs",
                    "localStorageMountPoint": str(storage), "containerStorageMountPoint": "/mnt/confignfs"}
        for r in range(rounds):
            os.environ[agent_deps.CACHE_ENV] = str(tmp / f"cache-{r}")  # a manager that has shipped nothing yet
            shutil.rmtree(storage / "nni-agent", ignore_errors=True)
            container = f"azureml-blobstore-{uuid.uuid4()}"
            BlobServiceClient(blob, credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}
                              ).create_container(container)
            aml = start_aml(tmp, images={SLIM_IMAGE: str(slim), "msranni/nni:latest": str(Path(sys.executable).parent)},
                            datastore={"name": "workspaceblobstore", "accountName": AZURITE_ACCOUNT,
                                       "containerName": container, "blobEndpoint": blob, "key": AZURITE_KEY})
            plain = start_aml(tmp)  # a workspace without a datastore: no code asset, the image has the agent
            emulators += [aml, plain]
            os.environ.update(aml.env())
            aml_bare = {**aml.aml_config(), "dockerImage": SLIM_IMAGE, "nniManagerIp": "127.0.0.1",
                        "pollInterval": POLL, "blobEndpoint": blob}
            wh = {"agentWheelhouse": str(WHEELHOUSE)}
            for case in ("first", "second"):
                results["aml"].setdefault(case, []).append(
                    await first_running(config(tmp / f"a{r}{case}", code, aml_bare, 1, **wh)))
                results["openpai"].setdefault(case, []).append(
                    await first_running(config(tmp / f"p{r}{case}", code, pai_bare, 1, **wh)))
            os.environ.update(plain.env())
            results["aml"].setdefault("has them", []).append(await first_running(config(
                tmp / f"a{r}h", code, {**plain.aml_config(), "nniManagerIp": "127.0.0.1", "pollInterval": POLL}, 1)))
            results["openpai"].setdefault("has them", []).append(await first_running(config(
                tmp / f"p{r}h", code, {**pai_ts, "dockerImage": "python:3.11"}, 1)))
            for e in (aml, plain):
                e.stop()
                emulators.remove(e)
        print(f"bare-Python image, experiment start -> first trial RUNNING (median of {rounds} rounds; "
              "of it submit -> RUNNING), bytes shipped:")
        for platform, cases in results.items():
            base_time = statistics.median(t for t, _, _ in cases["has them"])
            for case in ("first", "second", "has them"):
                rows = cases[case]
                total = statistics.median(t for t, _, _ in rows)
                submit = statistics.median(s for _, s, _ in rows)
                sent = statistics.median(b for _, _, b in rows)
                label = {"first": "first (shipped)", "second": "second (cached)", "has them": "image has them"}[case]
                print(f"  {platform:8} {label:16} {total * 1000:7.0f} ms (submit -> RUNNING {submit * 1000:5.0f} ms)"
                      f"   ratio {total / base_time:5.2f}x   shipped {sent / 1e6:6.2f} MB")
    finally:
        for emulator in emulators:
            emulator.stop()
        azurite.terminate()
        azurite.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _ms(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1000:.0f} ms, p90 {sorted(times)[max(0, int(len(times) * .9) - 1)] * 1000:.0f} ms"


async def main(n: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="nbr", dir="/tmp"))
    pai = start_pai(tmp, rate_limits={"list": 0, "submit": 0})
    dlts = start_dlts(tmp)
    aml = start_aml(tmp)
    try:
        code = tmp / "code"
        code.mkdir()
        (code / "trial.py").write_text(TRIAL)
        local = await sequential(config(tmp / "e1", code, {"platform": "local"}, 2), n)
        pai_ts = {"platform": "openpai", "host": pai.url, "username": pai.username, "token": pai.token,
                  "nniManagerIp": "127.0.0.1", "trialMemorySize": "1gb", "pollInterval": POLL}
        reuse = await sequential(config(tmp / "e2", code, pai_ts, 2), n, warm=2)
        for var in AZURE_IDENTITY_VARS:
            os.environ.pop(var, None)
        os.environ.update(aml.env())
        aml_ts = {**aml.aml_config(), "nniManagerIp": "127.0.0.1", "pollInterval": POLL}
        aml_reuse = await sequential(config(tmp / "e3", code, aml_ts, 2), n, warm=2)
        print(f"per-trial submit -> SUCCEEDED, {n} trivial trials, sequential:")
        print(f"  local backend            {_ms(local)}")
        for name, times in (("openpai, reuse (2 envs)", reuse), ("aml, reuse (2 envs)", aml_reuse)):
            ratio = statistics.median(times) / statistics.median(local)
            print(f"  {name:24} {_ms(times)}   ratio {ratio:.2f}x  [target <= 1.5x: "
                  f"{'OK' if ratio <= 1.5 else 'MISSED'}]")
        k = max(3, n // 4)
        bare = await bare_pai(pai, k)
        single = await to_running(config(tmp / "e4", code, {**pai_ts, "reuseMode": False}, 1), k,
                                  lambda: all(j["state"] in ("SUCCEEDED", "FAILED", "STOPPED") for j in pai.jobs()))
        dlts_v1 = {"platform": "dlts", **dlts.dlts_config(), "image": "msranni/nni", "nniManagerIp": "127.0.0.1",
                   "pollInterval": POLL}
        dl = await to_running(config(tmp / "e5", code, dlts_v1, 1), k,
                              lambda: all(j["jobStatus"] in ("finished", "failed", "killed") for j in dlts.jobs()))
        print(f"non-reuse, {k} trials each (polling every {POLL}):")
        print(f"  openpai bare job `true`: submit -> SUCCEEDED   {_ms(bare)}")
        print(f"  openpai trial: submit -> RUNNING              {_ms(single)}   "
              f"ratio {statistics.median(single) / statistics.median(bare):.2f}x of the bare job")
        print(f"  dlts trial: submit -> RUNNING                 {_ms(dl)}")
    finally:
        for emulator in (pai, dlts, aml):
            emulator.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--shipped", action="store_true", help="only the shipped-dependencies comparison")
    parser.add_argument("--rounds", type=int, default=3, help="--shipped: rounds, each with fresh caches and storage")
    a = parser.parse_args()
    os.environ.setdefault("NNI_AGENT_WHEEL_DOWNLOAD", "0")  # wheels from the wheelhouse only: no index here
    asyncio.run(shipped(a.rounds) if a.shipped else main(a.trials))
