"""Bounds on what the REST API's profile writes may set.

A write acts at once on a running experiment: `trialConcurrency: 100000` asks the tuner for
100,000 trials and the platform for as many slots. Values past these limits are refused with
a 400 that names the field and the limit; the config file itself is not bounded here.
"""
from __future__ import annotations

MAX_TRIAL_CONCURRENCY = 10_000
MAX_TRIAL_NUMBER = 1_000_000
MAX_EXPERIMENT_DURATION_S = 366 * 24 * 3600.0  # a year (and a day)
MAX_SEARCH_SPACE_PARAMETERS = 10_000


def over_limit(field: str, value: float, limit: float, unit: str = "") -> str | None:
    """The refusal for `value` of `field`, or None within `limit`."""
    if value <= limit:
        return None
    return f"Error: {field} may be at most {limit:.15g}{unit}, got {value:.15g}{unit}"
