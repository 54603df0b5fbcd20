"""The secret rule: which config fields hold a secret, and how they are kept out of reprs,
the store and the manager's log."""
from __future__ import annotations

import dataclasses
import logging
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# dataclasses' repr(), and `SecretFormatter` masks the values it finds in the manager's log.
#
# A name is split into words (camelCase, snake_case, SCREAMING_CASE, kebab-case); it names a
# secret when its LAST word (or its last two joined: `passWord`, `connectionString`) is a secret
# word. The last word is what the field holds: `sshKeyFile`, `hubKeyFile`, `privateRegistryAuthPath`,
# `keyVaultName` and `tokenFile` hold a path or a name (stored, shown: they say where a secret is,
# and the user needs them to debug a config); `strictHostKeyChecking` holds a switch; `password`,
# `sshPassphrase`, `token`, `accountKey`, `keyVaultKey`, `AZURE_CLIENT_SECRET`, `WANDB_API_KEY`
# hold the secret itself. Whole words only: `monkey`, `max_tokens` or `keyboard` are no secret.
# Tools' own variables count too: `PGPASSWORD` and `DBPASSWORD` (a word ending in a long secret
# word), `MYSQL_PWD` (`pwd` after another word: `PWD` alone is the working directory), `SSHPASS`,
# `DB_PASS`, `GITHUB_PAT`, `AZURE_STORAGE_SAS`, `SENTRY_DSN`, and a URL of a data service
# (`DATABASE_URL`, `REDIS_URL`, `MONGODB_URI`, `CELERY_BROKER_URL`), which carries its password.
_SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "token", "secret", "secrets", "key", "credential", "credentials",
    "connectionstring", "apikey", "accesskey", "secretkey", "privatekey",
    "pass", "sshpass", "pat", "sas", "dsn",
})
_SECRET_SUFFIXES = ("password", "passwd", "passphrase", "token", "secret", "apikey", "credential", "credentials")
_DATA_SERVICES = frozenset({"database", "db", "redis", "mongo", "mongodb", "postgres", "postgresql", "pg", "mysql",
                            "amqp", "rabbitmq", "broker", "sqlalchemy", "kafka", "elasticsearch", "celery"})
# An environment variable's name (SCREAMING_CASE) names a secret when ANY of its words is one of
# these: `GITLAB_TOKEN_RW`, `BASIC_AUTH_HEADER`, `SESSION_COOKIE_VALUE`
# (whole words only: `TOKENIZERS_PARALLELISM` stays visible). `jwt` is one in any name.
_ENV_SECRET_WORDS = frozenset({"token", "auth", "cookie", "cookies", "jwt"})
# A value is a secret whatever its name says when it is a URL carrying a password in its userinfo
# (`PIP_INDEX_URL=https://user:pw@host/simple`) in a `*_URL`/`*_URI`/`*_PROXY` entry, or any
# credentials in a proxy's (`HTTPS_PROXY=http://user@proxy:3128`).
_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/?#@\s]*)@")
# Fields kept as given: a search space maps the user's parameter names (never credentials) to
# distributions, and view mode shows it from the store.
_NEVER_SECRET = frozenset({"search_space"})
REDACTED = "***"


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", spaced)
    return [w.rstrip("0123456789") for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w.rstrip("0123456789")]


def is_secret(name: str) -> bool:
    """Whether a config field (or a key of a user's mapping) holds a secret, kept out of reprs,
    logs and the store. See the rule above."""
    words = _words(str(name))
    if not words:
        return False
    last = words[-1]
    if "jwt" in words or (str(name).isupper() and not _ENV_SECRET_WORDS.isdisjoint(words)):
        return True
    if last in _SECRET_WORDS or "".join(words[-2:]) in _SECRET_WORDS or last.endswith(_SECRET_SUFFIXES):
        return True
    if last == "pwd":
        return len(words) > 1
    return last in ("url", "uri") and any(w in _DATA_SERVICES for w in words[:-1])


def is_secret_value(name: str, value: object) -> bool:
    """Whether `value` (of a field or variable called `name`) is a secret by what it holds: a URL
    with a password (a proxy's: any credentials) in `*_URL`, `*_URI`, `*_PROXY`."""
    if not isinstance(value, str) or "@" not in value:
        return False
    words = _words(str(name))
    if not words or words[-1] not in ("url", "uri", "urls", "proxy"):
        return False
    return any(_credentials(part, proxy=words[-1] == "proxy") for part in re.split(r"[\s,]+", value.strip()))


def _credentials(url: str, proxy: bool) -> bool:
    match = _USERINFO.match(url) or (_USERINFO.match("http://" + url) if proxy else None)
    if match is None:
        return False
    user, _, password = match.group(1).partition(":")
    return bool(password) or (proxy and bool(user))


def is_secret_entry(name: str, value: object) -> bool:
    """The secret rule for one entry: by its name (`is_secret`) or by its value (`is_secret_value`)."""
    return is_secret(name) or is_secret_value(name, value)


def redacted(value: object, name: str = "") -> object:
    """`value` (of a field called `name`) with every secret replaced by "***": what is stored in
    experiment.db and shown by reprs. Mappings are walked by key; a `{name: X, value: V}` entry
    (Kubernetes env lists) hides V when X names a secret. Empty secrets stay empty."""
    if name in _NEVER_SECRET:
        return value
    if is_secret_entry(name, value) and value not in (None, "", [], {}):
        return REDACTED
    if isinstance(value, dict):
        pair_secret = isinstance(value.get("name"), str) and is_secret_entry(value["name"], value.get("value"))
        return {k: REDACTED if pair_secret and k == "value" and v else redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redacted(v) for v in value]
    return value


def redacted_repr(obj: DataclassInstance) -> str:
    """repr() of a config dataclass by the secret rule: secret fields are left out, secrets inside
    its mappings shown as "***"; a nested dataclass uses its own repr."""
    shown = (f"{f.name}={redacted(getattr(obj, f.name), f.name)!r}" for f in dataclasses.fields(obj)
             if f.repr and not is_secret(f.name))
    return f"{type(obj).__name__}({', '.join(shown)})"


def secret_values(value: object, name: str = "") -> set[str]:
    """Every secret string in a config (an ExperimentConfig, a backend's options, a dict), found
    by the same rule: what `SecretFormatter` masks."""
    found: set[str] = set()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            found |= secret_values(getattr(value, f.name), f.name)
        return found
    if name in _NEVER_SECRET:
        return found
    if is_secret_entry(name, value):
        return {v for v in _strings(value) if len(v) >= 4}  # shorter: masking would mangle the log
    if isinstance(value, dict):
        if isinstance(value.get("name"), str) and is_secret_entry(value["name"], value.get("value")):
            found |= secret_values(value.get("value"), "secret")
        for k, v in value.items():
            found |= secret_values(v, str(k))
    elif isinstance(value, (list, tuple)):
        for v in value:
            found |= secret_values(v)
    return found


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return [] if value is None or isinstance(value, bool) else [str(value)]


class SecretFormatter(logging.Formatter):
    """A log formatter that masks the config's secret values (`secret_values`) wherever a
    message, an argument or a traceback carries one: the last guard for the manager's log."""

    def __init__(self, fmt: str | None = None, secrets: set[str] | frozenset[str] = frozenset()) -> None:
        super().__init__(fmt)
        self.secrets = sorted(secrets, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text
