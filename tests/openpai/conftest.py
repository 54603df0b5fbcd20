"""Fixtures `pai` and `pai_factory`: an OpenPAI rest-server emulator in its own process.

Thin wrapper: the fixtures live in tests/support/openpai/fixtures.py, where scripts and other
test packages import them from."""
from tests.support.openpai.fixtures import (  # noqa: F401 (fixtures)
    pai_factory,
    pai,
    pai_shared,
)
