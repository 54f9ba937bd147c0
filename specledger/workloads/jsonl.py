"""User workloads from a JSON-lines file.

One JSON object per line::

    {"prompt": "Once upon a time"}
    {"messages": [{"role": "user", "content": "Hi"}], "category": "chat", "id": "q1",
     "reference": "Hello!", "meta": {"team": "search"}}

``prompt`` (string) or ``messages`` (non-empty list of ``{"role": system|user|assistant,
"content": string}``) is required -- exactly one of them. ``category`` (default ``"custom"``),
``id`` (string or integer; default ``"<file stem>/<line>"``), ``reference`` (anything) and
``meta`` (object) and ``max_tokens`` (a whole number: ``probe`` sends it; ``run`` uses its own
``--max-tokens``) are optional. Blank lines are skipped.

One rule for ``run`` and ``probe`` (both read workloads here): a malformed line (not JSON, not an object,
a field of the wrong type, a duplicate id) refuses the whole file with one line naming it
(``"W.jsonl:3: missing 'prompt' or 'messages'"``, plus how many other lines are malformed); nothing is
skipped silently, nothing is measured on a file with a hole in it. What is only doubtful (an unknown
field, a reference a category's metric cannot use) loads with a warning, folded per kind
(:func:`fold_warnings`: ``"unknown field 'x' ignored on 32 lines: 1, 2, 3, 4, 5, ..."``).

A line whose ``category`` is a built-in one with a task metric (code, code-edit, math, summary,
extraction, agent) but whose ``reference`` that metric cannot use is *loaded*, with a warning, and
marked ``meta["quality"] = "not assessed"``: it is timed like any other item, its quality is None.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specledger.errors import SpecLedgerError

from .item import WorkloadItem, message_problem

KNOWN_FIELDS = frozenset({"id", "category", "prompt", "messages", "reference", "meta", "max_tokens"})
#: line numbers a folded warning lists before "..."
FOLD_SHOWN = 5
DEFAULT_USER_CATEGORY = "custom"
NOT_ASSESSED = "not assessed"
_LINE = re.compile(r"line (\d+): (.*)", re.S)


def reference_problem(category: str, reference: Any) -> str | None:
    """What a built-in category's metric needs that ``reference`` lacks (None: usable, or no metric)."""
    if category in ("code", "code-edit"):
        if not isinstance(reference, dict) or not {"test", "entry_point"} <= set(reference):
            return "needs a reference {'prompt', 'test', 'entry_point'}"
        if reference.get("mode", "complete") != "full" and not isinstance(reference.get("prompt"), str):
            return "needs the problem 'prompt' in its reference (or mode 'full')"
        return None
    if category == "math":
        return "needs its answer as 'reference'" if reference is None or isinstance(reference, (bool, dict)) else None
    if category == "summary":
        return None if isinstance(reference, str) else "needs a reference text"
    if category == "extraction":
        if reference is None or isinstance(reference, str):
            return None
        ok = isinstance(reference, dict) and {"name", "possible_arguments"} <= set(reference)
        return None if ok else "needs a reference {'name', 'possible_arguments'} or a text"
    if category == "agent":
        if isinstance(reference, str):
            return None
        if isinstance(reference, dict) and reference.get("type") == "tool_call" and "name" in reference:
            return None
        if isinstance(reference, dict) and reference.get("type") == "text" and isinstance(reference.get("text"), str):
            return None
        return "needs a reference text or {'type': 'tool_call', 'name', 'arguments'}"
    return None


