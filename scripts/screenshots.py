"""Regenerate every screenshot of the README and the documentation site.

    python scripts/screenshots.py [--out docs] [--only ui|dagster]

- ``ui-notes.png``, ``ui-note.png``, ``ui-phone.png``: the memory browser (``/ui``) of a
  seeded home of two companies (``scripts/ui_screenshots.py``);
- ``dagster-assets.png``: the Memory Manager's cycle (group ``memory_manager``: the sources it
  reads, extraction, hardening, the note table) and ``dagster-lineage.png``: the global asset
  lineage of every group, in the Dagster UI served by ``dagster-webserver`` over
  ``memory_pipelines.definitions`` on a free loopback port, with a throwaway Dagster
  instance (its first-visit dialog off) and memory home.

Captured by headless Chromium (Debian: ``apt-get install -y chromium``); nothing leaves
loopback. Prints a JSON summary of the files written.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

# the scripts' shared modules, also when this file is loaded by path (tests)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ui_screenshots  # noqa: E402
from headless_chromium import run_chromium  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GRAPH_SIZE = "1600,900"
#: milliseconds of page time Chromium gives the Dagster UI's JavaScript to lay out the graph
GRAPH_RENDER_MS = "20000"
LOCATION = "memory_pipelines.definitions"
#: file -> the Dagster UI page it shows
GRAPH_PAGES = {
    "dagster-assets.png": f"/locations/{LOCATION}/asset-groups/memory_manager/lineage",
    "dagster-lineage.png": "/asset-groups",
}
#: file -> words its page must show once rendered (else the capture is refused)
GRAPH_WORDS = {
    "dagster-assets.png": ("extracted_notes", "hardened_notes"),
    "dagster-lineage.png": ("memory_manager", "memory_maintenance"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until ``url`` answers 200 (the webserver has loaded the code location)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dagster-webserver exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback only
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"dagster-webserver did not answer {url} within {timeout:.0f} s")


def dagster_graph(out: Path) -> dict[str, str]:
    """The Memory Manager's asset graphs (:data:`GRAPH_PAGES`), from a webserver on loopback."""
    port = free_port()
    webserver = Path(sys.executable).parent / "dagster-webserver"
    written: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(Path(tmp) / "dagster"),
            "MEMORY_HOME": str(Path(tmp) / "memory"),
            "DAGSTER_DISABLE_TELEMETRY": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        Path(env["DAGSTER_HOME"]).mkdir()
        # no "join the community" dialog over the graph, no telemetry
        (Path(env["DAGSTER_HOME"]) / "dagster.yaml").write_text(
            "nux:\n  enabled: false\ntelemetry:\n  enabled: false\n"
        )
        proc = subprocess.Popen(
            [str(webserver), "-m", LOCATION, "-h", "127.0.0.1", "-p", str(port)],
            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for(f"{base}/server_info", proc)
            for name, page in GRAPH_PAGES.items():
                target = (out / name).resolve()
                run_chromium(
                    base + page, "--force-device-scale-factor=1",
                    f"--virtual-time-budget={GRAPH_RENDER_MS}", f"--screenshot={target}", size=GRAPH_SIZE,
                )
                if not target.exists():
                    raise RuntimeError(f"chromium did not write {target}")
                dom = run_chromium(
                    base + page, f"--virtual-time-budget={GRAPH_RENDER_MS}", "--dump-dom", size=GRAPH_SIZE
                ).stdout
                missing = [w for w in GRAPH_WORDS[name] if w not in dom]
                if missing:
                    raise RuntimeError(f"the Dagster UI page {page} rendered without {missing}")
                written[name] = str(target)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder of the PNGs")
    parser.add_argument("--only", choices=("ui", "dagster"), default=None, help="one set only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    if args.only in (None, "ui"):
        ui_screenshots.main(["--out", str(args.out)])
        written.update({name: str(args.out / name) for name in ("ui-notes.png", "ui-note.png", "ui-phone.png")})
    if args.only in (None, "dagster"):
        written.update(dagster_graph(args.out))
    print(json.dumps({"written": written}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
