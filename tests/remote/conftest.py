"""Real OpenSSH servers for the remote backend tests.

Thin wrapper: the fixtures live in tests/support/remote/fixtures.py, where scripts and other
test packages import them from."""
from tests.support.remote.fixtures import (  # noqa: F401 (fixtures)
    ssh_keys,
    ssh_user,
    worker_dir,
    root_login,
    plain_sshd,
    netns_hosts,
    password_user,
)
