"""Looking at an HTML page as a user would: the system's Chromium, headless, driven by playwright (no browser
download: CI installs Debian's chromium)."""

import shutil
import time
from pathlib import Path

import pytest

# Without the background-networking flags Chromium keeps trying hosts this closed network refuses.
FLAGS = [
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium; CI installs it)")
    return path


def look(page_path: Path, screenshot: Path, width: int = 1100) -> dict:
    """Open the page offline; every image's state, the requests it made that were not inline, a full-page
    screenshot."""
    playwright = pytest.importorskip("playwright.sync_api")
    outside = []
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium(), args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(("data:", "file:")) else None)
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            images = page.eval_on_selector_all(
                "img",
                "els => els.map(e => ({alt: e.alt, width: e.naturalWidth, height: e.naturalHeight, "
                "complete: e.complete, shown: e.getBoundingClientRect().width}))",
            )
            title = page.title()
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return {"images": images, "outside": outside, "title": title}


def ink(screenshot: Path) -> tuple[float, int]:
    """(share of pixels that are not white, distinct colours): a blank page is (0, 1)."""
    from PIL import Image

    with Image.open(screenshot) as image:
        grey = image.convert("L").histogram()
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    return sum(grey[:240]) / sum(grey), len(colours) if colours else 1 << 20


def until(condition, seconds: float = 60, what: str = "the condition"):
    """condition()'s first truthy value, asked every 0.2 s; fails the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {seconds} s: {what}")