def _field_problems(record: dict) -> str | None:
    has_prompt, has_messages = "prompt" in record, "messages" in record
    if not has_prompt and not has_messages:
        return "missing 'prompt' or 'messages'"
    if has_prompt and has_messages:
        return "has both 'prompt' and 'messages'; give exactly one"
    if has_prompt and (not isinstance(record["prompt"], str) or not record["prompt"]):
        return "'prompt' must be a non-empty string"
    if has_messages:
        problem = message_problem(record["messages"])
        if problem:
            return problem
    category = record.get("category", DEFAULT_USER_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        return "'category' must be a non-empty string"
    item_id = record.get("id")
    if item_id is not None and (
        isinstance(item_id, bool) or not isinstance(item_id, (str, int)) or item_id == ""
    ):
        return "'id' must be a non-empty string or an integer"
    if not isinstance(record.get("meta", {}), dict):
        return "'meta' must be an object"
    top = record.get("max_tokens")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        return "'max_tokens' must be a whole number >= 1"
    return None


def parse_record(record: Any, line_number: int, stem: str) -> tuple[WorkloadItem | None, list[str]]:
    """One line's item (or ``None``) and its warnings; warnings name the line."""
    if not isinstance(record, dict):
        return None, [f"line {line_number}: expected a JSON object, got {type(record).__name__}"]
    problem = _field_problems(record)
    if problem:
        return None, [f"line {line_number}: {problem}"]
    warnings = [
        f"line {line_number}: unknown field '{name}' ignored" for name in sorted(set(record) - KNOWN_FIELDS)
    ]
    messages = [dict(message) for message in record["messages"]] if "messages" in record else None
    category = record.get("category", DEFAULT_USER_CATEGORY).strip()
    meta = {**record.get("meta", {}), "source": "jsonl", "line": line_number}
    if record.get("max_tokens") is not None:
        meta["max_tokens"] = record["max_tokens"]
    unusable = reference_problem(category, record.get("reference"))
    if unusable:
        meta["quality"] = NOT_ASSESSED
        warnings.append(f"line {line_number}: category '{category}' {unusable}; loaded, quality {NOT_ASSESSED}")
    item = WorkloadItem(
        id=str(record.get("id", f"{stem}/{line_number}")),
        category=category,
        messages=messages,
        prompt=record.get("prompt"),
        reference=record.get("reference"),
        meta=meta,
    )
    return item, warnings


def fold_warnings(warnings: Sequence[str]) -> list[str]:
    """``"line N: <what>"`` warnings folded per kind (the same ``<what>``): one warning per kind, in order of
    first appearance, with its count and first :data:`FOLD_SHOWN` line numbers; a kind seen once stays as
    it was; warnings without a line number are kept as they are."""
    kinds: dict[str, list[int]] = {}
    order: list[str] = []
    for warning in warnings:
        match = _LINE.match(warning)
        if match is None:
            order.append(warning)
            continue
        what = match.group(2)
        if what not in kinds:
            kinds[what] = []
            order.append(what)
        kinds[what].append(int(match.group(1)))
    out = []
    for key in order:
        lines = kinds.get(key)
        if lines is None:
            out.append(key)
        elif len(lines) == 1:
            out.append(f"line {lines[0]}: {key}")
        else:
            shown = ", ".join(map(str, lines[:FOLD_SHOWN])) + (", ..." if len(lines) > FOLD_SHOWN else "")
            out.append(f"{key} on {len(lines)} lines: {shown}")
    return out


def workload_warning(path: str | Path | None, message: str) -> str:
    """One workload warning as ``run`` and ``probe`` print it: ``workload PATH: <message>`` (a message that
    already starts with the path stays as it is)."""
    where = str(path or "")
    return message if where and message.startswith(where) else f"workload {where}: {message}".replace(" :", ":")


def _refuse(path: Path, problems: list[tuple[int, str]]) -> None:
    """One line: the first malformed line and what is wrong, and how many others there are."""
    number, what = problems[0]
    more = f" ({len(problems) - 1} more malformed line(s): {', '.join(str(n) for n, _ in problems[1:FOLD_SHOWN + 1])}" \
        f"{', ...' if len(problems) > FOLD_SHOWN + 1 else ''})" if len(problems) > 1 else ""
    raise SpecLedgerError(f"{path}:{number}: {what}; fix or remove that line{more}")


def read_lines(path: Path) -> list[str]:
    """The file's lines; a missing, unreadable or non-UTF-8 file is a one-line :class:`SpecLedgerError`."""
    if not path.is_file():
        raise SpecLedgerError(f"workload file {path} does not exist: pass the path of a JSONL file")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise SpecLedgerError(f"workload file {path} is not UTF-8 text: save it as UTF-8 JSONL") from error
    except OSError as error:
        raise SpecLedgerError(f"cannot read workload file {path}: {error.strerror or error}") from None


def load_jsonl(path: str | Path) -> tuple[list[WorkloadItem], list[str]]:
    """``(items, warnings)`` from a user JSONL workload, the one reader ``run`` and ``probe`` share (module
    docstring: the rule). A missing, unreadable or empty file, or any malformed line (a duplicate id
    included), raises :class:`SpecLedgerError` naming the line; the warnings are folded per kind."""
    path = Path(path)
    items: list[WorkloadItem] = []
    warnings: list[str] = []
    problems: list[tuple[int, str]] = []
    first_line_of_id: dict[str, int] = {}
    for line_number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append((line_number, f"invalid JSON ({error.msg} at column {error.colno})"))
            continue
        item, line_warnings = parse_record(record, line_number, path.stem)
        if item is None:
            problems.append((line_number, line_warnings[0].split(": ", 1)[1]))
            continue
        warnings.extend(line_warnings)
        if item.id in first_line_of_id:
            problems.append((line_number, f"id '{item.id}' appears twice (first on line {first_line_of_id[item.id]})"))
            continue
        first_line_of_id[item.id] = line_number
        items.append(item)
    if problems:
        _refuse(path, problems)
    if not items:
        raise SpecLedgerError(f"{path} has no prompts; give at least one JSON line with 'prompt' or 'messages'")
    return items, fold_warnings(warnings)
