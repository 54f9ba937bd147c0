"""OpenAI-compatible request bodies, error bodies and response/chunk shapes (pure, no I/O).

Request bodies are pydantic models in strict mode: a wrong JSON type (``"temperature": "1"``,
``"max_tokens": true``) is a 400, never a silent coercion. Unknown fields are ignored, as
OpenAI-compatible servers do, except the fields in :data:`UNSUPPORTED` that would change the
answer (``logprobs``, ``tools``, ``response_format``, penalties, ...): asking for them is a 400
naming the field, never a silent no-op (their neutral values pass). ``null`` for an optional
field means "use the default". Text with a lone UTF-16 surrogate (``"\\ud800"``, valid JSON but
not Unicode) is a 400 naming where it is.

Defaults follow OpenAI / vLLM: temperature 1, top_p 1, top_k off, n 1, no stop strings;
``max_tokens`` defaults to 128, clipped to the room the context leaves after the prompt.

``stop``: at most :data:`MAX_STOP_STRINGS` (4, OpenAI's limit) strings of at most
:data:`MAX_STOP_CHARS` characters each, checked on the raw payload before anything else walks
it, so a body holding 100,000 stop strings is a 400 at once (each decode step searches every stop
string on the one engine thread that serves the whole batch).
"""

from __future__ import annotations

import time
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_MAX_TOKENS = 128
MAX_SEED = 2**63 - 1
#: OpenAI: "Up to 4 sequences where the API will stop generating further tokens".
MAX_STOP_STRINGS = 4
#: OpenAI states no length. 256 characters holds any real delimiter (closing tags, role markers such as
#: "\n\nHuman:", code fences) many times over, and bounds the engine's per-step cost: it holds back the last
#: ``longest stop - 1`` characters of output and searches each stop string over them, so a request costs at
#: most 4 searches of ~(255 + new text) characters per step and delays its stream by at most 255 characters.
MAX_STOP_CHARS = 256

#: engine stop reason -> OpenAI finish_reason
FINISH_REASONS: dict[str, str] = {"eos": "stop", "stop": "stop", "length": "length"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool | None = None


class SamplingFields(_Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # vLLM extension; -1 and 0 disable it
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None  # vLLM extension

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str | list[str]


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with an OpenAI-style error body."""

    def __init__(
        self, message: str, status: int = 400, kind: str = "invalid_request_error", code: str | None = None,
        headers: dict[str, str] | None = None, param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.kind, self.code, self.param = message, status, kind, code, param
        self.headers = headers or {}

    def body(self) -> ErrorBodyDict:
        return error_body(self.message, self.kind, self.code, self.param)


class ErrorDetailDict(TypedDict):
    """What went wrong, OpenAI's way: ``type`` the error class, ``param`` the field at fault, ``code`` a tag."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBodyDict(TypedDict):
    """OpenAI's error body."""

    error: ErrorDetailDict


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> ErrorBodyDict:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming the first offending field, e.g. ``temperature: Input should be ...``."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "body"
    return f"{where}: {first.get('msg', 'invalid value')}"


#: fields this server cannot honour -> the values that ask for nothing (accepted and ignored)
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None,),
    "response_format": (None, {"type": "text"}),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
}


def check_unsupported(payload: dict[str, Any]) -> None:
    """RequestError(400) for the first field of :data:`UNSUPPORTED` that asks for something."""
    for name, neutral in UNSUPPORTED.items():
        if name in payload and not any(type(payload[name]) is type(v) and payload[name] == v for v in neutral):
            raise RequestError(f"{name}: not supported by this server; omit it", param=name,
                               code="unsupported_parameter")


def _surrogate_at(value: Any, where: str) -> str | None:
    """The path of the first string (key or value) in ``value`` holding a lone surrogate, else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "body"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            found = _surrogate_at(key, path) or _surrogate_at(item, path)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _surrogate_at(item, f"{where}.{i}" if where else str(i))
            if found:
                return found
    return None


def check_stop(stop: Any) -> None:
    """RequestError(400, param "stop") for more than MAX_STOP_STRINGS stop strings or one longer than
    MAX_STOP_CHARS characters; cost O(MAX_STOP_STRINGS) whatever the list's length. Types are left
    to the model's validation (a non-string is a 400 there)."""
    items = stop if isinstance(stop, list) else [stop]
    if len(items) > MAX_STOP_STRINGS:
        raise RequestError(f"stop: at most {MAX_STOP_STRINGS} stop sequences are allowed, got {len(items)}",
                           param="stop")
    for i, item in enumerate(items):
        if isinstance(item, str) and len(item) > MAX_STOP_CHARS:
            where = "stop" if stop is item else f"stop.{i}"
            raise RequestError(f"{where}: a stop sequence may hold at most {MAX_STOP_CHARS} characters, "
                               f"got {len(item)}", param="stop")


def parse_body(model: type[_Body], payload: Any) -> Any:
    """Validate a decoded JSON payload into ``model``; RequestError(400) when it does not fit."""
    if not isinstance(payload, dict):
        raise RequestError("the request body must be a JSON object")
    if payload.get("stop") is not None:
        check_stop(payload["stop"])  # first: before anything walks a list of any length
    where = _surrogate_at(payload, "")
    if where is not None:
        raise RequestError(f"{where}: the text holds a lone UTF-16 surrogate (e.g. \\ud800), which is not "
                           "Unicode; send valid UTF-8 text", param=where)
    check_unsupported(payload)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise RequestError(describe_validation_error(exc)) from None


