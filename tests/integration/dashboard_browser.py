"""A real browser for the dashboard tests: Debian's chromium driven by Playwright.

Playwright's own browser download is never used (``executable_path`` is the system's
``chromium``, which ``make system-deps`` installs as root). Each page records its console
errors and uncaught exceptions so a test can assert there were none.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.tools import needs_tool

VIEWPORT = {"width": 1280, "height": 800}


def why_no_browser() -> str | None:
    """Why the browser tests cannot run here, or None if they can."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (it is in the dev extra: pip install -e '.[dev]')"
    if shutil.which("chromium") is None:
        return ("no chromium on PATH (make system-deps installs it as root: "
                "apt-get install -y chromium)")
    for name in ("starlette", "uvicorn"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed: the dashboard needs pyrula[http]"
    return None


def skip_without_browser() -> None:
    needs_tool("chromium (dashboard browser tests)", why_no_browser())


class Watched:
    """A page and the errors it reported."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def shot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))
        return path


@contextmanager
def browser_page() -> Iterator[Watched]:
    """One page of a fresh headless chromium at 1280x800."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium"), headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
            page = context.new_page()
            page.set_default_timeout(20000)
            yield Watched(page)
        finally:
            browser.close()
