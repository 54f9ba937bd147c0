"""Long real inputs for the serving experiment's context grid: XSum documents, ToolTalk agent
sessions (concatenated until the length is reached), and a labelled padding control (a repeated
sentence: a control, not a workload)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specledger.errors import require

if TYPE_CHECKING:
    from specledger.workloads import WorkloadItem

CONTEXT_SOURCES = ("xsum", "agent", "padding")


def _xsum_documents(n: int, seed: int) -> list[str]:
    from specledger.workloads import load_category

    items = load_category("summary", max(4, n * 4), seed=seed)
    return [it.messages[-1]["content"] if it.messages else it.prompt for it in items]


def _agent_transcripts(n: int, seed: int) -> list[str]:
    """Whole ToolTalk sessions as text (system prompt with the API docs, user turns, tool calls and
    tool responses): the longest replay step of each conversation."""
    from specledger.workloads import load_category

    items = load_category("agent", max(40, n * 40), seed=seed)
    longest: dict[str, WorkloadItem] = {}
    for it in items:
        conv = it.meta.get("conversation", it.id)
        if conv not in longest or len(it.messages or []) > len(longest[conv].messages or []):
            longest[conv] = it
    return ["\n".join(f"[{m['role']}] {m['content']}" for m in it.messages or []) for it in longest.values()]


PADDING_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def long_context_prompts(loaded: Any, length: int, n: int, seed: int = 0, source: str = "xsum") -> list[list[int]]:
    """``n`` prompts of about ``length`` tokens (chat template included), whose last words ask for an
    answer about the start of the input.

    Sources: ``xsum`` (real XSum articles concatenated; "summarise the first article"), ``agent``
    (real ToolTalk sessions concatenated; "write the next tool call of the first session") and
    ``padding`` -- a labelled control, not a workload: one XSum article (at most a quarter of the
    length) after a filler sentence repeated up to the length (the haystack filler of long-context tests), so
    the context is long
    but trivially repetitive."""
    require(source in CONTEXT_SOURCES, f"unknown context source {source!r}; use {', '.join(CONTEXT_SOURCES)}")
    if source == "padding":
        docs = _xsum_documents(n, seed)
        ask = "\n\nSummarize the article above in one sentence."
        out = []
        for i in range(n):
            doc_ids = loaded.tokenizer.encode(docs[i % len(docs)])[: max(8, length // 4)]  # a quarter at most
            doc = loaded.tokenizer.decode(doc_ids)
            filler_tokens = max(16, length - len(doc_ids) - 64)
            per = max(1, len(loaded.tokenizer.encode(PADDING_SENTENCE)))
            filler = PADDING_SENTENCE * (filler_tokens // per + 1)
            body = loaded.tokenizer.decode(loaded.tokenizer.encode(filler)[:filler_tokens])
            out.append(loaded.encode_prompt(messages=[{"role": "user", "content": body + "\n\n" + doc + ask}]))
        return out
    want = max(n, length // 300 + 2)  # enough documents to reach the length (XSum articles run ~300-600 tokens)
    docs = _agent_transcripts(want, seed) if source == "agent" else _xsum_documents(want, seed)
    ask = ("\n\nWrite the next tool call of the first session." if source == "agent"
           else "\n\nSummarize the first article in one sentence.")
    out = []
    for i in range(n):
        text, j = "", i
        while True:
            text += docs[j % len(docs)] + "\n\n"
            j += 1
            ids = loaded.encode_prompt(messages=[{"role": "user", "content": text + ask}])
            if len(ids) >= length or j - i > len(docs):
                break
        body = loaded.tokenizer.encode(text)[: max(16, length - 48)]
        out.append(loaded.encode_prompt(messages=[{"role": "user", "content": loaded.tokenizer.decode(body) + ask}]))
    return out
