"""BFCL v4 simple_python (bfcl-eval 2026.3.23): one function schema, one request, one call.

``BFCL_v4_simple_python.json`` is JSON-lines despite its name: ``{"id", "question": [[messages]],
"function": [schema]}``; ``possible_answer/BFCL_v4_simple_python.json`` holds, per id,
``{"ground_truth": [{name: {param: [acceptable values]}}]}`` where ``""`` among the values
means the parameter may be omitted.

Rendering: a system message presents the schema(s) as JSON and asks for the call as one JSON
object ``{"name": ..., "arguments": {...}}``; the user message is BFCL's question.
Reference: ``{"name": str, "possible_arguments": {param: [acceptable values]}}`` (the first
ground-truth call; simple_python has exactly one).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from .item import WorkloadItem
from .packages import BFCL, data_file
from .readers import read_json_lines

BFCL_QUESTIONS = "data/BFCL_v4_simple_python.json"
BFCL_ANSWERS = "data/possible_answer/BFCL_v4_simple_python.json"


def bfcl_paths() -> tuple[Path, Path]:
    return data_file(BFCL, BFCL_QUESTIONS), data_file(BFCL, BFCL_ANSWERS)


def function_call_system_prompt(functions: list[dict]) -> str:
    """The system message presenting the schemas and the required JSON reply format."""
    schemas = "\n".join(json.dumps(function, ensure_ascii=False) for function in functions)
    return (
        "You are a function-calling assistant. You can call these functions (JSON schemas):\n"
        f"{schemas}\n\n"
        'Reply with only the call, as one JSON object: {"name": "<function name>", "arguments": '
        "{<parameter>: <value>, ...}}. No explanation."
    )


def _ground_truth_call(answer: dict) -> dict:
    ((name, arguments),) = answer["ground_truth"][0].items()
    return {"name": name, "possible_arguments": arguments}


@lru_cache(maxsize=4)
def build_bfcl_items(questions_path: Path, answers_path: Path) -> tuple[WorkloadItem, ...]:
    """One extraction item per BFCL question, in file order, joined to its answer by id."""
    answers = {record["id"]: record for record in read_json_lines(answers_path)}
    items = []
    for record in read_json_lines(questions_path):
        conversation = record["question"][0]
        answer = answers.get(record["id"])
        items.append(
            WorkloadItem(
                id=f"extraction/bfcl/{record['id']}",
                category="extraction",
                messages=[
                    {"role": "system", "content": function_call_system_prompt(record["function"])},
                    *({"role": message["role"], "content": message["content"]} for message in conversation),
                ],
                prompt=None,
                reference=_ground_truth_call(answer) if answer else None,
                meta={"source": "bfcl", "bfcl_id": record["id"]},
            )
        )
    return tuple(items)
