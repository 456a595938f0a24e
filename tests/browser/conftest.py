"""Real headless Chromium (Debian's package) driven by Playwright, against
pytest-django's live server. scripts/test.sh installs chromium when missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
LAPTOP = {"width": 1366, "height": 900}
TABLET = {"width": 768, "height": 1024}


@pytest.fixture
def browser(live_server, transactional_db, monkeypatch):
    """One Chromium per test, started after the database is ready and closed
    before it is flushed: Playwright's sync API runs an event loop in this
    thread, and Django refuses ORM work beside a running loop unless told
    otherwise, which is said only for as long as the loop runs."""
    if not shutil.which(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install -y chromium` (scripts/test.sh does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def new_page(browser, live_server):
    """Opens a fresh browser context (its own cookies) per person."""
    contexts = []

    def open_page(viewport=LAPTOP):
        context = browser.new_context(viewport=viewport, base_url=live_server.url)
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


@pytest.fixture(scope="session")
def screenshot():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def save(page, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save
