"""The one escape for untrusted text on the terminal: what a server or a file says is shown, never obeyed.

Server- and file-supplied strings (model names, versions, SSE error messages, label values, warnings that
quote them) reach the terminal through Rich, which reads ``[...]`` as markup, and through the terminal,
which obeys ESC sequences. Both are neutralised here:

* :func:`visible` replaces every control character (C0 U+0000-U+001F, DEL U+007F, C1 U+0080-U+009F) and
  the bidirectional overrides (U+202A-U+202E, U+2066-U+2069) by a visible escape such as ``\\x1b`` or
  ``\\u202e``, so no byte of the text can move the cursor, set a title, or reorder what follows;
  newlines and tabs too, keeping every value on one line. ``len(visible(s))`` is at most
  ``6 * len(s)`` and ``visible(s) == s`` for printable text.
* :func:`safe` is :func:`visible` plus :func:`rich.markup.escape`: text safe to put inside a Rich markup
  string (``console.print(f"[yellow]{safe(x)}[/yellow]")``) or a table cell.

``limit`` clips the visible text to that many characters (an ellipsis marks the cut).
"""

from __future__ import annotations

import re
from typing import Any

from rich.markup import escape

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(value: Any, limit: int | None = None) -> str:
    """``str(value)`` with control and bidi-override characters written as visible escapes (one line). A
    backslash right before ``[`` is written ``\\x5c`` too: Rich reads ``\\[`` as an escaped bracket even in
    escaped text, so it would silently drop that backslash."""
    text = _UNSAFE.sub(_escape_char, value if isinstance(value, str) else str(value)).replace("\\[", "\\x5c[")
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    return text


def safe(value: Any, limit: int | None = None) -> str:
    """:func:`visible` text with Rich markup escaped: safe inside a markup string or a table cell."""
    return escape(visible(value, limit))


__all__ = ["safe", "visible"]
