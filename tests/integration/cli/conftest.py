"""A headless Chromium for the report pages' browser test, driven through Debian's chromedriver.

The browser is Debian's (`chromium`, `chromium-driver`): nothing else can be downloaded on the
project's machines, so Selenium is pointed at the packaged binaries and never fetches its own.
Like the real node's iptables (tools/k8sbin/build-node.sh), the packages are installed when
missing where the tests run as root (CI, the development machines); elsewhere the test fails
saying what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PACKAGES = ("chromium", "chromium-driver")


def _apt_install() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "install", "-y", "-q", *PACKAGES],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )


def ensure_chromium() -> None:
    """Install Debian's Chromium and its driver when either is missing (as root only)."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail(
            f"the browser test needs {CHROMIUM} and {CHROMEDRIVER}: as root, "
            f"`apt-get install -y {' '.join(PACKAGES)}`"
        )
    done = _apt_install()
    if done.returncode != 0:
        # A fresh machine has no package lists yet.
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, check=False, timeout=600)
        done = _apt_install()
    if done.returncode != 0 or not CHROMEDRIVER.exists():
        pytest.fail(f"apt-get install {' '.join(PACKAGES)} failed:\n{done.stderr[-2000:]}")


@pytest.fixture(scope="session")
def browser() -> Iterator[webdriver.Chrome]:
    ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        # As root (CI) Chromium refuses to start sandboxed.
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--window-size=1400,900",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()
