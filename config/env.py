"""Reads configuration from the environment, the 12-factor way.

Every secret may instead come from a file named by `<NAME>_FILE` (Docker and
Kubernetes secrets). A bad value stops start-up with a message naming the
variable, instead of failing later on the first request.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from urllib.parse import urlparse

import environ
from django.core.exceptions import ImproperlyConfigured

env = environ.Env()


class RenamedSettingWarning(FutureWarning):
    """An old name of a setting was read; it still works, for now.
    FutureWarning, not DeprecationWarning: Python shows it to operators by default."""


def accept_renamed(renames: dict[str, str]) -> list[str]:
    """Lets an operator's old variable names keep working after a rename: each old
    name set is copied to its new name, with a warning at start-up. Both set to
    different values stops start-up (which one was meant?). Returns the old names
    that were set."""
    used = []
    for old, new in renames.items():
        if old not in os.environ:
            continue
        used.append(old)
        if new in os.environ and os.environ[new] != os.environ[old]:
            raise ImproperlyConfigured(
                f"{old} is the old name of {new}, and both are set to different values: "
                f"keep {new} only."
            )
        os.environ[new] = os.environ[old]
        warnings.warn(
            f"{old} is renamed {new}: set {new} instead (the old name will stop working).",
            RenamedSettingWarning,
            stacklevel=2,
        )
    return used


class FixedSettingWarning(FutureWarning):
    """A variable that is no longer read was set: its setting is a constant now.
    FutureWarning, like RenamedSettingWarning, so that operators see it."""


def warn_fixed(fixed: dict[str, str]) -> list[str]:
    """Tells an operator at start-up that a variable they set is ignored: each
    name maps to what the setting is now and why. Reads nothing, changes nothing;
    returns the names that were set."""
    used = [name for name in fixed if name in os.environ]
    for name in used:
        warnings.warn(f"{name} is no longer read: {fixed[name]}", FixedSettingWarning, stacklevel=2)
    return used


def secret(name: str, default: str | None = None) -> str | None:
    file_var = f"{name}_FILE"
    if file_var in os.environ:
        path = Path(os.environ[file_var])
        try:
            return path.read_text().strip()
        except OSError as error:
            raise ImproperlyConfigured(
                f"{file_var}: cannot read {path}: {error.strerror}"
            ) from None
    return os.environ.get(name, default)


PEER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def peers(name: str) -> dict[str, tuple[tuple[str, str], ...]]:
    """`deployment=door@host:port;door@host:port,...`: each deployment's doors,
    by their fixed names, and where each talks to the others. Two doors at
    least, each name once."""
    found = {}
    for deployment, value in env.dict(name, default={}).items():
        doors = []
        for entry in value.split(";"):
            door, _, address = entry.strip().partition("@")
            host, _, port = address.rpartition(":")
            if not PEER_NAME.match(door) or not host or not port.isdigit():
                raise ImproperlyConfigured(
                    f"{name}: {entry!r} of {deployment} is not name@host:port "
                    "(a name of letters, digits, '.', '_' and '-')"
                )
            doors.append((door, address))
        names = [door for door, _ in doors]
        if len(doors) < 2 or len(set(names)) != len(names):
            raise ImproperlyConfigured(
                f"{name}: {deployment} needs two doors or more, each named once, got {names}"
            )
        found[deployment] = tuple(doors)
    return found


def integer(name: str, default: int, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def number(name: str, default: float, minimum: float = 0.0, maximum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise ImproperlyConfigured(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def boolean(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {raw!r}")


def choice(name: str, default: str, choices: set[str]) -> str:
    value = os.environ.get(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def database(default_sqlite_path: Path) -> dict:
    url = secret("DATABASE_URL") or f"sqlite:///{default_sqlite_path}"
    scheme = urlparse(url).scheme
    if scheme not in {"sqlite", "postgres", "postgresql", "pgsql"}:
        raise ImproperlyConfigured(
            f"DATABASE_URL must be a sqlite:// or postgres:// URL, got scheme {scheme!r}"
        )
    try:
        config = env.db_url_config(url)
    except Exception as error:  # django-environ raises several types for bad URLs
        raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {error}") from None
    if scheme == "sqlite":
        # Concurrent web + worker processes on the embedded default.
        config.setdefault("OPTIONS", {})["timeout"] = 20
    else:
        config["CONN_MAX_AGE"] = integer("DATABASE_CONN_MAX_AGE", 60, minimum=0)
    return config


def url_with_scheme(name: str, default: str, schemes: set[str]) -> str:
    value = secret(name) or default
    scheme = urlparse(value).scheme
    if scheme not in schemes:
        raise ImproperlyConfigured(
            f"{name} must use one of the schemes {sorted(schemes)}, got {scheme or 'none'!r}"
        )
    return value
