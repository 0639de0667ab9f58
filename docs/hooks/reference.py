"""MkDocs hook: the command-line and HTTP reference pages, generated from the code.

A page holding ``<!-- generated: cli -->`` gets every ``memory-pipelines`` command's
``--help`` (and each sub-action's, and each benchmark's), rendered from the parsers
that the command line itself uses; ``<!-- generated: http -->`` and
``<!-- generated: proxy-http -->`` get every operation of the HTTP API's and the chat
proxy's OpenAPI schemas. The pages cannot drift from the code: they are rebuilt from
it on every ``mkdocs build`` (``tests/test_docs.py`` checks what they list). Sphinx
roles left in rendered docstrings (``:class:`~a.b.C```) are shown as the plain name.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

MARKERS = {
    "<!-- generated: cli -->": "cli_markdown",
    "<!-- generated: http -->": "http_markdown",
    "<!-- generated: proxy-http -->": "proxy_http_markdown",
}
WIDTH = "80"  # argparse wraps help text to $COLUMNS: fixed, so the page is the same everywhere


def _help(command: Callable[[list[str]], int], argv: list[str]) -> str:
    """What ``command(argv + ['--help'])`` prints (argparse exits after printing)."""
    buf = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            command([*argv, "--help"])
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    # a default under the building user's home reads the same on every machine
    return buf.getvalue().rstrip().replace(str(Path.home()), "~")


def _sub_actions(help_text: str) -> list[str]:
    """The sub-actions a usage line lists as ``{a,b,c} ...`` (``keys``, ``notes``, ...), not
    an option's choices (``[--log-level {info,debug}]``)."""
    m = re.search(r"(?<![\w-] )\{([a-z][a-z0-9_,-]*)\} \.\.\.", help_text.split("\n\n", 1)[0])
    return m.group(1).split(",") if m else []


def _block(text: str) -> str:
    return "```text\n" + text + "\n```\n"


def cli_markdown() -> str:
    import importlib

    from memory_pipelines.apps import cli

    out: list[str] = ["## Commands", "", _block(cli._usage()), ""]
    for name, (command, summary) in cli.COMMANDS.items():
        text = _help(command, [])
        out += [f"## `{name}`", "", summary[:1].upper() + summary[1:] + ".", "", _block(text)]
        for action in _sub_actions(text):
            out += [f"### `{name} {action}`", "", _block(_help(command, [action]))]
    out += ["## `bench`", "", "Benchmarks; each prints its figures and same-run baselines "
            "(see [Benchmarks](../benchmarks.md)).", ""]
    for name, summary in cli.BENCHMARKS.items():
        module = importlib.import_module(f"memory_pipelines.bench.{name}")
        out += [f"### `bench {name}`", "", summary[:1].upper() + summary[1:] + ".", "",
                _block(_help(module.main, []))]
    return "\n".join(out)


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items', {}))}"
    return schema.get("type", "any")


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").replace("``", "`").split())


def openapi_markdown(schema: dict[str, Any]) -> str:
    """Every operation of an OpenAPI schema: parameters, body, responses; then the models."""
    out: list[str] = []
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            out += [f"### `{method.upper()} {path}`", "", _cell(op.get("description") or op.get("summary", "")), ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required | meaning |", "|---|---|---|---|---|"]
                for p in params:
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_schema_name(p.get('schema', {}))} | "
                        f"{'yes' if p.get('required') else 'no'} | {_cell(p.get('description', ''))} |"
                    )
                out.append("")
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                out += [f"Body: `{_schema_name(body['schema'])}` (JSON).", ""]
            out += ["| status | meaning | body |", "|---|---|---|"]
            for status, resp in op.get("responses", {}).items():
                content = resp.get("content", {}).get("application/json", {})
                name = _schema_name(content["schema"]) if "schema" in content else ""
                out.append(f"| {status} | {_cell(resp.get('description', ''))} | {f'`{name}`' if name else ''} |")
            out.append("")
    schemas = schema.get("components", {}).get("schemas", {})
    if schemas:
        out += ["### Models", ""]
        for name, model in schemas.items():
            out += [f"#### `{name}`", "", _cell(model.get("description", "")), ""]
            props = model.get("properties", {})
            if props:
                required = set(model.get("required", []))
                out += ["| field | type | required | meaning |", "|---|---|---|---|"]
                for field, spec in props.items():
                    out.append(
                        f"| `{field}` | {_cell(_schema_name(spec))} | {'yes' if field in required else 'no'} | "
                        f"{_cell(spec.get('description', ''))} |"
                    )
                out.append("")
    return "\n".join(out)


def _openapi(proxy: bool) -> dict[str, Any]:
    """The schema of a real app over a throwaway home (the hashing embedder: no model)."""
    from memory_pipelines import MemoryService
    from memory_pipelines.embeddings import HashEmbedder

    with tempfile.TemporaryDirectory() as home, MemoryService.open(home, embedder=HashEmbedder()) as svc:
        if proxy:
            from memory_pipelines.apps.proxy import app as proxy_app

            return proxy_app.create_app(svc, "openai/any-model").openapi()
        from memory_pipelines.apps.http import create_app

        return create_app(svc, write_queue=False).openapi()


def http_markdown() -> str:
    return openapi_markdown(_openapi(proxy=False))


def proxy_http_markdown() -> str:
    return openapi_markdown(_openapi(proxy=True))


#: a Sphinx cross-reference role left in a rendered docstring: ``:class:`~a.b.C```
ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):<code>(~?)([^<]+)</code>")


def _role(m: re.Match[str]) -> str:
    target = m.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if m.group(1) else target}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Docstrings name objects with Sphinx roles; the page shows just the name."""
    return ROLE.sub(_role, html)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, globals()[render]())
    return markdown


if __name__ == "__main__":  # pragma: no cover - print a page for a person
    import sys

    print(globals()[MARKERS[f"<!-- generated: {sys.argv[1]} -->"]]())
    if len(sys.argv) > 2:
        print(json.dumps(_openapi(proxy=sys.argv[1] == "proxy-http"), indent=1))
