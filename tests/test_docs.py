"""The documentation site: it builds strictly and offline, every page is in the navigation,
the generated references match the code, and the words stay the project's own.

``mkdocs build --strict`` fails on any broken link, anchor or missing page; the build runs
in the slow suite (CI runs it). The other checks read the sources and are fast.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HAS_MKDOCS = all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings"))

#: words that belong to the project's internal notes, not to its documentation
FORBIDDEN = re.compile(
    r"CONTRACT|§|reference notes|reference implementation|\bissue \d+|"
    r"\b20\d\d-\d\d-\d\d \((?:night|evening|afternoon|morning|later)",
    re.IGNORECASE,
)


#: quoted ``MEMORY_*`` names in the package that are not environment variables
NOT_SETTINGS = {"MEMORY_TOOL", "MEMORY_TOOL_SPEC", "MEMORY_POLICY"}


class _Loader(yaml.SafeLoader):
    """Reads mkdocs.yml, keeping ``!!python/name:`` tags as plain strings."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: suffix)


def mkdocs_config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)  # noqa: S506 - safe loader


def nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def doc_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def user_texts() -> list[Path]:
    return [ROOT / "README.md", *doc_pages()]


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = nav_pages(mkdocs_config()["nav"])
    assert len(nav) == len(set(nav)), "a page is listed twice"
    for page in nav:
        assert (DOCS / page).is_file(), f"mkdocs.yml lists {page}, which does not exist"
    listed = {DOCS / p for p in nav}
    missing = [str(p.relative_to(DOCS)) for p in doc_pages() if p not in listed]
    assert not missing, f"pages not in the nav of mkdocs.yml: {missing}"


def test_the_site_builds_offline():
    """No Google fonts or social cards (both fetch from the network)."""
    config = mkdocs_config()
    assert config["theme"]["font"] is False
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]]
    assert "social" not in plugins


def test_no_internal_words_in_the_readme_and_docs():
    for path in user_texts():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = FORBIDDEN.search(line)
            assert not m, f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r} in {line.strip()!r}"


def test_not_met_only_in_benchmark_tables():
    """A target that is not met is a benchmark table's status, never prose."""
    for path in user_texts():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "not met" in line.lower():
                assert line.lstrip().startswith("|"), f"{path.relative_to(ROOT)}:{n}: {line.strip()!r}"


def test_the_configuration_page_lists_every_setting():
    """Every ``MEMORY_*`` variable the package reads, and every input limit."""
    from memory_pipelines.limits import Limits

    page = (DOCS / "reference" / "configuration.md").read_text()
    documented = set(re.findall(r"`(MEMORY_[A-Z0-9_]+)`", page))
    read = set()
    for path in (ROOT / "memory_pipelines").rglob("*.py"):
        read |= set(re.findall(r"[\"'](MEMORY_[A-Z0-9_]+)[\"']", path.read_text()))
    read -= NOT_SETTINGS
    read |= {f"MEMORY_{f.name.upper()}" for f in fields(Limits)}
    assert read, "found no setting in the code: the pattern above is stale"
    assert not read - documented, f"settings missing from docs/reference/configuration.md: {sorted(read - documented)}"


def test_the_readme_is_a_landing_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 260
    assert "pip install memory-pipelines" in text
    for sacred in ("make run", "make test"):
        assert sacred in text
    for guide in ("guides/python.md", "guides/proxy.md", "guides/mcp.md"):
        if (DOCS / guide).exists():
            assert guide in text, f"the README's quick starts should link {guide}"


def test_the_readme_links_resolve():
    """Every relative link of the README names a file of the checkout (GitHub renders them)."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(targets) >= 10
    for target in targets:
        if not re.match(r"[a-z]+:", target):
            assert (ROOT / target).exists(), f"README.md links {target}, which does not exist"


@pytest.mark.slow  # about 15 s: imports the package and every benchmark module, renders every page
@pytest.mark.skipif(not HAS_MKDOCS, reason="mkdocs-material and mkdocstrings (the docs extra) are not installed")
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path), "NO_MKDOCS_2_WARNING": "1",
             "LITELLM_LOCAL_MODEL_COST_MAP": "True", "DAGSTER_DISABLE_TELEMETRY": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    html = {p: p.read_text() for p in site.rglob("*.html")}
    for path, text in html.items():
        assert "fonts.googleapis.com" not in text, path
        visible = re.sub(r"<[^>]+>", " ", text)
        m = FORBIDDEN.search(visible)
        assert not m, f"{path.relative_to(site)}: {m.group(0)!r}"

    # the command-line reference holds every command and benchmark, from their parsers
    from memory_pipelines.apps import cli

    cli_page = (site / "reference" / "cli.html").read_text()
    for name in [*cli.COMMANDS, *(f"bench {b}" for b in cli.BENCHMARKS)]:
        assert f"usage: memory-pipelines {name}" in cli_page, name
    assert "usage: memory-pipelines keys create" in cli_page
    assert "serve info" not in cli_page, "an option's choices were taken for sub-actions"
    assert str(Path.home()) not in cli_page, "the page holds the building machine's home folder"

    # the HTTP reference holds every operation of both servers' OpenAPI schemas
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    http_page = (site / "reference" / "http.html").read_text()
    for proxy in (False, True):
        for path, ops in hook._openapi(proxy)["paths"].items():
            for method in ops:
                assert f"{method.upper()} {path}" in http_page, (method, path)

    # the Python API reference is rendered from the docstrings
    python_page = (site / "reference" / "python.html").read_text()
    assert "memory_pipelines.MemoryService" in python_page and "inject" in python_page
    assert not re.search(r":(?:class|meth|func|mod|data):<code>", python_page), "a Sphinx role left as text"


@pytest.mark.slow  # about a minute: dagster-webserver and headless Chromium
@pytest.mark.skipif(
    not any(shutil.which(c) for c in ("chromium", "chromium-browser", "google-chrome")),
    reason="chromium is not installed (apt-get install -y chromium)",
)
def test_the_dagster_screenshots_are_regenerated_by_the_script(tmp_path):
    """scripts/screenshots.py serves the definitions and captures the rendered asset graphs."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "screenshots.py"), "--out", str(tmp_path), "--only", "dagster"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for name in ("dagster-assets.png", "dagster-lineage.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", data[16:24]) == (1600, 900)
        assert (DOCS / name).is_file(), f"docs/{name} is not checked in"
    for page in ("README.md", "docs/index.md"):
        text = (ROOT / page).read_text()
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text):
            assert (ROOT / Path(page).parent / image).is_file(), (page, image)
