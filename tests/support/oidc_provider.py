"""A real OpenID Provider on loopback: npm's certified `oidc-provider`
(tests/support/oidc/provider.mjs) run with the machine's Node.js.

Its npm dependencies are installed once per checkout and lockfile (`npm ci`
into tests/support/oidc/node_modules). People and their groups live in a JSON
file the provider re-reads at every use, so a test changes someone's groups at
the provider, or the lifetime of the tokens it issues, between two sign-ins:

    provider.put_account("u-ada", username="ada", password="...", groups=["legal-team"])
    provider.set_ttl(IdToken=2)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

from tests.support.process_start import NotStarted, wait_until_started
from tests.support.s3_server import free_port

PROVIDER_DIR = Path(__file__).resolve().parent / "oidc"
CLIENT_ID = "lora-registry"
CLIENT_SECRET = "test-client-secret-" + "x" * 16


def node_available() -> str | None:
    """None when Node.js (>= 20) and npm are here, else why not."""
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            return f"{tool} is missing (scripts/test.sh installs Debian's nodejs and npm)"
    version = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30)
    major = int(version.stdout.strip().lstrip("v").split(".")[0] or 0)
    if major < 20:
        return f"oidc-provider 9 needs Node.js 20 or later, this is {version.stdout.strip()}"
    return None


def install_dependencies() -> None:
    """`npm ci` when node_modules is missing or older than the lockfile.

    Under an exclusive file lock: the light tiers run on two pytest-xdist
    workers, and two `npm ci` in one folder delete each other's files."""
    lock = PROVIDER_DIR / "package-lock.json"
    stamp = PROVIDER_DIR / "node_modules" / ".lock-sha256"
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    with open(PROVIDER_DIR / ".npm-ci.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if stamp.is_file() and stamp.read_text() == digest:
            return
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=PROVIDER_DIR,
            check=True,
            timeout=300,
        )
        stamp.write_text(digest)


class OidcProvider:
    def __init__(self, workdir: Path, rp_urls: list[str]):
        self.workdir = workdir
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.directory_path = workdir / "directory.json"
        self.log_path = workdir / "provider.log"
        self.rp_urls = rp_urls
        self._directory: dict = {"accounts": {}, "ttl": {}}
        self._lock = threading.Lock()
        self.proc: subprocess.Popen | None = None

    # --- the account store -------------------------------------------------
    def _write(self) -> None:
        tmp = self.directory_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._directory))
        os.replace(tmp, self.directory_path)  # the provider never reads half a file

    def put_account(
        self, sub: str, *, username: str, password: str, groups: list[str], email=None, oid=None
    ):
        """`oid`: an immutable object id claim besides `sub` (as Entra ID sends)."""
        with self._lock:
            self._directory["accounts"][sub] = {
                "username": username,
                "password": password,
                "email": email or f"{username}@example.org",
                "groups": list(groups),
                **({"oid": oid} if oid else {}),
            }
            self._write()

    def set_groups(self, sub: str, groups: list[str]) -> None:
        with self._lock:
            self._directory["accounts"][sub]["groups"] = list(groups)
            self._write()

    def remove_account(self, sub: str) -> None:
        """The person leaves: the provider no longer knows them (its refresh
        tokens for them are then refused with invalid_grant)."""
        with self._lock:
            self._directory["accounts"].pop(sub, None)
            self._write()

    def set_ttl(self, **seconds: int) -> None:
        """IdToken=…, AccessToken=… for tokens issued from now on; no argument resets
        (the clock too)."""
        with self._lock:
            self._directory["ttl"] = seconds
            self._directory["clock_offset_seconds"] = 0
            self._write()

    def set_clock_offset(self, seconds: int) -> None:
        """Sets the provider's clock off by this much (negative: behind)."""
        with self._lock:
            self._directory["clock_offset_seconds"] = seconds
            self._write()

    # --- the process --------------------------------------------------------
    def start(self, cpu_seconds: float = 30, wall_seconds: float = 900) -> None:
        # Node starts in about a second of its own CPU, which the niced light
        # run can wait minutes for (tests/support/process_start.py).
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write()
        env = {
            **os.environ,
            "OIDC_TEST_PORT": str(self.port),
            "OIDC_TEST_DIRECTORY": str(self.directory_path),
            "OIDC_TEST_CLIENT_ID": CLIENT_ID,
            "OIDC_TEST_CLIENT_SECRET": CLIENT_SECRET,
            "OIDC_TEST_REDIRECT_URIS": ",".join(f"{url}/oidc/callback/" for url in self.rp_urls),
            "OIDC_TEST_POST_LOGOUT_URIS": ",".join(f"{url}/login/" for url in self.rp_urls),
        }
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            ["node", str(PROVIDER_DIR / "provider.mjs")],
            cwd=PROVIDER_DIR,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until_started(
                self.proc,
                lambda: f"listening {self.issuer}" in self.log_path.read_text(),
                what="the OpenID provider",
                log=self.log_path,
                cpu_seconds=cpu_seconds,
                wall_seconds=wall_seconds,
            )
        except NotStarted:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            if self.proc.poll() is None:
                self.proc.kill()
        self.proc = None
