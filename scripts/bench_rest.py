"""Benchmark the REST-job platforms (OpenPAI, AML, DLTS) on their emulators against the local
backend, in one run. Prints:
  * per-trial overhead in reuse mode (OpenPAI and AML: 2 environments kept warm):
    submit -> SUCCEEDED of a trivial trial, sequential, vs the local backend (target <= 1.5x);
  * non-reuse (OpenPAI reuseMode false, DLTS): submit -> RUNNING, vs the same emulator running
    the bare command of a job that exits at once (submit -> its process ended, polled as fast as
    the platform's listing allows): what the agent, its TLS dial and our polling add.

    python scripts/bench_rest.py [--trials 20]
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

from nni_manager.config import load_config  # noqa: E402
from nni_manager.service import create_training_service  # noqa: E402
from tests.support.aml.fixtures import AZURE_IDENTITY_VARS, start_aml  # noqa: E402
from tests.support.dlts.fixtures import start_dlts  # noqa: E402
from tests.support.manager.helpers import TRIAL, form, until, wait_status  # noqa: E402
from tests.support.openpai.fixtures import start_emulator as start_pai  # noqa: E402

POLL = "0.2s"


def config(work: Path, code: Path, ts: dict[str, Any], concurrency: int) -> Any:
    return load_config({"trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code),
                        "trialConcurrency": concurrency, "trialGracePeriod": 2,
                        "experimentWorkingDirectory": str(work), "trainingService": ts})


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
    a = parser.parse_args()
    asyncio.run(main(a.trials))
