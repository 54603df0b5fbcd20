"""Fixtures `aml` and `aml_factory`: an Azure ML (ARM) emulator in its own process, over HTTPS.

Thin wrapper: the fixtures live in tests/support/aml/fixtures.py, where scripts and other
test packages import them from."""
from tests.support.aml.fixtures import (  # noqa: F401 (fixtures)
    aml_factory,
    aml,
    aml_shared,
    aml_in_shared,
)
