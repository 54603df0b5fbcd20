"""The one secret rule (`config.is_secret`) knows the names tools really use for secrets, so an
`agentEnv` value such as `PGPASSWORD` is masked in logs, reprs and the store, and delivered as a
secret; names that only hold a path, a switch or the working directory stay visible."""
from __future__ import annotations

import pytest

from nni_manager.config import REDACTED, is_secret, redacted

TOOL_SECRETS = ["PGPASSWORD", "MYSQL_PWD", "SSHPASS", "GITHUB_PAT", "AZURE_STORAGE_SAS", "DATABASE_URL",
                "REDIS_URL", "MONGODB_URI", "SQLALCHEMY_DATABASE_URI", "CELERY_BROKER_URL", "SENTRY_DSN", "DB_PASS",
                "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY",
                "NPM_TOKEN", "dbPassword", "AZURE_CLIENT_SECRET", "GOOGLE_APPLICATION_CREDENTIALS_JSON_CREDENTIALS"]
VISIBLE = ["PWD", "max_tokens", "url", "auth", "apiServerUrl", "homepage_url", "authFile", "keyboard", "BYPASS",
           "storageAccountName", "trialCodeDirectory", "HOME", "PATH", "CUDA_VISIBLE_DEVICES", "passes", "patience"]


@pytest.mark.parametrize("name", TOOL_SECRETS)
def test_tool_secret_names_are_secret(name: str) -> None:
    assert is_secret(name)
    assert redacted({"agentEnv": {name: "s3cr3t"}})["agentEnv"][name] == REDACTED


@pytest.mark.parametrize("name", VISIBLE)
def test_other_names_stay_visible(name: str) -> None:
    assert not is_secret(name)
