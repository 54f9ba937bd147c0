"""Task metrics for the quality gate: a task metric of the speculative output against the plain baseline's.

:func:`score` rates one model reply to one :class:`~specledger.workloads.WorkloadItem` in
[0, 1], or returns None where the category has no automatic metric:

==========  =====================================================================================
code        pass@1: HumanEval ``check(entry_point)`` on the reply's code, run in a subprocess
code-edit   pass@1 of the edited program (the whole reply) against the same tests
extraction  BFCL call match: 1 name + arguments, 0.5 name only, 0 no JSON / wrong name;
            MT-Bench extraction items have no reference -> None (ROUGE-L F1 if one is given)
agent       ToolTalk: tool call -> 1 same tool + arguments (session token ignored), 0.5 same tool;
            closing text -> ROUGE-L F1 vs the recorded assistant text
dialogue    None, except ROUGE-L F1 vs GPT-4's reference answer where MT-Bench ships one (weak proxy)
summary     ROUGE-L F1 vs the XSum reference summary
math        exact final answer vs the normalised ASDiv answer (numbers within 1e-4 relative)
random      None (random-token control)
==========  =====================================================================================

:func:`compare_quality` pairs per-prompt scores of the plain and speculative runs.
"""

from __future__ import annotations

from specledger.errors import SpecLedgerError
from specledger.workloads import WorkloadItem
from specledger.workloads.context_buckets import split_key

from .calls import bfcl_score, tool_call_score
from .code import pass_at_1, run_tests
from .math_answer import math_score
from .rouge import rouge_l_f1
from .sandbox import ExecutionResult, run_python
from .stats import compare_quality

#: Category -> the metric shown in the report.
METRIC_NAMES: dict[str, str] = {
    "code": "pass@1",
    "code-edit": "pass@1 (edited code)",
    "extraction": "JSON call match",
    "agent": "tool call match / ROUGE-L F1",
    "dialogue": "none (no automatic metric; ROUGE-L F1 vs reference answer as a weak proxy where one exists)",
    "summary": "ROUGE-L F1",
    "math": "exact answer",
    "long": "ROUGE-L F1 vs reference (best of the gold answers)",
    "random": "none (random-token control)",
}

REFERENCE_ROUGE = "ROUGE-L F1 vs reference (weak proxy)"


def metric_name(item: WorkloadItem) -> str | None:
    """The metric :func:`score` applies to this particular item, or None when it returns None."""
    if item.meta.get("quality") == "not assessed":  # user JSONL item without a usable reference
        return None
    category, reference = split_key(item.category)[0], item.reference
    if category in ("code", "code-edit", "summary", "math", "long"):
        return METRIC_NAMES[category]
    if category == "extraction":
        if isinstance(reference, dict):
            return METRIC_NAMES["extraction"]
        return REFERENCE_ROUGE if isinstance(reference, str) else None
    if category == "agent":
        return "tool call match" if _reference_type(item) == "tool_call" else "ROUGE-L F1"
    if category == "dialogue" and isinstance(reference, str):
        return REFERENCE_ROUGE
    return None


def _reference_type(item: WorkloadItem) -> str:
    reference = item.reference
    if isinstance(reference, dict) and reference.get("type") in ("tool_call", "text"):
        return reference["type"]
    if isinstance(reference, str):
        return "text"
    raise SpecLedgerError(
        f"item {item.id}: an agent reference must be a string or {{'type': 'tool_call'|'text', ...}}, "
        f"got {reference!r:.80}; fix the item's 'reference'"
    )


def _require_reference(item: WorkloadItem, keys: tuple[str, ...], shape: str) -> dict:
    reference = item.reference
    if not isinstance(reference, dict) or any(key not in reference for key in keys):
        raise SpecLedgerError(
            f"item {item.id}: category {item.category!r} needs a reference {shape}, "
            f"got {reference!r:.80}; fix the item's 'reference' or its category"
        )
    return reference


