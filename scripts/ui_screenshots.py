"""Screenshot the memory browser (``/ui``) of a seeded home.

    python scripts/ui_screenshots.py [--out docs] [--home H] [--dom LIST.html]

Seeds a memory home (the hashing embedder, a fixed clock) with notes of two companies,
``acme`` and ``globex`` (edits, an archive and a merge among them, so a note page has
history and provenance), serves it with uvicorn on a free loopback port (no API key: the
home is only reachable from this machine), and takes headless chromium screenshots into
``OUT``:

- ``ui-notes.png``: ``/ui?company_id=acme`` at 1280x900;
- ``ui-note.png``: the merged note's page at 1280x900;
- ``ui-phone.png``: ``/ui?company_id=acme`` at 390x844 (the stacked phone layout).

``--dom`` also writes chromium's ``--dump-dom`` of the list page. Prints a JSON summary
(paths, the seeded note ids per company). Needs ``chromium`` (``apt-get install -y
chromium``); no network beyond loopback.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from memory_pipelines import MemoryService
from memory_pipelines.apps.http import create_app, serving_in_thread
from memory_pipelines.clock import FakeClock
from memory_pipelines.embeddings import HashEmbedder

# the scripts' shared module, also when this file is loaded by path (tests)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from headless_chromium import run_chromium  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DESKTOP = "1280,900"
PHONE = "390,844"

#: (company, user, agent, type, text, importance) of the seeded notes, oldest first.
NOTES = [
    ("acme", None, "support-desk", "Context", "Acme's fiscal year starts on 1 April.", 0.62),
    ("acme", "maria", "support-desk", "Preference", "Maria prefers replies in French.", 0.81),
    ("acme", None, "support-desk", "Constraint", "Never schedule calls before 10:00 CET.", 0.77),
    ("acme", None, "support-desk", "Issue", "Invoice export fails for PDFs over 10 MB.", 0.55),
    ("acme", "maria", "travel-planner", "Preference", "Maria likes aisle seats.", 0.48),
    ("acme", "maria", "travel-planner", "Preference", "Maria prefers an aisle seat on long flights.", 0.52),
    ("acme", None, "code-helper", "Context", "The billing service is written in Go.", 0.40),
    ("globex", "hank", "support-desk", "Preference", "Hank wants answers as bullet points.", 0.70),
    ("globex", None, "support-desk", "Context", "Globex's launch date is confidential.", 0.90),
]


def seed(svc: MemoryService, clock: FakeClock) -> dict[str, list[str]]:
    """The notes of :data:`NOTES`, then a few analyst changes; the note ids per company
    and ``merged`` (the note whose page is shown)."""
    ids: dict[str, list[str]] = {"acme": [], "globex": []}
    made = []
    for company, user, agent, kind, text, importance in NOTES:
        clock.advance(minutes=7)
        note = svc.add_note(
            text,
            type=kind,
            agent_id=agent,
            user_id=user,
            company_id=company,
            importance_score=importance,
            source_run_id=f"run-{len(made) + 1:03d}",
            source_conversation_id=f"conv-{company}-{len(made) % 3 + 1}",
        )
        ids[company].append(note.id)
        made.append(note)
    clock.advance(hours=2)
    svc.update_note(made[2].id, note="Never schedule calls before 10:00 CET or on Fridays.")
    clock.advance(minutes=5)
    svc.archive_note(made[3].id)
    # two seat preferences merged into one, as consolidation would
    clock.advance(hours=20)
    sources = [made[4], made[5]]
    merged = svc.add_note(
        "Maria prefers aisle seats, especially on long flights.",
        agent_id="travel-planner",
        user_id="maria",
        company_id="acme",
        importance_score=0.66,
        access_count=4,
        derived_from_note_ids=[n.id for n in sources],
        consolidation_count=2,
        source_run_id="run-cycle-7",
    )
    ids["acme"].append(merged.id)
    svc.update_notes(
        [(n, {"status": "Archived", "consolidated_into_note_id": merged.id}) for n in sources]
    )
    clock.advance(hours=3)
    svc.update_note(merged.id, protection_tier="Protected")
    ids["merged"] = [merged.id]
    return ids


def chromium(url: str, *args: str, size: str = DESKTOP) -> subprocess.CompletedProcess:
    """Chromium on ``url`` at ``size``, one CSS pixel per pixel."""
    return run_chromium(url, "--force-device-scale-factor=1", *args, size=size)


def capture(url: str, out: Path, merged_id: str, dom: Path | None) -> dict[str, str]:
    """The three screenshots (and the list page's DOM) of the browser at ``url``."""
    out.mkdir(parents=True, exist_ok=True)
    shots = {
        "ui-notes.png": ("/ui?company_id=acme", DESKTOP),
        "ui-note.png": (f"/ui/notes/{merged_id}", DESKTOP),
        "ui-phone.png": ("/ui?company_id=acme", PHONE),
    }
    written: dict[str, str] = {}
    for name, (path, size) in shots.items():
        target = (out / name).resolve()
        chromium(url + path, f"--screenshot={target}", size=size)
        if not target.exists():
            raise RuntimeError(f"chromium did not write {target}")
        written[name] = str(target)
    if dom is not None:
        proc = chromium(url + "/ui?company_id=acme", "--dump-dom")
        dom.write_text(proc.stdout, encoding="utf-8")
        written["dom"] = str(dom)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder of the PNGs")
    parser.add_argument("--home", type=Path, default=None, help="memory home (default: a temp dir)")
    parser.add_argument("--dom", type=Path, default=None, help="write the list page's DOM here")
    args = parser.parse_args(argv)
    clock = FakeClock(datetime(2026, 6, 1, 9, 0, tzinfo=UTC))
    with tempfile.TemporaryDirectory() as tmp:
        home = args.home or Path(tmp) / "home"
        with MemoryService.open(home, embedder=HashEmbedder(dim=64), clock=clock) as svc:
            ids = seed(svc, clock)
            app = create_app(svc, write_queue=False)
            with serving_in_thread(app) as url:
                written = capture(url, args.out, ids["merged"][0], args.dom)
    print(json.dumps({"written": written, "notes": ids}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
