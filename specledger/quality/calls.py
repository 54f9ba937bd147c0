"""Function calls in model output: finding the JSON, and matching it to a reference.

Parsing: the first JSON object that decodes (at any ``{`` in the text, so code fences,
``<tool_call>`` tags and chatter around it are tolerated). A call is ``{"name": str,
"arguments": {...}}``; ``"parameters"``/``"args"`` are accepted for ``"arguments"`` and
arguments given as a JSON string are decoded (OpenAI style).

BFCL matching (``possible_answer`` format): every parameter maps to a list of acceptable
values, ``""`` among them meaning "may be omitted". A value matches an acceptable one when

* strings are equal after BFCL's standardisation (lowercase; spaces and ``,./-_*^`` removed),
* numbers are equal (an int is accepted for a float; booleans only match booleans),
* lists have the same length and match elementwise,
* dicts: an acceptable dict maps each key to acceptable values, recursively (keys with ``""``
  may be omitted, unknown keys fail).

Agent (ToolTalk) matching compares argument dicts exactly after dropping ``session_token``,
with strings compared case-insensitively and whitespace-collapsed.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

OPTIONAL = ""
_ARGUMENT_KEYS = ("arguments", "parameters", "args")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_BFCL_STRIP = re.compile(r"[ ,./\-_*^]")


def json_objects(text: str):
    """Yield every JSON object that decodes at a ``{`` of ``text``, left to right (non-overlapping)."""
    decoder = json.JSONDecoder()
    position = text.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            position = text.find("{", position + 1)
            continue
        if isinstance(value, dict):
            yield value
        position = text.find("{", end)


def first_json_object(text: str) -> dict | None:
    """The first decodable JSON object in ``text``, or None."""
    return next(json_objects(text), None)


def as_call(value: dict) -> tuple[str, dict] | None:
    """``(name, arguments)`` from a call object, or None when it is not one."""
    name = value.get("name")
    if not isinstance(name, str) and isinstance(value.get("function"), dict):
        return as_call(value["function"])
    if not isinstance(name, str):
        return None
    arguments: Any = next((value[key] for key in _ARGUMENT_KEYS if key in value), {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return name, arguments


def first_call(text: str) -> tuple[str, dict] | None:
    """The first call in the text: inside ``<tool_call>`` tags when present, else any JSON object."""
    for body in _TOOL_CALL.findall(text):
        for value in json_objects(body):
            call = as_call(value)
            if call is not None:
                return call
    for value in json_objects(text):
        call = as_call(value)
        if call is not None:
            return call
    return None


# ----------------------------------------------------------------------------- BFCL


def standardise(text: str) -> str:
    """BFCL's string standardisation: lowercase, spaces and ``,./-_*^`` removed, ' -> "."""
    return _BFCL_STRIP.sub("", text).lower().replace("'", '"')


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def value_matches(value: Any, acceptable: Any) -> bool:
    """Whether ``value`` matches one acceptable value (see the module doc for the rules)."""
    if isinstance(acceptable, bool):
        return isinstance(value, bool) and value == acceptable
    if _is_number(acceptable):
        return _is_number(value) and math.isclose(value, acceptable, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(acceptable, str):
        return isinstance(value, str) and standardise(value) == standardise(acceptable)
    if isinstance(acceptable, list):
        return (
            isinstance(value, list)
            and len(value) == len(acceptable)
            and all(value_matches(item, expected) for item, expected in zip(value, acceptable))
        )
    if isinstance(acceptable, dict):
        return isinstance(value, dict) and arguments_match(value, acceptable)
    return value == acceptable


def arguments_match(arguments: dict, possible: dict[str, list]) -> bool:
    """Every given argument is known and matches one of its acceptable values; omitted ones are optional."""
    for key, value in arguments.items():
        if key not in possible:
            return False
        if not any(value_matches(value, option) for option in possible[key] if option != OPTIONAL):
            return False
    return all(OPTIONAL in options for key, options in possible.items() if key not in arguments)


def _names_match(given: str, expected: str) -> bool:
    return given == expected or given == expected.replace(".", "_")


def bfcl_score(reference: dict, output: str) -> float:
    """1.0 right name and arguments; 0.5 right name, arguments differ; 0.0 no call JSON or wrong name."""
    call = first_call(output)
    if call is None or not _names_match(call[0], reference["name"]):
        return 0.0
    return 1.0 if arguments_match(call[1], reference["possible_arguments"]) else 0.5


# ----------------------------------------------------------------------------- agent

SESSION_TOKEN = "session_token"


def _loose(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.lower().split())
    if isinstance(value, list):
        return [_loose(item) for item in value]
    if isinstance(value, dict):
        return {key: _loose(item) for key, item in value.items()}
    if _is_number(value):
        return float(value)
    return value


def tool_arguments_equal(given: dict, expected: dict) -> bool:
    """Equal after dropping ``session_token`` and loosening strings (case, whitespace) and numbers."""
    strip = lambda arguments: {k: v for k, v in arguments.items() if k != SESSION_TOKEN}  # noqa: E731
    return _loose(strip(given)) == _loose(strip(expected))


def tool_call_score(reference: dict, output: str) -> float:
    """1.0 same tool and arguments (session token ignored); 0.5 same tool only; 0.0 otherwise."""
    call = first_call(output)
    if call is None or call[0] != reference["name"]:
        return 0.0
    return 1.0 if tool_arguments_equal(call[1], reference.get("arguments") or {}) else 0.5
