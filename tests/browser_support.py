"""Open a local HTML file in Debian's headless Chromium (driven by its ChromeDriver through
Selenium) and read back what a user would see: the rendered tables, whether every image
decoded, and the browser console's errors. Skips when Chromium, ChromeDriver or Selenium is
missing (a failure under CI, see ``tests/require_services.py``); ``scripts/test.sh`` installs
them.

Chromium runs with the flags that keep it off this machine's closed network (no background
networking, component updates or sync) and a fresh profile directory.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@dataclass
class Page:
    title: str
    tables: list[list[list[str]]]  # every table: its rows (header row included), cell texts
    headings: list[str]
    images: int
    images_decoded: int
    console_errors: list[str]


def open_page(path: Path) -> Page:
    """Render ``path`` in headless Chromium and read it back (see the module docstring)."""
    webdriver = pytest.importorskip("selenium.webdriver",
                                    reason="selenium is not installed (pip install -e .[dev])")
    from selenium.webdriver.common.by import By

    chromium = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    driver_bin = shutil.which("chromedriver") or (CHROMEDRIVER if Path(CHROMEDRIVER).exists() else None)
    if chromium is None or driver_bin is None:
        pytest.skip("chromium and chromium-driver (Debian) are not installed; scripts/test.sh installs them")
    with tempfile.TemporaryDirectory(prefix="fedsched-chromium-") as profile:
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", f"--user-data-dir={profile}"):
            opts.add_argument(flag)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_bin), options=opts)
        try:
            driver.get(path.resolve().as_uri())
            tables = [[[c.text for c in row.find_elements(By.CSS_SELECTOR, "th,td")]
                       for row in t.find_elements(By.TAG_NAME, "tr")]
                      for t in driver.find_elements(By.TAG_NAME, "table")]
            headings = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "h1,h2,h3")]
            images = driver.find_elements(By.TAG_NAME, "img")
            decoded = sum(1 for i in images if driver.execute_script(
                "return arguments[0].complete && arguments[0].naturalWidth > 0", i))
            errors = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
            return Page(driver.title, tables, headings, len(images), decoded, errors)
        finally:
            driver.quit()
