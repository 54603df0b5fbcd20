"""Shared test support: emulators, fixtures and helpers that test packages and scripts/bench_*.py import."""
