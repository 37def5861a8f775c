"""Headless Chromium for the browser tests and `bench/html_load.py`: Debian's `chromium` and
`chromedriver`, driven by Selenium with explicit paths, so Selenium Manager never downloads
anything. `chromium_missing()` says why the browser tests must skip (None when they can run).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage", "--window-size=1400,1000")


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not binary.exists():
            return f"{binary} is absent (scripts/setup.sh installs chromium and its driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A fresh headless Chromium (own profile folder) with its browser log captured."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="fxlens-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_ready(driver: Any, timeout_s: float = 20.0) -> float:
    """Wait until the page's script has run; its `performance.now()` then, in ms."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout_s).until(
        lambda d: d.execute_script("return window.fxlensReady !== undefined"))
    return float(driver.execute_script("return window.fxlensReady"))


def console_errors(driver: Any) -> list[str]:
    """Browser log entries at SEVERE level (uncaught errors, failed loads, console.error)."""
    return [entry["message"] for entry in driver.get_log("browser")
            if entry.get("level") == "SEVERE"]
