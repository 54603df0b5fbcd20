"""Optuna studies run by the agents (docs/optuna.md): study.py (the command), storage.py (the storage proxy)."""
