"""A stand-in emulator for tests/test_fork_server.py: it reports how it was started."""
