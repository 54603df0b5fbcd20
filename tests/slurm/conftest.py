"""Fixture `slurm`: a real 2-node Slurm cluster on loopback (munged + slurmctld + 2 slurmd),

Thin wrapper: the fixtures live in tests/support/slurm/fixtures.py, where scripts and other
test packages import them from."""
from tests.support.slurm.fixtures import (  # noqa: F401 (fixtures)
    slurm,
    base,
    login_node,
)
