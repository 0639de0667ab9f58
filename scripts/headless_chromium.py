"""Headless chromium for the screenshot scripts (``ui_screenshots.py``, ``screenshot_ui.py``).

One place for the flags every capture uses (no sandbox, GPU, network chatter or first-run
pages; no scrollbars in the picture) and for running chromium with a throwaway profile.
Needs ``chromium`` (``apt-get install -y chromium``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError("chromium is not installed (apt-get install -y chromium)")


def run_chromium(url: str, *args: str, size: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Chromium with :data:`CHROMIUM_FLAGS`, a fresh profile, a ``size`` window
    (``"W,H"``) and ``args`` (``--screenshot=...``, ``--dump-dom`` ...) on ``url``;
    raises when it fails. Its output is decoded as text (bad bytes replaced)."""
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                chromium_binary(),
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={size}",
                *args,
                url,
            ],
            check=True,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
