"""What a probe sends: built-in prompts, a user JSONL, or built-in categories (scored), each item
with an id so two endpoints pair prompt by prompt.

The items are *interleaved by category* (:func:`interleave_by_category`: the first prompt of every category,
then the second of every category, ...), so the first N requests of a probe draw from every category of the
workload, not from the file's first category alone; every configuration and the baseline get the same items in
the same order. A race (``--budget``) draws each category's prompts in that order (:meth:`ProbeWorkload.pool`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from specledger.errors import SpecLedgerError
from specledger.probe.loadgen import PromptItem, _count_tokens
from specledger.workloads import WorkloadItem, load_jsonl

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


class PromptCategory(TypedDict):
    """One prompt in :class:`WorkloadDoc`: its category."""

    category: str


class WorkloadDoc(TypedDict):
    """:meth:`ProbeWorkload.describe`: run.json's ``workload`` of a probe."""

    source: str  # where the prompts came from
    prompts: dict[str, PromptCategory]  # prompt id -> its category
    warnings: list[str]


@dataclass
class ProbeWorkload:
    """What the probe sends (``items``, each with its id) and what each id is (``entries``)."""

    items: list[PromptItem]
    entries: dict[str, WorkloadItem]
    source: str
    warnings: list[str] = field(default_factory=list)
    #: the traffic's shares per category for the one recommendation over all of them (``--mix``); None: each
    #: category's share of the workload's prompts (:func:`specledger.gates.mix.mix_weights`)
    mix: dict[str, float] | None = None

    def counts(self) -> dict[str, int]:
        """Prompts per category: the traffic's shares when no ``mix`` is given."""
        out: dict[str, int] = {}
        for it in self.items:
            out[self.category_of(it.id)] = out.get(self.category_of(it.id), 0) + 1
        return out

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

    def categories(self) -> list[str]:
        """The workload's categories, in the order their first prompt appears."""
        return list(dict.fromkeys(self.category_of(it.id) for it in self.items))

    def pool(self) -> dict[str, list[str]]:
        """Every category's prompt ids in workload order: what a race draws from, the same for every
        configuration and the baseline."""
        out: dict[str, list[str]] = {c: [] for c in self.categories()}
        for it in self.items:
            out[self.category_of(it.id)].append(str(it.id))
        return out

    def describe(self) -> WorkloadDoc:
        return {
            "source": self.source,
            "prompts": {pid: {"category": e.category} for pid, e in self.entries.items()},
            "warnings": list(self.warnings),
        }


def interleave_by_category(items: Sequence[PromptItem], category_of: Any) -> list[PromptItem]:
    """``items`` round-robin over their categories (each category's own order kept; categories in the order
    their first item appears): the i-th prompt of every category before the (i+1)-th of any, so any prefix of
    the list is spread over every category as evenly as it can be."""
    groups: dict[str, list[PromptItem]] = {}
    for it in items:
        groups.setdefault(category_of(it.id), []).append(it)
    out: list[PromptItem] = []
    for rank in range(max((len(g) for g in groups.values()), default=0)):
        out += [g[rank] for g in groups.values() if rank < len(g)]
    return out


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
    ``max_tokens``), read by :func:`specledger.workloads.load_jsonl`, the reader ``run`` uses too: the same
    ids (``<file stem>/<line>`` by default), categories (``custom``), one rule for a malformed line (the whole
    file refused, the line named) and warnings folded per kind. Items with a built-in category and a
    reference are scored."""
    loaded, warnings = load_jsonl(path)
    entries = {it.id: it for it in loaded}
    items = [PromptItem(prompt=it.prompt, messages=it.messages, max_tokens=it.meta.get("max_tokens"), id=it.id)
             for it in loaded]
    workload = ProbeWorkload(items=items, entries=entries, source=str(path), warnings=list(warnings))
    workload.items = interleave_by_category(items, workload.category_of)
    return workload


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
    workload = ProbeWorkload(items=items, entries=entries,
                             source=f"categories {','.join(categories)} (n={n}, seed={seed})")
    workload.items = interleave_by_category(items, workload.category_of)
    return workload


#: characters per token where no tokenizer is given (English prose and code with a BPE vocabulary: 3.5-4.5)
CHARS_PER_TOKEN = 4.0


def prompt_tokens(entry: WorkloadItem, tokenizer: Any = None) -> int:
    """A prompt's length in tokens: the tokenizer's count of its text, else characters / :data:`CHARS_PER_TOKEN`
    (an estimate; the buckets' edges are powers of two, so a ~10 % error moves few prompts)."""
    if tokenizer is not None:
        return _count_tokens(tokenizer, entry.text)
    return int(len(entry.text) / CHARS_PER_TOKEN)


def split_by_context(workload: ProbeWorkload, tokenizer: Any = None, n: int = 2) -> ProbeWorkload:
    """The workload with every category whose prompts fall in two or more context buckets (at least ``n`` prompts
    in each) split into them (``"docs@2-4k"``), as ``run`` decides (:mod:`specledger.mainjob.buckets`); the items
    re-interleaved by the new categories."""
    from specledger.mainjob.buckets import split_initial

    entries = list(workload.entries.values())
    by_category: dict[str, list[WorkloadItem]] = {}
    for e in entries:
        by_category.setdefault(e.category, []).append(e)
    split, bucketed = split_initial(entries, by_category, lambda e: prompt_tokens(e, tokenizer), n, keep_all=True)
    if not bucketed:
        return workload
    workload.entries = {e.id: e for e in split}
    workload.items = interleave_by_category(workload.items, workload.category_of)
    return workload


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
    "interleave_by_category",
    "select_workload",
    "split_by_context",
    "workload_from_categories",
    "workload_from_jsonl",
    "workload_from_prompts",
]
