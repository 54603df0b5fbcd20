"""The emulators and the cluster the job-platform contract suite runs on (tests/support/job_platforms.py),
and `job_platform`, each scenario's parameter: one platform of `PLATFORMS`.

Thin wrapper: the emulators' fixtures live in tests/support/<platform>/fixtures.py."""
import pytest

from tests.support.aml.fixtures import aml_factory, aml_in_shared, aml_shared  # noqa: F401 (fixtures)
from tests.support.dlc.fixtures import dlc_factory, dlc_in_shared, dlc_shared  # noqa: F401 (fixtures)
from tests.support.dlts.fixtures import dlts_factory, dlts_in_shared, dlts_shared  # noqa: F401 (fixtures)
from tests.support.kube.fixtures import kube_crd_ns, kube_crd_shared, kube_factory, kube_ns, kube_shared  # noqa: F401 (fixtures)
from tests.support.openpai.fixtures import pai_factory  # noqa: F401 (fixtures)
from tests.support.slurm.fixtures import base, slurm  # noqa: F401 (fixtures)
from tests.support.job_platforms import PLATFORMS, JobPlatform


@pytest.fixture(params=[p.param() for p in PLATFORMS])
def job_platform(request: pytest.FixtureRequest) -> JobPlatform:
    return request.param
