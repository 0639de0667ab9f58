"""Terminal-safe text for the command line.

Note text comes from users and models. Printed raw, an escape sequence (``ESC [31m``,
``ESC ]0;title BEL``) recolours or rewrites the screen, a NUL cuts the line, and a bidi
override (U+202E) reorders what a reader sees. Every command that prints note text, ids
or reasons passes its output through :func:`printable` (text) or :func:`printable_json`
(JSON), which show such characters as Python-style escapes: ``\\x1b``, ``\\u202e``.

Escaped: the C0 controls, DEL and the C1 controls; the bidi marks, embeddings,
overrides and isolates (U+061C, U+200E-F, U+202A-E, U+2066-9); invisible format
characters (soft hyphen, U+180E, U+200B, U+2060-U+206F, BOM, U+FFF9-B, tags) and the
line/paragraph separators U+2028-9. Letters, emoji (the zero-width joiner U+200D and
non-joiner U+200C stay) and backslashes are left alone.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b\u200e\u200f\u2028-\u202e"
    "\u2060-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]"
)


_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _python_escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON spells characters beyond the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def printable(text: str, keep: str = "") -> str:
    """``text`` with every control, bidi and invisible format character escaped
    (``\\x1b``, ``\\u202e``); characters in ``keep`` (e.g. ``"\\n"`` for multi-line
    output) pass through."""
    return _UNSAFE.sub(lambda m: m[0] if m[0] in keep else _python_escape(m[0]), text)


def printable_json(text: str) -> str:
    """A JSON document with those characters written as ``\\uXXXX`` escapes: still valid
    JSON holding the same values (its own line breaks, outside strings, are kept)."""
    return _UNSAFE.sub(lambda m: m[0] if m[0] == "\n" else _json_escape(m[0]), text)


__all__ = ["printable", "printable_json"]
