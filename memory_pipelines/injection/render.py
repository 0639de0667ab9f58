"""Rendering the injected message byte for byte (reference §3.4): the memory policy, the
notes and examples blocks, and :func:`one_line`, which keeps every stored text on one line
that can neither open nor close a block."""

from __future__ import annotations

import re
from collections.abc import Sequence

from memory_pipelines.notes import Example, Note, NoteStatus
from memory_pipelines.scope import scope_label

MEMORY_POLICY: tuple[str, ...] = (
    "<memory_policy>",
    "Precedence (highest to lowest):",
    "1) The current user message overrides all stored memory",
    '2) Provisional notes (marked "(provisional)") are the newest signal — when a',
    "   provisional note and an established note conflict on the same topic, follow",
    "   the provisional one (recency wins)",
    "3) User-specific notes override company-level",
    "4) Company notes override global defaults",
    "5) Within the same scope and status, prefer the most recent by recorded date (shown on each note)",
    "",
    "Conflict resolution:",
    "- Same level and neither provisional: prefer the more specific scope, then the more recent",
    "- Ask clarifying question only if conflict materially affects response",
    "</memory_policy>",
    "",
)

_LINE_BREAKS = re.compile(r"[\r\n\t\v\f\x85\u2028\u2029]+")
_POLICY_TAG = re.compile(r"<(\s*/?\s*memory[\s_\-]*policy\b[^<>]*)>", re.IGNORECASE)
_HEADER_GLYPHS = re.compile("[\U0001f4dd\U0001f4a1]\ufe0f?")
_BIDI = {0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069, 0x200E, 0x200F}
_SPACES = re.compile(r" {2,}")
#: Unicode category Cc is exactly these code points.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_BIDI_CHARS = re.compile("[" + "".join(chr(c) for c in sorted(_BIDI)) + "]")


def one_line(text: str | None) -> str:
    """A stored text made safe to render inside the injected message.

    Line and paragraph separators, tabs and every other control character become
    spaces (runs collapse to one); bidirectional overrides are dropped;
    ``<memory_policy>``/``</memory_policy>`` in any case or spacing become ``‹...›`` so
    they can neither open nor close the policy block; the 📝/💡 header glyphs are removed
    so no header can be forged; a leading ``---`` becomes an em dash. The result is one
    line with no leading or trailing space.
    """
    if not text:
        return ""
    s = _LINE_BREAKS.sub(" ", str(text))
    s = _CONTROL.sub(" ", _BIDI_CHARS.sub("", s))
    s = _POLICY_TAG.sub(lambda m: "‹" + m.group(1) + "›", s)
    s = _HEADER_GLYPHS.sub("", s)
    s = _SPACES.sub(" ", s).strip()
    s = re.sub(r"^-{3,}", "—", s)
    return s


def format_score(value: float) -> str:
    """A number without trailing zeros: ``90.0 -> '90'``, ``87.5 -> '87.5'``."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _note_line(note: Note) -> str:
    head = (
        f"[{note.type}, {note.created_at.date().isoformat()}]"
        if note.created_at
        else f"[{note.type}]"
    )
    if note.status == NoteStatus.PROVISIONAL.value:
        head += " (provisional)"
    return f"{head} {one_line(note.note)}"


def render_notes(notes: Sequence[Note], *, include_memory_policy: bool = True) -> str:
    """The notes block of reference §3.4 ("" for no notes).

    The memory policy (unless disabled), then the provisional block (only when a note is
    Provisional) and the established block (only when another note is), each note as
    ``[Type, YYYY-MM-DD]`` (+ `` (provisional)``) + text, ``  Scope: <label>`` and an empty
    line; finally ``---``. Lines are joined with ``"\\n"``; within a block the given
    (ranked) order is kept.
    """
    if not notes:
        return ""
    provisional = [n for n in notes if n.status == NoteStatus.PROVISIONAL.value]
    established = [n for n in notes if n.status != NoteStatus.PROVISIONAL.value]
    lines: list[str] = list(MEMORY_POLICY) if include_memory_policy else []
    if provisional:
        lines += [f"📝 RECENT NOTES ({len(provisional)} provisional — newest signal)", ""]
        for n in provisional:
            lines += [_note_line(n), f"  Scope: {scope_label(n)}", ""]
    if established:
        lines += [f"📝 AGENT NOTES ({len(established)})", ""]
        for n in established:
            lines += [_note_line(n), f"  Scope: {scope_label(n)}", ""]
    lines.append("---")
    return "\n".join(lines)


def render_examples(examples: Sequence[Example]) -> str:
    """The examples block of reference §3.4 ("" for no examples): header, then per example
    ``Example i:``, ``Q: ...``, ``A: ...``, ``  (Success Score: s/100)`` when the score is
    truthy, an empty line; finally ``---``."""
    if not examples:
        return ""
    lines = [f"💡 RELEVANT EXAMPLES ({len(examples)})", ""]
    for i, e in enumerate(examples, start=1):
        lines += [
            f"Example {i}:",
            f"Q: {one_line(e.example_input)}",
            f"A: {one_line(e.example_output)}",
        ]
        if e.success_score:
            lines.append(f"  (Success Score: {format_score(e.success_score)}/100)")
        lines.append("")
    lines.append("---")
    return "\n".join(lines)


def render_message(notes_block: str, examples_block: str) -> str:
    """The one system message (reference §3.1): each non-empty block followed by a blank
    line, i.e. ``notes + "\\n\\n" + examples + "\\n\\n"``; ``""`` when both are empty."""
    return "".join(block + "\n\n" for block in (notes_block, examples_block) if block)
