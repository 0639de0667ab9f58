"""The shell and Python examples of the README and the documentation run as written.

Every ```python and ```bash block of README.md and of each page under docs/ runs in the
order the page shows it, in one temporary folder per page (so the examples' ``.memory``
and other homes are fresh), with the project's ``.venv/bin`` first on PATH: a later
example of a page may use what an earlier one stored, as a reader following the page
would. A block that cannot run here says why in a ``<!-- readme: not run: REASON -->`` (or
``<!-- docs: not run: REASON -->``) line right above it: the two `make` commands, which CI
runs on a fresh clone, a hosted model, a Dask cluster. The one substitution: port 8765
becomes a free port, so a server already listening there cannot break the suite. Some
pages also have their output checked (below). The runs are in the slow suite
(`make test-slow`, which CI runs); the marker check is fast.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from memory_pipelines.embeddings import model_available

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NOT_RUN = re.compile(r"<!--\s*(?:readme|docs):\s*not run:\s*(?P<reason>.+?)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\s*$")
RUNNABLE = ("python", "bash")


def pages() -> list[Path]:
    """README.md, then every page of the documentation site, in a fixed order."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
    return [README, *docs]


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    code: str
    skip_reason: str | None


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of a page with their language and any not-run reason."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if not m:
            i += 1
            continue
        start, lang = i, m.group("lang")
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        previous = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        reason = NOT_RUN.search(previous)
        indent = len(lines[start]) - len(lines[start].lstrip())
        body = [line[indent:] for line in lines[start + 1 : j]]
        blocks.append(Block(start + 1, lang, "\n".join(body) + "\n", reason and reason.group("reason")))
        i = j + 1
    return blocks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def example_env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env["DAGSTER_DISABLE_TELEMETRY"] = "1"
    env["PWD"] = str(workdir)
    return env


def run_block(block: Block, workdir: Path, port: int) -> subprocess.CompletedProcess[str]:
    code = block.code.replace("8765", str(port))
    if block.lang == "python":
        argv = [sys.executable, "-c", code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", code]
    return subprocess.run(
        argv, cwd=workdir, env=example_env(workdir), capture_output=True, text=True, timeout=600
    )


def run_page(path: Path, workdir: Path) -> dict[int, tuple[Block, str]]:
    """Run a page's runnable blocks in order; each block's line -> (block, stdout)."""
    port = free_port()
    outputs: dict[int, tuple[Block, str]] = {}
    for block in readme_blocks(path.read_text()):
        if block.lang not in RUNNABLE or block.skip_reason:
            continue
        proc = run_block(block, workdir, port)
        assert proc.returncode == 0, (
            f"{page_id(path)}: example at line {block.line} failed ({proc.returncode}):\n{block.code}\n"
            f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        )
        outputs[block.line] = (block, proc.stdout)
    return outputs


def output_of(outputs: dict[int, tuple[Block, str]], snippet: str) -> str:
    return next(out for block, out in outputs.values() if snippet in block.code)


#: what some pages' examples must print (a page's examples that only run are checked by exit code)
def check_readme(outputs: dict[int, tuple[Block, str]]) -> None:
    # the Python example's note survives its own Memory Manager cycle
    out = output_of(outputs, "MemoryService.open")
    after_cycle = out.split("'maintenanceRan': True", 1)[-1]
    assert "bar charts over pie charts" in after_cycle, out


def check_http_api(outputs: dict[int, tuple[Block, str]]) -> None:
    out = output_of(outputs, "/v1/memory-writes")
    assert '"disposition":"written"' in out.replace(" ", ""), out
    assert "User prefers bar charts." in out.split('"disposition"', 1)[1], out
    learnt = out.split('{"notes":', 1)[1]  # remember answers the notes it learnt
    assert "User is vegetarian." in learnt and "User prefers answers in metric units." in learnt, out


def check_managing_memory(outputs: dict[int, tuple[Block, str]]) -> None:
    assert "pie charts" in output_of(outputs, "memory-pipelines why --agent analyst")
    assert "bar charts" in output_of(outputs, "notes list")


def check_history(outputs: dict[int, tuple[Block, str]]) -> None:
    assert "['created', 'archived', 'restored']" in output_of(outputs, "restore_note")
    assert "imported" in output_of(outputs, "memory-pipelines import")


def check_proxy(outputs: dict[int, tuple[Block, str]]) -> None:
    # the offline demo model learns in one run and is told in the next
    out = output_of(outputs, "--model offline")
    assert "Noted: User prefers metric units." in out, out
    assert "From memory: User prefers metric units." in out, out


CHECKS = {
    "README.md": check_readme,
    "docs/guides/http-api.md": check_http_api,
    "docs/guides/managing-memory.md": check_managing_memory,
    "docs/guides/history.md": check_history,
    "docs/guides/proxy.md": check_proxy,
}


def test_every_block_is_run_or_says_why():
    total = 0
    for path in pages():
        for b in readme_blocks(path.read_text()):
            if b.lang in RUNNABLE:
                total += 1
                assert b.skip_reason is None or len(b.skip_reason) > 10, f"{page_id(path)} line {b.line}"
    assert total >= 10
    for name in CHECKS:
        assert (ROOT / name).is_file(), name


@pytest.mark.slow  # a page at a time: CLI processes, a server, MiniLM loads
@pytest.mark.skipif(not model_available(), reason="the examples use the offline MiniLM model")
@pytest.mark.parametrize("path", pages(), ids=page_id)
def test_the_examples_run_as_written(path, tmp_path):
    """The examples open homes with the default embedder (offline MiniLM; CI fetches it)."""
    outputs = run_page(path, tmp_path)
    check = CHECKS.get(page_id(path))
    if check is not None:
        check(outputs)


if __name__ == "__main__":  # pragma: no cover - list the blocks for a person
    for page in pages():
        for b in readme_blocks(page.read_text()):
            print(page_id(page), b.line, b.lang, b.skip_reason or ("run" if b.lang in RUNNABLE else "-"))
    pytest.main([__file__, "-q"])
