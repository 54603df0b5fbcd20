"""Fixtures `kube` and `kube_factory`: a Kubernetes API server emulator in its own process.

Thin wrapper: the fixtures live in tests/support/kube/fixtures.py, where scripts and other
test packages import them from."""
from tests.support.kube.fixtures import (  # noqa: F401 (fixtures)
    kube_factory,
    kube,
    kube_shared,
    kube_ns,
    kube_crd_shared,
    kube_crd_ns,
)
