"""Fixture `dlc`: the PAI-DLC OpenAPI emulator (tests/support/dlc/emulator) in its own process, over HTTPS,

Thin wrapper: the fixtures live in tests/support/dlc/fixtures.py, where scripts and other
test packages import them from."""
from tests.support.dlc.fixtures import (  # noqa: F401 (fixtures)
    dlc_factory,
    dlc,
    dlc_shared,
    dlc_in_shared,
)
