"""The job platforms' REST retry pause: 1 s, shortened only by the test-only NNI_MANAGER_REST_BACKOFF_S
(docs/testing.md), which a user's typo cannot turn into a crash or a negative sleep."""
from __future__ import annotations

import pytest

from nni_manager.backends.rest_jobs import BACKOFF_ENV, RestClient


@pytest.mark.parametrize("value,expected", [(None, 1.0), ("0.05", 0.05), ("", 1.0), ("soon", 1.0), ("-3", 0.0)])
def test_first_retry_pause(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: float) -> None:
    if value is None:
        monkeypatch.delenv(BACKOFF_ENV, raising=False)
    else:
        monkeypatch.setenv(BACKOFF_ENV, value)
    assert RestClient("http://127.0.0.1:1", "TEST").backoff == expected  # not dialed: data only
    assert RestClient("http://127.0.0.1:1", "TEST", backoff=2.0).backoff == 2.0  # a caller's own value wins
