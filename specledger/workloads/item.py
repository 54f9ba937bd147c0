"""The unit of a workload: one request, as chat messages, a raw prompt, or token ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Every built-in category, in report order. ``random`` is the random-token control.
CATEGORIES: tuple[str, ...] = (
    "code",
    "code-edit",
    "extraction",
    "agent",
    "dialogue",
    "summary",
    "math",
    "long",
    "random",
)

#: Roles a chat message may carry (SmolLM2's template knows no ``tool`` role).
CHAT_ROLES: frozenset[str] = frozenset({"system", "user", "assistant"})


@dataclass(frozen=True)
class WorkloadItem:
    """One request of a workload.

    Exactly one input form is meaningful: ``messages`` (chat), else ``prompt`` (plain
    completion), else ``meta["token_ids"]`` (the random-token control, already tokenised).
    ``reference`` is what a quality gate compares the output with (``None`` when the source
    has none); its shape depends on the category and is documented by each builder.
    """

    id: str
    category: str
    messages: list[dict] | None
    prompt: str | None
    reference: Any = None
    meta: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        """All input text joined (messages' contents, or the prompt): handy for sizes and hashing."""
        if self.messages is not None:
            return "\n".join(message["content"] for message in self.messages)
        return self.prompt or ""


def encode_item(loaded: Any, item: WorkloadItem) -> list[int]:
    """The item's prompt as token ids: its own ``meta["token_ids"]``, else its ``messages`` through the
    target's chat template, else its raw ``prompt`` (no template). ``loaded`` is the target's
    :class:`~specledger.engine.loader.LoadedModel` (anything with its ``encode_prompt``)."""
    if item.meta.get("token_ids"):
        return [int(t) for t in item.meta["token_ids"]]
    if item.messages:
        return loaded.encode_prompt(messages=item.messages)
    return loaded.encode_prompt(prompt=item.prompt, chat=False)


def user_message(content: str) -> dict:
    """A single chat message from the user."""
    return {"role": "user", "content": content}


def message_problem(messages: Any) -> str | None:
    """Why ``messages`` is not a valid chat (non-empty list of {role, content: str}), or ``None``."""
    if not isinstance(messages, list) or not messages:
        return '\'messages\' must be a non-empty list of {"role", "content"} objects'
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"messages[{position}] must be an object with 'role' and 'content'"
        role = message.get("role")
        if role not in CHAT_ROLES:
            return f"messages[{position}].role must be one of {sorted(CHAT_ROLES)}, got {role!r}"
        if not isinstance(message.get("content"), str):
            return f"messages[{position}].content must be a string"
    return None