def _require_text(item: WorkloadItem) -> str:
    if not isinstance(item.reference, str):
        raise SpecLedgerError(
            f"item {item.id}: category {item.category!r} needs a reference text, "
            f"got {item.reference!r:.80}; fix the item's 'reference'"
        )
    return item.reference


def answer_complete(item: WorkloadItem, output_text: str, stop_reason: str | None) -> bool | None:
    """Whether a reply had room for what its task metric reads: True when it ended on its own (EOS or a
    stop string), or, cut at the token budget, still holds a whole function (code: the program parses
    and defines the entry point) or a stated answer (math: ``Answer: ...``); False when it was cut
    before; None for categories whose metric reads any text (summary, extraction, ...)."""
    if item.meta.get("quality") == "not assessed" or item.category not in ("code", "code-edit", "math"):
        return None
    if stop_reason != "length":
        return True
    if item.category == "math":
        from .math_answer import final_answer_text

        return final_answer_text(output_text) is not None
    reference = item.reference if isinstance(item.reference, dict) else {}
    if "entry_point" not in reference:
        return None
    from .code import candidate_program, defines, parses

    try:
        program = candidate_program(reference, output_text)
    except (KeyError, TypeError):
        return None
    return program is not None and parses(program) and defines(program, reference["entry_point"])


def score(item: WorkloadItem, output_text: str, timeout_s: float = 5.0) -> float | None:
    """The task score of ``output_text`` as the reply to ``item``, in [0, 1]; None without a metric.

    ``timeout_s`` bounds each code execution (code, code-edit). Model code never runs in this
    process. A built-in category whose item carries a malformed reference raises
    :class:`~specledger.errors.SpecLedgerError`; unknown (user) categories score None, and so do
    user items that the JSONL loader marked ``meta["quality"] = "not assessed"`` (no usable reference).
    """
    if item.meta.get("quality") == "not assessed":
        return None
    category = split_key(item.category)[0]  # a context bucket's decision key ("long@2-4k") scores as its category
    if category in ("code", "code-edit"):
        reference = _require_reference(item, ("test", "entry_point"), "{'prompt', 'test', 'entry_point'}")
        if reference.get("mode", "complete") != "full" and not isinstance(reference.get("prompt"), str):
            raise SpecLedgerError(
                f"item {item.id}: a completion reference needs the problem 'prompt' (or mode 'full')"
            )
        return pass_at_1(reference, output_text, timeout_s)
    if category == "math":
        if item.reference is None or isinstance(item.reference, (bool, dict)):
            raise SpecLedgerError(f"item {item.id}: a math item needs its answer as 'reference'")
        return math_score(item.reference, output_text)
    if category == "summary":
        return rouge_l_f1(output_text, _require_text(item))
    if category == "long":
        golds = item.reference if isinstance(item.reference, list) else [_require_text(item)]
        return max(rouge_l_f1(output_text, str(g)) for g in golds)
    if category == "extraction":
        if item.reference is None:
            return None
        if isinstance(item.reference, str):
            return rouge_l_f1(output_text, item.reference)
        reference = _require_reference(item, ("name", "possible_arguments"), "{'name', 'possible_arguments'}")
        return bfcl_score(reference, output_text)
    if category == "agent":
        if _reference_type(item) == "tool_call":
            reference = _require_reference(item, ("name",), "{'type': 'tool_call', 'name', 'arguments'}")
            return tool_call_score(reference, output_text)
        text = item.reference if isinstance(item.reference, str) else item.reference.get("text")
        if not isinstance(text, str):
            raise SpecLedgerError(f"item {item.id}: a text agent reference needs 'text'")
        return rouge_l_f1(output_text, text)
    if category == "dialogue" and isinstance(item.reference, str):
        return rouge_l_f1(output_text, item.reference)
    return None


__all__ = [
    "METRIC_NAMES",
    "answer_complete",
    "ExecutionResult",
    "compare_quality",
    "metric_name",
    "rouge_l_f1",
    "run_python",
    "run_tests",
    "score",
]