def completion_prompt(body: CompletionRequest) -> str:
    """The one prompt string of a completion request (a list must hold exactly one string)."""
    if isinstance(body.prompt, str):
        return body.prompt
    if len(body.prompt) != 1:
        raise RequestError(
            f"prompt: got a list of {len(body.prompt)} prompts; send exactly one prompt per request"
        )
    return body.prompt[0]


def chat_messages(body: ChatCompletionRequest) -> list[dict[str, str]]:
    """Messages as ``{"role", "content"}`` with text content (text parts joined, None -> "")."""
    out = []
    for i, m in enumerate(body.messages):
        if m.content is None:
            content = ""
        elif isinstance(m.content, str):
            content = m.content
        else:
            bad = [p.type for p in m.content if p.type != "text"]
            if bad:
                raise RequestError(f"messages.{i}.content: only text parts are supported, got {bad[0]!r}")
            content = "".join(p.text or "" for p in m.content)
        out.append({"role": m.role, "content": content})
    return out


def check_common(body: SamplingFields, served_model: str) -> None:
    """Checks pydantic cannot express: the model name and n == 1."""
    if body.model is not None and body.model != served_model:
        raise RequestError(f"The model `{body.model}` does not exist.", status=404, code="model_not_found")
    if body.n is not None and body.n != 1:
        raise RequestError(f"n: this server returns exactly one choice per request; got n={body.n}, use n=1")


def resolve_max_tokens(requested: int | None, prompt_tokens: int, max_context: int) -> int:
    """The request's max_tokens, or DEFAULT_MAX_TOKENS clipped to the context room when omitted.

    An explicit value is returned unchanged (the engine rejects prompt + max_tokens > context).
    """
    if requested is not None:
        return requested
    return max(1, min(DEFAULT_MAX_TOKENS, max_context - prompt_tokens))


# --- responses ------------------------------------------------------------------------------


Kind = Literal["completion", "chat"]


class UsageDict(TypedDict):
    """A response's token counts."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class MessageDict(TypedDict, total=False):
    """A chat message (non-streaming) or delta (streaming; each key only when it changes)."""

    role: str
    content: str


class _ChoiceKeys(TypedDict):
    index: int


class ChoiceDict(_ChoiceKeys, total=False):
    """The one choice of a response: ``text`` (completion), ``message`` (chat) or ``delta`` (chat stream);
    ``logprobs`` always None (not supported), ``finish_reason`` None until the last chunk."""

    text: str
    delta: MessageDict
    message: MessageDict
    logprobs: None
    finish_reason: str | None


class _ResponseKeys(TypedDict):
    id: str
    object: str  # "text_completion", "chat.completion" or "chat.completion.chunk"
    created: int  # Unix seconds
    model: str


class ResponseDict(_ResponseKeys, total=False):
    """A completion or chat completion, whole or one streamed chunk; ``usage`` on a whole response and on the
    ``include_usage`` chunk."""

    choices: list[ChoiceDict]
    usage: UsageDict


class ModelCardDict(TypedDict):
    """One served model of GET /v1/models (``max_model_len``: its context, in tokens; vLLM's field)."""

    id: str
    object: str
    created: int
    owned_by: str
    max_model_len: int


class ModelsListDict(TypedDict):
    """GET /v1/models."""

    object: str
    data: list[ModelCardDict]


def usage(prompt_tokens: int, completion_tokens: int) -> UsageDict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _envelope(kind: Kind, request_id: str, model: str, created: int, stream: bool) -> ResponseDict:
    if kind == "completion":
        obj = "text_completion"
    else:
        obj = "chat.completion.chunk" if stream else "chat.completion"
    return {"id": request_id, "object": obj, "created": created, "model": model}


def stream_chunk(
    kind: Kind, request_id: str, model: str, created: int, text: str | None,
    finish_reason: str | None = None, role: bool = False,
) -> ResponseDict:
    """One streamed chunk: ``choices[0].text`` (completion) or ``choices[0].delta`` (chat).

    For chat, ``role=True`` makes the opening ``{"role": "assistant", "content": ""}`` delta and
    ``text=None`` an empty delta (the closing chunk that carries only ``finish_reason``).
    """
    out = _envelope(kind, request_id, model, created, stream=True)
    if kind == "completion":
        choice: ChoiceDict = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    else:
        delta: MessageDict = {"role": "assistant", "content": ""} if role else {}
        if text is not None and not role:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    out["choices"] = [choice]
    return out


def usage_chunk(kind: Kind, request_id: str, model: str, created: int, prompt_tokens: int,
                completion_tokens: int) -> ResponseDict:
    """The final ``stream_options.include_usage`` chunk: empty choices, usage filled."""
    out = _envelope(kind, request_id, model, created, stream=True)
    out["choices"] = []
    out["usage"] = usage(prompt_tokens, completion_tokens)
    return out


def full_response(
    kind: Kind, request_id: str, model: str, text: str, finish_reason: str, prompt_tokens: int,
    completion_tokens: int, created: int | None = None,
) -> ResponseDict:
    """A non-streaming response with ``usage``."""
    out = _envelope(kind, request_id, model, created if created is not None else int(time.time()), stream=False)
    if kind == "completion":
        choice: ChoiceDict = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
    out["choices"] = [choice]
    out["usage"] = usage(prompt_tokens, completion_tokens)
    return out


def models_list(model: str, created: int, max_context: int) -> ModelsListDict:
    """GET /v1/models: the one served model."""
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "specledger",
                  "max_model_len": max_context}],
    }
