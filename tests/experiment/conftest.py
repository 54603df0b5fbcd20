"""Small trial scripts (stdlib `nni_agent` API) and config writers for experiment tests.

Thin wrapper: the fixtures live in tests/support/experiment/fixtures.py, where scripts and other
test packages import them from."""
from tests.support.experiment.fixtures import (  # noqa: F401 (fixtures)
    code_dir,
    make_config,
)
