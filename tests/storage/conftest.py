"""Shared-storage test beds: a real bind mount standing for a mounted share, and Azurite

Thin wrapper: the fixtures live in tests/support/storage/fixtures.py, where scripts and other
test packages import them from."""
from tests.support.storage.fixtures import (  # noqa: F401 (fixtures)
    azurite,
    bind_mount,
)
