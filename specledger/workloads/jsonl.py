"""User workloads from a JSON-lines file.

One JSON object per line::

    {"prompt": "Once upon a time"}
    {"messages": [{"role": "user", "content": "Hi"}], "category": "chat", "id": "q1",
     "reference": "Hello!", "meta": {"team": "search"}}

``prompt`` (string) or ``messages`` (non-empty list of ``{"role": system|user|assistant,
"content": string}``) is required -- exactly one of them. ``category`` (default ``"custom"``),
``id`` (string or integer; default ``"<file stem>/<line>"``), ``reference`` (anything) and
``meta`` (object) are optional. Blank lines are skipped. A malformed line is skipped and reported
as ``"line N: <what is wrong>"``; nothing is dropped silently.

A line whose ``category`` is a built-in one with a task metric (code, code-edit, math, summary,
extraction, agent) but whose ``reference`` that metric cannot use is *loaded*, with a warning, and
marked ``meta["quality"] = "not assessed"``: it is timed like any other item, its quality is None.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specledger.errors import SpecLedgerError

from .item import WorkloadItem, message_problem

KNOWN_FIELDS = frozenset({"id", "category", "prompt", "messages", "reference", "meta"})
DEFAULT_USER_CATEGORY = "custom"
NOT_ASSESSED = "not assessed"


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


def load_jsonl(path: str | Path) -> tuple[list[WorkloadItem], list[str]]:
    """``(items, warnings)`` from a user JSONL workload; bad lines are skipped and reported by number.

    Duplicate ids keep the first occurrence. A missing or unreadable file raises
    :class:`SpecLedgerError`.
    """
    path = Path(path)
    if not path.is_file():
        raise SpecLedgerError(f"workload file {path} does not exist: pass the path of a JSONL file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise SpecLedgerError(f"workload file {path} is not UTF-8 text: save it as UTF-8 JSONL") from error
    items: list[WorkloadItem] = []
    warnings: list[str] = []
    first_line_of_id: dict[str, int] = {}
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            warnings.append(f"line {line_number}: invalid JSON ({error.msg} at column {error.colno})")
            continue
        item, line_warnings = parse_record(record, line_number, path.stem)
        warnings.extend(line_warnings)
        if item is None:
            continue
        if item.id in first_line_of_id:
            warnings.append(
                f"line {line_number}: duplicate id '{item.id}' (first on line {first_line_of_id[item.id]}); skipped"
            )
            continue
        first_line_of_id[item.id] = line_number
        items.append(item)
    if not items:
        warnings.append(f"{path}: no workload items found")
    return items, warnings
