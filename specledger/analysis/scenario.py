"""Scenarios: which requests are compared with which.

A scenario is (category, temperature, drafter, gamma). Its baseline is the plain-decoding
scenario (drafter :data:`BASELINE_DRAFTER`) of the same category and temperature, and the comparison is
*paired*: only prompts (``prompt_id``) present on both sides count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from specledger.engine.drafters.catalog import PLAIN
from specledger.records import GammaSpec, RequestRecord
from specledger.workloads.context_buckets import decision_order

BASELINE_DRAFTER = PLAIN.name


@dataclass(frozen=True)
class ScenarioKey:
    category: str
    temperature: float
    drafter: str
    gamma: GammaSpec  # static gamma, or the name of a per-round policy
    tree_budget: int = 0  # token-tree nodes per round (0: chains)

    @property
    def is_baseline(self) -> bool:
        return self.drafter == BASELINE_DRAFTER

    @property
    def group(self) -> tuple[str, float]:
        """The verdict group: one decision per (category, temperature)."""
        return (self.category, self.temperature)

    @property
    def label(self) -> str:
        if self.is_baseline:
            return f"{self.category} T={self.temperature:g} plain"
        tree = f" tree={self.tree_budget}" if self.tree_budget else ""
        return f"{self.category} T={self.temperature:g} {self.drafter} γ={self.gamma}{tree}"

    def as_dict(self) -> dict[str, object]:
        return {
            "category": self.category,
            "temperature": self.temperature,
            "drafter": self.drafter,
            "gamma": self.gamma,
            "tree_budget": self.tree_budget,
            "label": self.label,
        }


def key_of(record: RequestRecord) -> ScenarioKey:
    """The scenario a request belongs to; the baseline's gamma is normalised to 0."""
    drafter = record.drafter or BASELINE_DRAFTER
    gamma = 0 if drafter == BASELINE_DRAFTER else record.gamma
    tree = 0 if drafter == BASELINE_DRAFTER else int(getattr(record, "tree_budget", 0) or 0)
    return ScenarioKey(record.category or "default", float(record.temperature), drafter, gamma, tree)


def sort_key(key: ScenarioKey) -> tuple:
    """Category (its context buckets in length order), temperature, baseline first, drafter, numeric gammas before
    policy names."""
    gamma = key.gamma
    numeric = isinstance(gamma, int) or (isinstance(gamma, str) and gamma.isdigit())
    return (
        decision_order(key.category),
        key.temperature,
        not key.is_baseline,
        key.drafter,
        0 if numeric else 1,
        int(gamma) if numeric else 0,
        str(gamma),
        key.tree_budget,
    )


def group_scenarios(records: Iterable[RequestRecord]) -> dict[ScenarioKey, list[RequestRecord]]:
    """Records grouped by scenario, in :func:`sort_key` order."""
    groups: dict[ScenarioKey, list[RequestRecord]] = defaultdict(list)
    for r in records:
        groups[key_of(r)].append(r)
    return {k: groups[k] for k in sorted(groups, key=sort_key)}


def baseline_key(key: ScenarioKey) -> ScenarioKey:
    return ScenarioKey(key.category, key.temperature, BASELINE_DRAFTER, 0)


def by_prompt(records: Iterable[RequestRecord]) -> dict[str, list[RequestRecord]]:
    """Records per prompt id (a missing id falls back to the request id, so it pairs with nothing)."""
    out: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        out[r.prompt_id or f"request:{r.request_id}"].append(r)
    return dict(out)


def shared_prompts(spec: Iterable[RequestRecord], base: Iterable[RequestRecord]) -> list[str]:
    """Prompt ids present in both lists, sorted."""
    return sorted(set(by_prompt(spec)) & set(by_prompt(base)))


def restrict(records: Iterable[RequestRecord], prompt_ids: Iterable[str]) -> list[RequestRecord]:
    """Only the records whose prompt is in ``prompt_ids``."""
    wanted = set(prompt_ids)
    return [r for r in records if (r.prompt_id or f"request:{r.request_id}") in wanted]
