"""The README's shell and Python examples run as written, in order, on one home.

Every ```python and ```bash block of README.md runs in one temporary folder (so the
examples' ``.memory`` and ``H`` homes are fresh), in the order the README shows them, with
the project's ``.venv/bin`` first on PATH: a later example may use what an earlier one
stored, as a reader following the README would. A block that cannot run here says why in
a ``<!-- readme: not run: REASON -->`` line right above it (the two `make` commands, which
CI runs on a fresh clone, a hosted model, a Dask cluster). The one substitution: the HTTP
example's port 8765 becomes a free port, so a server already listening there cannot
break the suite. Some blocks also have their output checked (below). The run is in the slow
suite (`make test-slow`, which CI runs); the marker check is fast.
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

README = Path(__file__).resolve().parents[1] / "README.md"
NOT_RUN = re.compile(r"<!--\s*readme:\s*not run:\s*(?P<reason>.+?)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\s*$")


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    code: str
    skip_reason: str | None


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of the README with their language and any not-run reason."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group("lang")
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        previous = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        reason = NOT_RUN.search(previous)
        blocks.append(
            Block(start + 1, lang, "\n".join(lines[start + 1 : j]) + "\n", reason and reason.group("reason"))
        )
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


def test_every_block_is_run_or_says_why():
    blocks = [b for b in readme_blocks(README.read_text()) if b.lang in ("python", "bash")]
    assert len(blocks) >= 5
    for b in blocks:
        assert b.skip_reason is None or len(b.skip_reason) > 10, f"README line {b.line}"


@pytest.mark.slow  # about 90 s: a dozen CLI processes, a server, MiniLM loads
@pytest.mark.skipif(not model_available(), reason="the examples use the offline MiniLM model")
def test_the_readme_examples_run_as_written(tmp_path):
    """The examples open homes with the default embedder (offline MiniLM; CI fetches it)."""
    port = free_port()
    outputs: dict[int, str] = {}
    ran = 0
    for block in readme_blocks(README.read_text()):
        if block.lang not in ("python", "bash") or block.skip_reason:
            continue
        proc = run_block(block, tmp_path, port)
        assert proc.returncode == 0, (
            f"README example at line {block.line} failed ({proc.returncode}):\n{block.code}\n"
            f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        )
        outputs[block.line] = proc.stdout
        ran += 1
    assert ran >= 4
    text = "\n".join(outputs.values())
    # the Python example's note survives its own Memory Manager cycle
    python_out = next(o for line, o in outputs.items() if "MemoryService.open" in _code_at(line))
    after_cycle = python_out.split("'maintenanceRan': True", 1)[-1]
    assert "bar charts over pie charts" in after_cycle, python_out
    # the curl example wrote and injected; `why` found the note
    assert '"disposition"' in text and "User prefers bar charts." in text
    assert "pie charts" in outputs[_line_of("memory-pipelines why --agent analyst")]


def _code_at(line: int) -> str:
    return next(b.code for b in readme_blocks(README.read_text()) if b.line == line)


def _line_of(snippet: str) -> int:
    return next(b.line for b in readme_blocks(README.read_text()) if snippet in b.code)


if __name__ == "__main__":  # pragma: no cover - list the blocks for a person
    for b in readme_blocks(README.read_text()):
        print(b.line, b.lang, b.skip_reason or "run")
    pytest.main([__file__, "-q"])
