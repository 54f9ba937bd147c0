"""ToolTalk (nvidia-tooltalk 26.3): agent trajectories replayed step by step.

Each conversation file (``data/easy/*.json``, ``data/tooltalk/*.json``) has ``metadata``
(location, timestamp, maybe username/session_token), ``suites_used``, ``apis_used`` and a
``conversation`` of ``{"role": "user"|"assistant", "text", "apis"?: [{"request": {"api_name",
"parameters"}, "response", "exception"}]}`` turns.

Rendering (SmolLM2's chat template has no ``tool`` role, so tool traffic is text):

* system: ToolTalk's own prompt ("You are a helpful assistant. Here is some user data: ...")
  plus the documentation of every API in the suites used (read from ``tooltalk/apis/*.py`` by
  parsing, never importing) and the call format.
* a tool call is an assistant message ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
* its result is the next *user* message ``<tool_response>{"name": ..., "response": ...,
  "exception": ...}</tool_response>`` (ToolTalk's function-message payload).

Every assistant step is one item: each tool call, and the assistant's closing text. The item's
messages are the conversation up to that step (always ending with a user message), so later
steps of a conversation extend earlier ones -- the prefix recurrence agents produce.
Reference: ``{"type": "tool_call", "name", "arguments", "text"}`` or ``{"type": "text", "text"}``,
where ``text`` is the exact assistant message.
"""

from __future__ import annotations

import ast
import json
from functools import lru_cache
from pathlib import Path

from .item import WorkloadItem, user_message
from .packages import TOOLTALK, package_dir
from .readers import read_json

TOOLTALK_SUBSETS: tuple[str, ...] = ("easy", "tooltalk")
# ToolTalk's executor injects the token into authenticated calls and its recorded calls carry it,
# so the rendered documentation lists it as a parameter.
_SESSION_TOKEN_PARAMETER = {"type": "string", "description": "The user's session_token.", "required": True}


def tooltalk_root() -> Path:
    return package_dir(TOOLTALK)


def conversation_files(root: Path) -> tuple[Path, ...]:
    """All conversation files, subset by subset, sorted by name."""
    return tuple(
        path for subset in TOOLTALK_SUBSETS for path in sorted((root / "data" / subset).glob("*.json"))
    )


def _class_literals(node: ast.ClassDef) -> dict:
    """Class-level ``name = <literal>`` assignments (``apis = [A, B]`` is kept as class names)."""
    values: dict = {}
    for statement in node.body:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
            continue
        target = statement.targets[0]
        if not isinstance(target, ast.Name):
            continue
        value = statement.value
        if isinstance(value, ast.List) and all(isinstance(element, ast.Name) for element in value.elts):
            values[target.id] = [element.id for element in value.elts]
            continue
        try:
            values[target.id] = ast.literal_eval(value)
        except ValueError:
            continue
    return values


@lru_cache(maxsize=4)
def parse_api_docs(apis_dir: Path) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """``(api name -> {"name", "description", "parameters"}, suite name -> [api names])``.

    Read from the source of ``tooltalk/apis/*.py`` with :mod:`ast`; an API is a class with
    literal ``description`` and ``parameters`` (plus ``session_token`` when ``requires_auth``);
    a suite is a class with ``name`` and ``apis``.
    """
    apis: dict[str, dict] = {}
    suites: dict[str, list[str]] = {}
    for path in sorted(apis_dir.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            literals = _class_literals(node)
            if isinstance(literals.get("apis"), list) and isinstance(literals.get("name"), str):
                suites[literals["name"]] = literals["apis"]
            elif isinstance(literals.get("description"), str) and isinstance(
                literals.get("parameters"), dict
            ):
                parameters = dict(literals["parameters"])
                if literals.get("requires_auth") is True:
                    parameters["session_token"] = dict(_SESSION_TOKEN_PARAMETER)
                apis[node.name] = {
                    "name": node.name,
                    "description": literals["description"],
                    "parameters": parameters,
                }
    return apis, suites


def _tools_for(conversation: dict, apis: dict[str, dict], suites: dict[str, list[str]]) -> list[dict]:
    names: list[str] = []
    for suite in conversation.get("suites_used", []):
        names.extend(suites.get(suite, []))
    names.extend(conversation.get("apis_used", []))
    unique = list(dict.fromkeys(names))
    return [apis.get(name, {"name": name}) for name in unique]


def agent_system_prompt(metadata: dict, tools: list[dict]) -> str:
    """ToolTalk's system prompt (user data), the tool documentation, and the call format."""
    lines = [
        "You are a helpful assistant. Here is some user data:",
        f"location: {metadata.get('location')}",
        f"timestamp: {metadata.get('timestamp')}",
        f"username (if logged in): {metadata.get('username')}",
    ]
    if metadata.get("session_token"):
        lines.append(f"session_token: {metadata['session_token']}")
    lines += ["", "You can call these tools:"]
    lines += [json.dumps(tool, ensure_ascii=False) for tool in tools]
    lines += [
        "",
        'To call a tool, reply with only <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>. '
        "Its result comes back as <tool_response>...</tool_response>. Otherwise reply to the user in plain text.",
    ]
    return "\n".join(lines)


def tool_call_text(name: str, arguments: dict) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        + "</tool_call>"
    )


def tool_response_text(name: str, response, exception) -> str:
    payload = {"name": name, "response": response, "exception": exception}
    return "<tool_response>" + json.dumps(payload, ensure_ascii=False) + "</tool_response>"


def conversation_items(conversation: dict, subset: str, system_prompt: str) -> list[WorkloadItem]:
    """One item per assistant step (tool call or closing text) of one conversation."""
    name = conversation["name"]
    history: list[dict] = [{"role": "system", "content": system_prompt}]
    items: list[WorkloadItem] = []

    def emit(reference: dict) -> None:
        step = len(items)
        items.append(
            WorkloadItem(
                id=f"agent/{subset}/{name}/{step}",
                category="agent",
                messages=[dict(message) for message in history],
                prompt=None,
                reference=reference,
                meta={
                    "source": f"tooltalk-{subset}",
                    "conversation": name,
                    "step": step,
                    "step_kind": reference["type"],
                },
            )
        )

    for turn in conversation["conversation"]:
        if turn["role"] == "user":
            history.append(user_message(turn["text"]))
            continue
        for call in turn.get("apis") or []:
            api_name, arguments = call["request"]["api_name"], call["request"]["parameters"]
            call_text = tool_call_text(api_name, arguments)
            emit({"type": "tool_call", "name": api_name, "arguments": arguments, "text": call_text})
            history.append({"role": "assistant", "content": call_text})
            history.append(user_message(tool_response_text(api_name, call["response"], call["exception"])))
        emit({"type": "text", "text": turn["text"]})
        history.append({"role": "assistant", "content": turn["text"]})
    return items


@lru_cache(maxsize=4)
def build_agent_items(root: Path) -> tuple[WorkloadItem, ...]:
    """Every assistant step of every ToolTalk conversation (easy, then tooltalk; files sorted)."""
    apis, suites = parse_api_docs(root / "apis")
    items: list[WorkloadItem] = []
    for path in conversation_files(root):
        conversation = read_json(path)
        tools = _tools_for(conversation, apis, suites)
        system_prompt = agent_system_prompt(conversation.get("metadata", {}), tools)
        items.extend(conversation_items(conversation, path.parent.name, system_prompt))
    return tuple(items)
