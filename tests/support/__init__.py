"""Shared test support: emulators, fixtures and helpers that test packages and scripts/bench_*.py import.

Nothing here imports a test package; tests/test_layout.py checks it."""
