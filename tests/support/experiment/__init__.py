"""Fixtures and config builders for the experiment (CLI, config, dispatcher) tests."""
