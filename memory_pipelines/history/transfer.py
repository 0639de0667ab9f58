"""Export and import of notes, examples and their history (CONTRACT §2.7).

``export_notes`` writes every note and example of a selection (any status, every field)
with its lifecycle events (the ``note_events`` rows) and, unless told not to, its vector,
to one file whose format follows the suffix:

- ``.jsonl``: line 1 is the header ``{"kind": "header", "format":
  "memory-pipelines-export", "version": 1, "model_id", "dim", "vectors", "exported_at",
  "selection", "counts"}``; every further line is one record ``{"kind": "note" |
  "example" | "event", ...fields}``, a note or example with its ``"vector"`` (a list of
  floats, exact: float32 values written as the doubles they are).
- ``.parquet``: one table with the columns ``kind``, ``payload`` (the same JSON object as
  the JSONL line, without the vector) and ``vector`` (list of float32, null when
  absent); row 1 is the header.

Datetimes are aware ISO 8601 (UTC). Records are notes (oldest first), examples, then the
events of the exported notes in the order they were recorded. The file is written next
to its destination and renamed into place, so a failed export leaves no partial file;
a destination inside the memory home (or a local note store) is refused, since purge
scans those folders for erased text.

``import_notes`` validates the WHOLE file before it writes anything: a line or row that
is not JSON, is of an unknown kind, fails the note/example/event model, holds text that
is not UTF-8, a vector of the wrong length, a duplicate id or an event of a note not in
the file, or a file whose records do not match the header's counts (a truncated file)
is a ``ValidationError`` naming the line (JSONL) or row (Parquet, counting from 1), and
nothing of the file is imported. Then, in batches: a note or example whose id this home
already holds is skipped (with its events: two homes may hold different notes under one
id); a new note's events are appended with their original ``at`` (an event already
present, same note id, kind and ``at``, is not added twice), then the note is saved with
its stored ``created_at``/``updated_at``. Events go first so an import cut off
half way completes when run again. Text is re-embedded when the file has no vector for
it, or its vector came from another embedder (the row's ``embedding_model_id``, else the
header's ``model_id``) or has another length than this home's.

The imported home's history of a note is the exported one, event for event (the issue's
"identical note table ... history"); where the notes came from is one audit step of the
import (``Import Notes``: the file, its ``exported_at``, the source embedder and the
counts), not an event per note. A second import adds nothing (every id is then present).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import NotFoundError, ValidationError
from memory_pipelines.history.export_paths import (
    as_file_path,
    check_export_path,
    export_suffix,
    probe_path,
)
from memory_pipelines.limits import Limits, check_ids, limits, unencodable_field, utf8_message
from memory_pipelines.note_events import NoteEvent
from memory_pipelines.notes import Example, Note
from memory_pipelines.scope import selection_filter

FORMAT = "memory-pipelines-export"
VERSION = 1
KINDS = ("note", "example", "event")
_BATCH = 500
_ID_FIELDS = ("id", "agent_id", "user_id", "company_id")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


# --------------------------------------------------------------------------- export


def _selection(agent_id: str | None, user_id: str | None, company_id: str | None) -> dict[str, str]:
    chosen = {"agent_id": agent_id, "user_id": user_id, "company_id": company_id}
    check_ids(chosen)
    for name, value in chosen.items():
        if value is not None and (not isinstance(value, str) or not value):
            raise ValidationError(f"{name} must be a non-empty string when given")
    return {k: v for k, v in chosen.items() if v is not None}


def _ordered(items: list[Any], matrix: np.ndarray) -> list[tuple[Any, np.ndarray]]:
    pairs = list(zip(items, matrix, strict=True))
    pairs.sort(key=lambda p: (p[0].created_at.isoformat() if p[0].created_at else "", p[0].id))
    return pairs


def export_notes(
    mem: MemoryContext,
    path: str | os.PathLike[str],
    *,
    agent_id: str | None = None,
    user_id: str | None = None,
    company_id: str | None = None,
    include_vectors: bool = True,
) -> int:
    """Write the selected notes and examples (each of ``agent_id``/``user_id``/``company_id``
    given must match exactly) with their history to ``path``; returns how many notes and
    examples it wrote (see the module docstring for the format)."""
    target = check_export_path(mem, path)
    chosen = _selection(agent_id, user_id, company_id)
    where = selection_filter(**chosen)
    notes = _ordered(*mem.store.notes.scan_with_vectors(where))
    examples = _ordered(*mem.store.examples.scan_with_vectors(where))
    by_note = mem.sources.events_of([n.id for n, _ in notes])
    events = sorted((e for evs in by_note.values() for e in evs), key=lambda e: e.id or 0)
    header = {
        "kind": "header",
        "format": FORMAT,
        "version": VERSION,
        "model_id": mem.embedder.model_id,
        "dim": mem.store.notes.dim,
        "vectors": bool(include_vectors),
        "exported_at": mem.now().isoformat(),
        "selection": chosen,
        "counts": {"note": len(notes), "example": len(examples), "event": len(events)},
    }

    def records() -> Iterator[tuple[dict[str, Any], np.ndarray | None]]:
        yield header, None
        for kind, pairs in (("note", notes), ("example", examples)):
            for item, vector in pairs:
                yield {"kind": kind, **item.model_dump(mode="json")}, (
                    vector if include_vectors else None
                )
        for ev in events:
            yield {"kind": "event", **ev.model_dump(mode="json", exclude={"id"})}, None

    writer = _write_jsonl if export_suffix(target) == ".jsonl" else _write_parquet
    try:
        _atomic(target, lambda tmp: writer(tmp, records()))
    except OSError as e:  # permission denied, disk full, a name too long
        raise ValidationError(f"cannot write the export to {target}: {e.strerror or e}") from None
    return len(notes) + len(examples)


def _floats(vector: np.ndarray) -> list[float]:
    """The float32 values as the doubles they are (exact in JSON)."""
    return np.asarray(vector, dtype=np.float32).astype(np.float64).tolist()


def _dumps(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _write_jsonl(
    path: Path, records: Iterator[tuple[dict[str, Any], np.ndarray | None]]
) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for payload, vector in records:
            if vector is not None:
                payload = {**payload, "vector": _floats(vector)}
            f.write(_dumps(payload) + "\n")


def _write_parquet(
    path: Path, records: Iterator[tuple[dict[str, Any], np.ndarray | None]]
) -> None:
    kinds: list[str] = []
    payloads: list[str] = []
    vectors: list[list[float] | None] = []
    for payload, vector in records:
        kinds.append(payload["kind"])
        payloads.append(_dumps(payload))
        vectors.append(None if vector is None else _floats(vector))
    table = pa.table(
        {
            "kind": pa.array(kinds, pa.string()),
            "payload": pa.array(payloads, pa.string()),
            "vector": pa.array(vectors, pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, path, row_group_size=EXPORT_ROW_GROUP_ROWS)  # an import reads one at a time


def _atomic(target: Path, write: Any) -> None:
    """Write through a temporary file beside ``target``, renamed into place when done."""
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------- reading


@dataclass
class Parsed:
    """A validated export file."""

    header: dict[str, Any]
    id_bound: int = 0  # ids up to this length skip the full check (``limits().max_id_chars``)
    notes: list[tuple[Note, np.ndarray | None]] = field(default_factory=list)
    examples: list[tuple[Example, np.ndarray | None]] = field(default_factory=list)
    events: list[NoteEvent] = field(default_factory=list)


class _Bad(Exception):
    """A problem of one record (turned into a ``ValidationError`` naming its place)."""


#: the longest line (``.jsonl``) or payload (``.parquet``) an import reads, in bytes, by
#: default (``Limits.max_import_record_bytes``, ``MEMORY_MAX_IMPORT_RECORD_BYTES``): an
#: export's records are a note or example with its vector (kilobytes), so a longer one is
#: not an export, and reading it whole would take its size in memory (and more to parse)
MAX_RECORD_BYTES = Limits.max_import_record_bytes
#: the deepest nesting of arrays and objects a record may have (an export's is 4)
MAX_RECORD_DEPTH = 32
#: the largest row group a ``.parquet`` import reads at once (uncompressed bytes), by
#: default (``Limits.max_import_row_group_bytes``, ``MEMORY_MAX_IMPORT_ROW_GROUP_BYTES``);
#: an export writes row groups of :data:`EXPORT_ROW_GROUP_ROWS` records (a few megabytes)
MAX_ROW_GROUP_BYTES = Limits.max_import_row_group_bytes
EXPORT_ROW_GROUP_ROWS = 2_000


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in a decoded JSON value (iterative)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, level)
        if level > MAX_RECORD_DEPTH:
            return level
        stack.extend((child, level + 1) for child in item if isinstance(child, (dict, list)))
    return deepest


def _decode(text: str, what: str) -> Any:
    """``text`` as JSON, or ``_Bad`` naming why not (a decoder error, or nesting deeper
    than :data:`MAX_RECORD_DEPTH`, which an export never has)."""
    too_deep = _Bad(f"{what} nests arrays or objects deeper than {MAX_RECORD_DEPTH} levels")
    try:
        payload = json.loads(text)
    except RecursionError:
        raise too_deep from None
    if _depth(payload) > MAX_RECORD_DEPTH:
        raise too_deep
    return payload


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any, Any, bool]]:
    """(place, payload, vector, may hold a lone surrogate) per line; the vector is popped
    from the payload."""
    bound = limits().max_import_record_bytes
    with path.open("rb") as f:
        number = 0
        while raw := f.readline(bound + 1):  # never more than that in memory
            number += 1
            place = f"line {number}"
            if len(raw) > bound:
                yield place, _Bad(f"longer than {bound} bytes (not an export's record)"), None, False
                return
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield place, _Bad(f"not UTF-8 text ({e.reason} at byte {e.start})"), None, False
                return
            if not text.strip():
                yield place, _Bad("empty line"), None, False
                return
            try:
                payload = _decode(text, "the line")
            except json.JSONDecodeError as e:
                cut = "" if text.endswith("\n") else " (the file looks truncated)"
                yield place, _Bad(f"not valid JSON ({e.msg}, column {e.colno}){cut}"), None, False
                return
            except _Bad as e:
                yield place, e, None, False
                return
            vector = payload.pop("vector", None) if isinstance(payload, dict) else None
            yield place, payload, vector, _escapes_surrogate(text)


def _parquet_records(path: Path) -> Iterator[tuple[str, Any, Any, bool]]:
    """As :func:`_jsonl_records`, one row group at a time (each refused, naming it, when
    it is larger than ``max_import_row_group_bytes`` uncompressed), so memory stays bounded."""
    try:
        parquet = pq.ParquetFile(path)
        columns = set(parquet.schema_arrow.names)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError ... for a bad file
        raise ValidationError(f"export file {path.name}: not a readable Parquet file ({e})") from None
    missing = {"kind", "payload", "vector"} - columns
    if missing:
        raise ValidationError(
            f"export file {path.name}: not a memory-pipelines export (no column(s)"
            f" {', '.join(sorted(missing))})"
        )
    number = 0
    bound = limits().max_import_row_group_bytes
    for group in range(parquet.metadata.num_row_groups):
        size = parquet.metadata.row_group(group).total_byte_size
        if size > bound:
            yield (
                f"row group {group + 1} (rows from {number + 1})",
                _Bad(f"{size} bytes uncompressed, over the {bound} an import reads at once"),
                None,
                False,
            )
            return
        try:
            table = parquet.read_row_group(group, columns=["kind", "payload", "vector"])
        except Exception as e:
            raise ValidationError(f"export file {path.name}: row group {group + 1} does not read ({e})") from None
        for kind, raw, vector in zip(
            table.column("kind").to_pylist(),
            table.column("payload").to_pylist(),
            table.column("vector").to_pylist(),
            strict=True,
        ):
            number += 1
            yield _parquet_record(f"row {number}", kind, raw, vector)


def _parquet_record(place: str, kind: Any, raw: Any, vector: Any) -> tuple[str, Any, Any, bool]:
    if not isinstance(raw, str):
        return place, _Bad("no payload"), None, False
    bound = limits().max_import_record_bytes
    if len(raw) > bound:
        return place, _Bad(f"payload longer than {bound} bytes (not an export's record)"), None, False
    try:
        payload = _decode(raw, "the payload")
    except json.JSONDecodeError as e:
        return place, _Bad(f"payload is not valid JSON ({e.msg}, column {e.colno})"), None, False
    except _Bad as e:
        return place, e, None, False
    if isinstance(payload, dict) and payload.get("kind") != kind:
        return place, _Bad(f"kind column {kind!r} differs from the payload's"), None, False
    return place, payload, vector, _escapes_surrogate(raw)


def _escapes_surrogate(text: str) -> bool:
    """Whether JSON text may decode to a lone surrogate: strictly decoded UTF-8 holds none,
    so only a ``\\udXXX`` escape can bring one in (then every text is checked)."""
    return _SURROGATE_ESCAPE.search(text) is not None


def _check_header(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise _Bad(f"not a {FORMAT} header")
    if payload.get("version") != VERSION:
        raise _Bad(f"unsupported export version {payload.get('version')!r} (this reads {VERSION})")
    model_id, dim, counts = payload.get("model_id"), payload.get("dim"), payload.get("counts")
    if not isinstance(model_id, str) or not isinstance(dim, int) or dim <= 0:
        raise _Bad("header needs a model_id (text) and a dim (a positive integer)")
    if not isinstance(counts, dict) or any(
        not isinstance(counts.get(k), int) or counts[k] < 0 for k in KINDS
    ):
        raise _Bad("header needs counts of note, example and event records")
    return payload


def _check_vector(vector: Any, dim: int) -> np.ndarray | None:
    if vector is None:
        return None
    if not isinstance(vector, list) or len(vector) != dim:
        raise _Bad(f"vector must be a list of {dim} numbers")
    values = np.asarray(vector)  # numbers only: bools, text or nulls give another dtype
    if values.dtype.kind not in "fiu":
        raise _Bad("vector must hold numbers only")
    if not np.isfinite(values).all():
        raise _Bad("vector holds a non-finite number")
    return values.astype(np.float32)


def _plain_id(value: Any, bound: int) -> bool:
    """An id that surely passes ``check_id``: short printable text (or none)."""
    return value is None or (isinstance(value, str) and len(value) <= bound and value.isprintable())


def _model(
    model: type[Any], payload: dict[str, Any], kind: str, id_bound: int, escaped: bool
) -> Any:
    found = unencodable_field(payload, kind) if escaped else None
    if found:
        raise _Bad(utf8_message(found))
    ids = {k: payload.get(k) for k in (*_ID_FIELDS, "note_id") if k in model.model_fields}
    if not all(_plain_id(v, id_bound) for v in ids.values()):  # the common case skips the slow check
        try:
            check_ids(ids)
        except ValidationError as e:
            raise _Bad(str(e)) from None
    try:
        return model.model_validate(payload)
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        errors = getattr(e, "errors", None)
        if callable(errors) and errors():
            first = errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or kind
            raise _Bad(f"invalid {kind}: {where}: {first.get('msg')}") from None
        raise _Bad(f"invalid {kind}: {e}") from None


def read_export(path: str | os.PathLike[str]) -> Parsed:
    """Read and validate a whole export file (``ValidationError`` naming the line or row
    of the first problem; nothing is written)."""
    source = as_file_path(path)
    suffix = export_suffix(source)
    if not probe_path(source, Path.is_file):
        raise NotFoundError(f"export file {source} does not exist")
    records = _jsonl_records(source) if suffix == ".jsonl" else _parquet_records(source)
    parsed: Parsed | None = None
    seen: dict[tuple[str, str], str] = {}
    pending_events: list[tuple[str, NoteEvent]] = []
    place = "line 1" if suffix == ".jsonl" else "row 1"
    try:
        for place, payload, vector, escaped in records:
            if isinstance(payload, _Bad):
                raise payload
            if parsed is None:
                parsed = Parsed(header=_check_header(payload), id_bound=limits().max_id_chars)
                continue
            _add_record(parsed, place, payload, vector, escaped, seen, pending_events)
        if parsed is None:
            raise _Bad("the file is empty (no header)")
    except _Bad as e:
        raise ValidationError(f"export file {source.name}, {place}: {e}") from None
    for at, ev in pending_events:
        if ("note", ev.note_id) not in seen:
            raise ValidationError(
                f"export file {source.name}, {at}: event of note {ev.note_id!r}, which the file"
                " does not hold"
            )
    found = {"note": len(parsed.notes), "example": len(parsed.examples), "event": len(parsed.events)}
    expected = {k: parsed.header["counts"][k] for k in KINDS}
    if found != expected:
        raise ValidationError(
            f"export file {source.name}: the header announces {expected} records but the file"
            f" holds {found} (truncated or edited); nothing was imported"
        )
    return parsed


def _add_record(
    parsed: Parsed,
    place: str,
    payload: Any,
    vector: Any,
    escaped: bool,
    seen: dict[tuple[str, str], str],
    pending_events: list[tuple[str, NoteEvent]],
) -> None:
    if not isinstance(payload, dict):
        raise _Bad("a record must be a JSON object")
    kind = payload.pop("kind", None)
    if kind not in KINDS:
        raise _Bad(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    if kind == "event":
        if vector is not None:
            raise _Bad("an event has no vector")
        ev = _model(NoteEvent, payload, kind, parsed.id_bound, escaped)
        if ev.at is None:
            raise _Bad("an event needs its 'at'")
        parsed.events.append(ev)
        pending_events.append((place, ev))
        return
    item = _model(Note if kind == "note" else Example, payload, kind, parsed.id_bound, escaped)
    if (kind, item.id) in seen:
        raise _Bad(f"duplicate {kind} id {item.id!r} (first at {seen[(kind, item.id)]})")
    seen[(kind, item.id)] = place
    vec = _check_vector(vector, parsed.header["dim"])
    (parsed.notes if kind == "note" else parsed.examples).append((item, vec))


# --------------------------------------------------------------------------- import


def import_notes(mem: MemoryContext, path: str | os.PathLike[str]) -> dict[str, int]:
    """Import an export file into this home (validated whole first; see the module
    docstring). Returns counts: ``imported`` and ``skipped`` (notes and examples),
    ``notes``, ``examples``, ``events`` (history rows added) and ``reembedded``; the import
    is recorded as one ``Import Notes`` audit step."""
    parsed = read_export(path)
    counts = {"imported": 0, "skipped": 0, "notes": 0, "examples": 0, "events": 0, "reembedded": 0}
    events_by_note: dict[str, list[NoteEvent]] = {}
    for ev in parsed.events:
        events_by_note.setdefault(ev.note_id, []).append(ev)
    origin = {
        "file": Path(path).name,
        "exported_at": parsed.header.get("exported_at"),
        "source_model_id": parsed.header["model_id"],
    }
    for start in range(0, len(parsed.notes), _BATCH):
        _import_notes(mem, parsed, parsed.notes[start : start + _BATCH], events_by_note, counts)
    for start in range(0, len(parsed.examples), _BATCH):
        _import_examples(mem, parsed, parsed.examples[start : start + _BATCH], counts)
    counts["imported"] = counts["notes"] + counts["examples"]
    now = mem.now()
    mem.sources.add_step(
        "", "Admin", "Import Notes", input=origin, output=dict(counts), started_at=now, finished_at=now
    )
    return counts


def _new(table: Any, batch: Sequence[tuple[Any, Any]], counts: dict[str, int]) -> list[tuple[Any, Any]]:
    present = table.existing_ids([item.id for item, _ in batch])
    counts["skipped"] += len(present)
    return [(item, vec) for item, vec in batch if item.id not in present]


def _vectors(
    mem: MemoryContext,
    parsed: Parsed,
    pairs: Sequence[tuple[Any, np.ndarray | None]],
    text_of: Any,
    counts: dict[str, int],
) -> np.ndarray:
    """The file's vectors where they fit this home's embedder, fresh ones elsewhere."""
    model_id, dim = mem.embedder.model_id, mem.store.notes.dim
    matrix = np.zeros((len(pairs), dim), dtype=np.float32)
    redo: list[int] = []
    for i, (item, vec) in enumerate(pairs):
        source_model = item.embedding_model_id or parsed.header["model_id"]
        if vec is None or source_model != model_id or vec.shape != (dim,):
            redo.append(i)
        else:
            matrix[i] = vec
    if redo:
        fresh = mem.embed([text_of(pairs[i][0]) for i in redo])
        for k, i in enumerate(redo):
            matrix[i] = fresh[k]
        counts["reembedded"] += len(redo)
    return matrix


def _import_notes(
    mem: MemoryContext,
    parsed: Parsed,
    batch: Sequence[tuple[Note, np.ndarray | None]],
    events_by_note: Mapping[str, list[NoteEvent]],
    counts: dict[str, int],
) -> None:
    new = _new(mem.store.notes, batch, counts)
    if not new:
        return
    vectors = _vectors(mem, parsed, new, lambda n: n.note, counts)
    present = mem.sources.events_of([n.id for n, _ in new])
    now = mem.now()
    events: list[NoteEvent] = []
    for note, _ in new:
        have = present.get(note.id, [])
        keys = {(e.event, e.at) for e in have}
        events += [e.model_copy(update={"id": None}) for e in events_by_note.get(note.id, []) if (e.event, e.at) not in keys]
    mem.notebook.record(events, now)
    mem.notebook.save_notes([n for n, _ in new], vectors, keep_stamps=True)
    counts["notes"] += len(new)
    counts["events"] += len(events)


def _import_examples(
    mem: MemoryContext,
    parsed: Parsed,
    batch: Sequence[tuple[Example, np.ndarray | None]],
    counts: dict[str, int],
) -> None:
    new = _new(mem.store.examples, batch, counts)
    if not new:
        return
    vectors = _vectors(mem, parsed, new, lambda e: e.example_input, counts)
    mem.notebook.save_examples([e for e, _ in new], vectors, keep_stamps=True)
    counts["examples"] += len(new)
