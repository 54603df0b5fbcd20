"""The manager's version, in a module of its own: the hub reports it to agents without importing
the package's public API (which reaches the service, and so the hub)."""

__version__ = "0.1.0"
