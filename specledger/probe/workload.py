"""What a probe sends: built-in prompts, a user JSONL, or built-in categories (scored), each item
with an id so two endpoints pair prompt by prompt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specledger.errors import SpecLedgerError
from specledger.probe.loadgen import PromptItem, read_jsonl_objects, to_prompt_item
from specledger.workloads import WorkloadItem

BUILTIN_CATEGORY = "builtin"
USER_CATEGORY = "custom"  # the category a JSONL item without one gets (as specledger.workloads.load_jsonl)
BUILTIN_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in three sentences why the sky is blue.",
    "List five prime numbers greater than 100 and say how you checked them.",
    "Translate to French: 'The meeting is moved to Thursday at noon.'",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "Give a SQL query that counts orders per customer in a table orders(customer_id, id).",
    "What is the difference between a process and a thread?",
    "Continue the sequence and explain the rule: 2, 6, 12, 20, 30, ...",
)



@dataclass
class ProbeWorkload:
    """What the probe sends (``items``, each with its id) and what each id is (``entries``)."""

    items: list[PromptItem]
    entries: dict[str, WorkloadItem]
    source: str
    warnings: list[str] = field(default_factory=list)

    def category_of(self, prompt_id: str | None) -> str:
        entry = self.entries.get(prompt_id or "")
        return entry.category if entry is not None else USER_CATEGORY

    def score_of(self, prompt_id: str | None, text: str) -> tuple[float | None, str | None]:
        """(task score, None) or (None, why it could not be scored) -- see :func:`specledger.quality.score`."""
        from specledger.quality import score

        entry = self.entries.get(prompt_id or "")
        if entry is None:
            return None, None
        try:
            return score(entry, text), None
        except SpecLedgerError as exc:
            return None, str(exc)

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "prompts": {pid: {"category": e.category} for pid, e in self.entries.items()},
            "warnings": list(self.warnings),
        }


def _check_unique(ids: Sequence[str], where: str) -> None:
    seen: set[str] = set()
    for pid in ids:
        if pid in seen:
            raise SpecLedgerError(f"{where}: id {pid!r} appears twice; give every workload item its own id")
        seen.add(pid)


def workload_from_prompts(prompts: Sequence[str], category: str = BUILTIN_CATEGORY) -> ProbeWorkload:
    """Plain prompt strings; ids ``<category>/<i>``, no reference (quality not scored)."""
    if not prompts:
        raise SpecLedgerError("the workload has no prompts; give at least one")
    entries = {
        f"{category}/{i}": WorkloadItem(id=f"{category}/{i}", category=category, messages=None, prompt=p)
        for i, p in enumerate(prompts)
    }
    items = [PromptItem(prompt=e.prompt, id=pid) for pid, e in entries.items()]
    return ProbeWorkload(items=items, entries=entries, source="built-in prompts")


def workload_from_jsonl(path: str | Path) -> ProbeWorkload:
    """A JSONL of ``{prompt}`` or ``{messages}`` (+ optional ``id``, ``category``, ``reference``,
    ``max_tokens``); ``id`` defaults to ``<file stem>/<line>`` and ``category`` to ``custom``, as in
    :func:`specledger.workloads.load_jsonl`. Items with a built-in category and a reference are scored."""
    path = Path(path)
    items: list[PromptItem] = []
    entries: dict[str, WorkloadItem] = {}
    for number, obj in read_jsonl_objects(path):
        where = f"{path}:{number}"
        item = to_prompt_item(obj, where=where)
        pid = item.id or f"{path.stem}/{number}"
        category = obj.get("category", USER_CATEGORY) if isinstance(obj, dict) else USER_CATEGORY
        if not isinstance(category, str) or not category.strip():
            raise SpecLedgerError(f"{where}: 'category' must be a non-empty string")
        if pid in entries:
            raise SpecLedgerError(f"{where}: id {pid!r} appears twice; give every workload item its own id")
        entries[pid] = WorkloadItem(
            id=pid,
            category=category.strip(),
            messages=item.messages,
            prompt=item.prompt,
            reference=obj.get("reference") if isinstance(obj, dict) else None,
            meta={"source": "jsonl", "line": number},
        )
        items.append(PromptItem(prompt=item.prompt, messages=item.messages, max_tokens=item.max_tokens, id=pid))
    if not items:
        raise SpecLedgerError(f"{path} has no prompts; give at least one JSON line with 'prompt' or 'messages'")
    return ProbeWorkload(items=items, entries=entries, source=str(path))


def workload_from_categories(categories: Sequence[str], n: int, seed: int = 0) -> ProbeWorkload:
    """``n`` items per built-in category (seeded, as ``specledger run``), scored by the quality metrics."""
    from specledger.workloads import CATEGORIES, load_category

    if n < 1:
        raise SpecLedgerError("--n must be at least 1")
    loaded: list[WorkloadItem] = []
    for category in categories:
        if category == "random":
            raise SpecLedgerError("category 'random' is token ids, not text; an endpoint needs text prompts")
        if category not in CATEGORIES:
            raise SpecLedgerError(f"unknown category {category!r}; choose from {', '.join(CATEGORIES[:-1])}")
        loaded += load_category(category, n, seed=seed)
    _check_unique([it.id for it in loaded], "built-in workload")
    entries = {it.id: it for it in loaded}
    items = [PromptItem(prompt=it.prompt, messages=it.messages, id=it.id) for it in loaded]
    return ProbeWorkload(items=items, entries=entries, source=f"categories {','.join(categories)} (n={n}, seed={seed})")


def select_workload(workload: Path | None, categories: str | None, n: int, seed: int) -> ProbeWorkload:
    """--workload JSONL, else --categories (built-in, scored), else the built-in prompts."""
    if workload is not None:
        return workload_from_jsonl(workload)
    if categories:
        names = [c.strip() for c in categories.split(",") if c.strip()]
        if not names:
            raise SpecLedgerError("--categories is empty; give names such as code,math")
        return workload_from_categories(names, n, seed)
    return workload_from_prompts(BUILTIN_PROMPTS)


__all__ = [
    "BUILTIN_PROMPTS",
    "ProbeWorkload",
    "select_workload",
    "workload_from_categories",
    "workload_from_jsonl",
    "workload_from_prompts",
]
