"""The registry's web process as production runs it (gunicorn, config.wsgi) in
a subprocess of its own, on a free port, over a migrated SQLite database.

    with registry_web_server(tmp_path, setup=SCRIPT) as (url, setup_output):
        ...

`setup` is Python run with `manage.py shell -c` before the server starts;
whatever it prints comes back as `setup_output`.

`server="runserver"` starts Django's development server instead, as `make run`
does (scripts/run.sh: `manage.py runserver --noreload`, DJANGO_DEBUG=false).

One worker process. `threads` > 1 makes it gunicorn's threaded worker
(gthread): requests are answered side by side in that one process, sharing its
GIL, so a request that holds the GIL (a runaway regex) would freeze the others,
which is what a test of "the web process keeps answering" needs to see.
Production's several sync workers would hide it behind another process.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import requests

from tests.support.process_start import wait_until_started
from tests.support.s3_server import free_port

ROOT = Path(__file__).resolve().parents[2]


def _environment(tmp_path: Path, extra: dict[str, str]) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "DJANGO_"))},
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DJANGO_SECRET_KEY": "test-only-" + uuid.uuid4().hex,
        "VAR_DIR": str(tmp_path / "var"),
        "LOG_LEVEL": "WARNING",
        "NO_PROXY": "127.0.0.1,localhost",
        # Production settings redirect to https; this server speaks plain http.
        "DJANGO_SECURE_SSL_REDIRECT": "false",
        "DJANGO_SECURE_COOKIES": "false",
        **extra,
    }


@contextlib.contextmanager
def registry_web_server(
    tmp_path: Path,
    setup: str = "",
    env: dict[str, str] | None = None,
    threads: int = 1,
    server: str = "gunicorn",
):
    if server == "runserver":
        env = {"DJANGO_DEBUG": "false", **(env or {})}
    environment = _environment(tmp_path, env or {})

    def manage(*args):
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            # Migrating a fresh SQLite is ~10 s alone, but the light run is
            # niced beside the heavy one and once took over 120 s (CI).
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    manage("migrate", "--noinput", "-v0")
    setup_output = manage("shell", "-c", setup) if setup else ""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if server == "runserver":
        command = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"]
    else:
        command = [
            str(Path(sys.executable).with_name("gunicorn")),
            "config.wsgi:application",
            f"--bind=127.0.0.1:{port}",
            "--workers=1",
            f"--threads={threads}",
        ]
    log_path = tmp_path / f"{server}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            session = requests.Session()
            session.trust_env = False

            def live() -> bool:
                try:
                    return session.get(f"{url}/livez", timeout=2).status_code == 200
                except requests.RequestException:
                    return False

            wait_until_started(proc, live, what=server, log=log_path, poll_seconds=0.2)
            yield url, setup_output
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                # Gunicorn's graceful stop waits for its worker; in the niced
                # light run beside the heavy one it once took over 10 s (CI).
                # The tests here are about what the server answers, not how
                # fast it stops: it is killed rather than left behind.
                proc.kill()
                proc.wait(timeout=10)
