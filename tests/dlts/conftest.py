"""Fixtures `dlts` and `dlts_factory`: a DLTS (DLWorkspace) dashboard emulator in its own process.

Thin wrapper: the fixtures live in tests/support/dlts/fixtures.py, where scripts and other
test packages import them from."""
from tests.support.dlts.fixtures import (  # noqa: F401 (fixtures)
    dlts_factory,
    dlts,
    dlts_shared,
    dlts_in_shared,
)
