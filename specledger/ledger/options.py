"""The ledger verb's options parsed into a :class:`~specledger.ledger.report.LedgerRequest`
(:func:`ledger_request`): number lists, γ lists, round-time scenarios (``--round-ms``, the split model of
``--draft-ms``/``--verify-ms``/``--other-ms``) and ``--example``'s worked inputs."""

from __future__ import annotations

from specledger.errors import SpecLedgerError, require
from specledger.ledger.acceptance import check_gamma
from specledger.ledger.expr import parse_cost_expression
from specledger.ledger.report import (
    EXAMPLE_ACCEPTANCE,
    EXAMPLE_BASE_MS,
    EXAMPLE_GAMMAS,
    EXAMPLE_SCENARIOS,
    LedgerRequest,
)
from specledger.ledger.speedup import ExpressionCostModel, SplitCostModel, parse_cost_model


def parse_number_list(text: str, what: str) -> list[float]:
    """``"0.9, 0.8,0.7"`` → floats; empty text or a non-number is a SpecLedgerError naming ``what``."""
    items = [item.strip() for item in text.split(",")] if text is not None else []
    require(any(items), f"{what} is empty; give comma-separated numbers, e.g. 0.9,0.8,0.7")
    numbers: list[float] = []
    for item in items:
        try:
            numbers.append(float(item))
        except ValueError:
            raise SpecLedgerError(f"{what}: {item!r} is not a number; give comma-separated numbers") from None
    return numbers


def _numbers(text: str | None, what: str) -> list[float] | None:
    """:func:`parse_number_list` of an option given, None for one not given."""
    return parse_number_list(text, what) if text is not None else None


def parse_gamma_list(text: str) -> list[int]:
    """``"1,2,4,8"`` → [1, 2, 4, 8]; each γ a whole number ≥ 0."""
    gammas: list[int] = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = int(item)
        except ValueError:
            raise SpecLedgerError(
                f"gamma {item!r} is not a whole number; give e.g. --gamma 1,2,4,8"
            ) from None
        gammas.append(check_gamma(value))
    return gammas


def split_model(draft: str | None, verify: str | None, other: str | None) -> SplitCostModel:
    require(
        verify is not None, "--draft-ms/--other-ms need --verify-ms as well (the target's verify time in k)"
    )
    return SplitCostModel(
        draft=parse_cost_expression(draft or "0"),
        verify=parse_cost_expression(verify),
        other=parse_cost_expression(other or "0"),
    )


def ledger_request(
    *, acceptance: float | None = None, acceptance_chain: str | None = None, histogram: str | None = None,
    per_position: str | None = None, gamma: str | None = None, base_ms: float | None = None,
    round_ms: list[str] | None = None, draft_ms: str | None = None, verify_ms: str | None = None,
    other_ms: str | None = None, optimal: bool = False, max_gamma: int = 16, tree_budget: int | None = None,
    sibling_acceptance: str | None = None, tree_max_depth: int | None = None, kv: str | None = None,
    batch: int = 1, kv_bytes: int | None = None, block_size: int | None = None, four_way: str | None = None,
    example: bool = False, context: int | None = None, weight_bytes: float | None = None,
) -> LedgerRequest:
    """The request the ledger verb's options make (the options as typed; lists as comma-separated text)."""
    req = LedgerRequest(
        acceptance=acceptance,
        acceptance_chain=_numbers(acceptance_chain, "--acceptance-chain"),
        histogram=_numbers(histogram, "--histogram"),
        per_position=_numbers(per_position, "--per-position"),
        gammas=parse_gamma_list(gamma) if gamma is not None else None,
        base_ms=base_ms,
        optimal=optimal,
        max_gamma=max_gamma,
        tree_budget=tree_budget,
        sibling_acceptance=_numbers(sibling_acceptance, "--sibling-acceptance"),
        tree_max_depth=tree_max_depth,
        kv=kv,
        batch=batch,
        kv_bytes=kv_bytes,
        block_size=block_size,
        four_way=_numbers(four_way, "--four-way"),
        context=context,
        weight_bytes=weight_bytes,
    )
    for index, text in enumerate(round_ms or [], start=1):
        req.scenarios.append(
            (f"scenario {index}" if len(round_ms or []) > 1 else "scenario", parse_cost_model(text))
        )
    if draft_ms is not None or verify_ms is not None or other_ms is not None:
        req.scenarios.append(("split round", split_model(draft_ms, verify_ms, other_ms)))
    if example:
        clashing = [
            name
            for name, value in (
                ("--acceptance", acceptance),
                ("--acceptance-chain", acceptance_chain),
                ("--histogram", histogram),
                ("--per-position", per_position),
                ("--gamma", gamma),
                ("--base-ms", base_ms),
                ("--round-ms", round_ms or None),
                ("--verify-ms", verify_ms),
                ("--draft-ms", draft_ms),
                ("--other-ms", other_ms),
            )  # fmt: skip
            if value is not None
        ]
        require(not clashing, f"--example sets its own inputs; drop {', '.join(clashing)}")
        req.acceptance = EXAMPLE_ACCEPTANCE
        req.gammas = list(EXAMPLE_GAMMAS)
        req.base_ms = EXAMPLE_BASE_MS
        req.scenarios = [
            (label, ExpressionCostModel(parse_cost_expression(text))) for label, text in EXAMPLE_SCENARIOS
        ]
    return req
