"""Fixtures for the WebUI / REST tests: a synthetic stored experiment, an in-process server on

Thin wrapper: the fixtures live in tests/support/webui/fixtures.py, where scripts and other
test packages import them from."""
from tests.support.webui.fixtures import (  # noqa: F401 (fixtures)
    home,
    browser,
    artifacts,
)
