"""The serving experiment's memory ledger: what speculation adds to memory under batching.

Candidate KV, predicted as B · γ · m_KV (m_KV = bytes of K and V per token from the model config:
2 · layers · kv_heads · head_dim · bytes per element, :mod:`specledger.ledger.memory`), against the
peak the engine actually reserved for candidates in its KV accounting and the static allocation of
the slot cache; plus what a drafter holds of its own (draft weights not shared with the target,
draft KV per request, :class:`DraftMemory`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specledger.bench.serving_types import DraftLedgerDict, DraftMemoryDict, MemoryLedgerDict
    from specledger.engine.model import Transformer


class DraftMemory:
    """Wraps a drafter factory to record what each request's drafter held: its KV cache bytes at
    the end of the request (a neural drafter's cache only grows during a request, so this is its
    peak) and, once, the bytes of draft weights not shared with the target."""

    def __init__(self, factory: Callable[[], Any], target: Transformer) -> None:
        self.factory, self.target = factory, target
        self.kv_per_request: list[int] = []
        self.weight_bytes: int | None = None
        self.kv_shape: Any = None

    def __call__(self) -> Any:
        d = self.factory()
        if self.weight_bytes is None:
            self.weight_bytes = own_weight_bytes(getattr(d, "model", None), self.target)
            self.kv_shape = draft_kv_shape(d)
        end = d.end

        def record_then_end(prompt: list[int], output: list[int]) -> None:
            self.kv_per_request.append(d.kv_bytes())
            end(prompt, output)

        d.end = record_then_end
        return d


def own_weight_bytes(model: Transformer, target: Transformer) -> int:
    """Bytes of ``model``'s parameters and buffers that do not share storage with ``target``'s."""
    if model is None:
        return 0
    shared = {t.untyped_storage().data_ptr() for t in [*target.parameters(), *target.buffers()]}
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in shared and ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
    return total


def model_kv_shape(model: Transformer, layers: Sequence[int] | None = None) -> Any:
    """The KV shape of ``model``'s forward over ``layers`` (default all), at its KV cache's element size (the
    model's activation dtype, :meth:`Transformer.new_cache`; a quantized model's packed weights are not it)."""
    from specledger.engine.bandwidth import kv_element_bytes

    return model.config.kv_shape(kv_element_bytes(model), len(layers) if layers else None)


def draft_kv_shape(drafter: Any) -> Any:
    """The KV bytes per token the drafter's forward needs (its layers only), or None without a model."""
    model = getattr(drafter, "model", None)
    if model is None or not getattr(drafter, "uses_model", False):
        return None
    return model_kv_shape(model, getattr(drafter, "layers", None))


def memory_ledger(model: Transformer, batch: int, gamma: int, engine_peak_candidates: int, slot_capacity: int,
                  slots: int | None = None, draft: DraftMemoryDict | None = None) -> MemoryLedgerDict:
    """Predicted candidate KV (B * gamma * m_KV) vs the engine's peak reserved candidates, bytes.

    ``batch`` is the batch size at the peak (B), ``slots`` the engine's sequence slots (default B):
    the static slot cache is slots * slot_capacity * m_KV, allocated whether speculation runs or not.

    ``draft`` (a point's ``draft_memory``) adds what a model drafter costs on top: its own weights
    (0 when it shares the target's, as layer-skip does) and its KV, predicted as
    B * (longest context + gamma + 1) * m_KV,draft (its layers only) against B times the largest
    draft cache one request actually allocated."""
    m_kv = model_kv_shape(model).bytes_per_token
    predicted = batch * gamma * m_kv
    actual = engine_peak_candidates * m_kv
    return {
        "m_kv_bytes_per_token": m_kv,
        "predicted_candidate_kv_bytes": predicted,
        "engine_peak_candidate_kv_bytes": actual,
        "relative_difference": (actual - predicted) / predicted if predicted else None,
        "batch": batch,
        "gamma": gamma,
        "static_slot_cache_bytes": (slots or batch) * slot_capacity * m_kv,
        "note": "the engine reserves candidate KV per step from the drafter's actual proposals; model-free "
        "drafters often propose fewer than gamma, so their reservation sits below B*gamma*m_KV",
    } | _draft_ledger(batch, gamma, predicted, actual, draft)


def _draft_ledger(batch: int, gamma: int, cand_predicted: int, cand_actual: int, draft: DraftMemoryDict | None
                  ) -> DraftLedgerDict:
    if not draft:
        return {}
    weights = int(draft.get("weight_bytes") or 0)
    per_token = int(draft.get("kv_bytes_per_token") or 0)
    kv_pred = batch * (int(draft.get("max_context_tokens") or 0) + gamma + 1) * per_token
    kv_actual = batch * int(draft.get("kv_bytes_per_request_max") or 0)
    return {
        "draft_weight_bytes": weights,
        "predicted_draft_kv_bytes": kv_pred,
        "engine_draft_kv_bytes": kv_actual,
        "draft_kv_relative_difference": (kv_actual - kv_pred) / kv_pred if kv_pred else None,
        "predicted_total_extra_bytes": cand_predicted + weights + kv_pred,
        "engine_total_extra_bytes": cand_actual + weights + kv_actual,
        "draft_note": "" if not kv_pred else "the draft cache is a static cache allocated for every layer of the "
        "draft model with its capacity rounded up (512 positions, doubling), so it exceeds what the draft "
        "layers fill; the difference is allocation granularity, not leaked memory",
    }
