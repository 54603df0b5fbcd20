"""platform: openpai (see backend.py)."""
