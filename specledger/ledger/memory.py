"""Memory ledger for speculation.

Extra target KV reserved for candidates, as a rough upper bound:

    M_candidate ≈ B · γ · m_KV,   m_KV = layers × 2 (K and V) × kv_heads × head_dim × bytes/element

plus, for a separate draft model, its weights and its own KV (B · (context + γ) · m_KV_draft).
With paged KV (block size b tokens) the reservation per request rounds up to ⌈γ/b⌉·b tokens.
A tree round writes one KV slot per node, so a tree's reservation counts its nodes, not its depth
(:func:`candidate_tokens`). This ignores lookahead slots and shared prefixes; the engine's
allocator and logs are the real answer.

Bytes read, the other side of the KV (one formula for every bandwidth line and the ledger):

    bytes read per step = W + B · c · m_KV

the weights W once, plus every request's keys and values over its context of c tokens
(:func:`step_read_bytes`; for plain decoding at B = 1 that is the bytes per token).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger.errors import SpecLedgerError, require
from specledger.ledger.acceptance import check_gamma

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "float16": 2, "half": 2, "fp16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "int8": 1, "uint8": 1,
}  # fmt: skip


@dataclass(frozen=True)
class KVShape:
    """What one token of KV cache costs: layers × 2 × kv_heads × head_dim × bytes_per_element."""

    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_element: int = 2

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim", "bytes_per_element"):
            value = getattr(self, name)
            require(
                isinstance(value, int) and not isinstance(value, bool) and value > 0,
                f"KV {name} is {value!r}; it must be a positive integer",
            )

    @property
    def bytes_per_token(self) -> int:
        """m_KV = layers × 2 × kv_heads × head_dim × bytes per element."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.bytes_per_element


SMOLLM2_135M = KVShape(layers=30, kv_heads=3, head_dim=64, bytes_per_element=2)
"""SmolLM2-135M: 30 layers, 9 query heads, 3 KV heads, hidden 576 → head_dim 64; bf16 KV."""

BUILTIN_KV_SHAPES: dict[str, KVShape] = {"smollm2": SMOLLM2_135M, "smollm2-135m": SMOLLM2_135M}


def _positive_int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    require(
        isinstance(value, int) and not isinstance(value, bool) and value > 0,
        f"model config key {key!r} is {value!r}; it must be a positive integer",
    )
    return int(value)


def kv_shape_from_config(config: Mapping[str, Any], bytes_per_element: int | None = None) -> KVShape:
    """KV shape from a Hugging Face ``config.json`` dict.

    Uses ``num_hidden_layers``, ``num_key_value_heads`` (default: ``num_attention_heads``, i.e.
    no GQA) and ``head_dim`` (default: ``hidden_size // num_attention_heads``). Bytes per element
    come from ``bytes_per_element`` if given, else ``torch_dtype``/``dtype`` in the config, else 2.
    """
    require(isinstance(config, Mapping), "model config must be a JSON object (a config.json dict)")
    if "text_config" in config and "num_hidden_layers" not in config:
        config = config["text_config"]
    layers = _positive_int(config, "num_hidden_layers")
    heads = _positive_int(config, "num_attention_heads")
    kv_heads = (
        _positive_int(config, "num_key_value_heads")
        if config.get("num_key_value_heads") is not None
        else heads
    )
    if config.get("head_dim") is not None:
        head_dim = _positive_int(config, "head_dim")
    else:
        hidden = _positive_int(config, "hidden_size")
        require(hidden % heads == 0, f"hidden_size {hidden} is not divisible by num_attention_heads {heads}")
        head_dim = hidden // heads
    if bytes_per_element is None:
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").lower()
        bytes_per_element = _DTYPE_BYTES.get(dtype.removeprefix("torch."), 2)
    return KVShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim, bytes_per_element=bytes_per_element)


def load_kv_shape(source: str, bytes_per_element: int | None = None) -> KVShape:
    """A built-in name (``smollm2``) or a path to a ``config.json`` (or a directory holding one)."""
    key = source.strip().lower()
    if key in BUILTIN_KV_SHAPES:
        shape = BUILTIN_KV_SHAPES[key]
        if bytes_per_element is None:
            return shape
        return KVShape(shape.layers, shape.kv_heads, shape.head_dim, bytes_per_element)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    require(
        path.is_file(),
        f"model config {source!r} not found; give a config.json path or one of {sorted(BUILTIN_KV_SHAPES)}",
    )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecLedgerError(f"cannot read model config {str(path)!r}: {str(exc).splitlines()[0]}") from None
    return kv_shape_from_config(config, bytes_per_element)


def reserved_candidate_tokens(gamma: int, block_size: int | None = None) -> int:
    """Tokens reserved per request for γ candidates: γ, or ⌈γ/b⌉·b with paged blocks of b tokens (upper bound)."""
    g = check_gamma(gamma)
    if block_size is None:
        return g
    require(block_size >= 1, f"block size {block_size} must be >= 1 token")
    return math.ceil(g / block_size) * block_size


def candidate_tokens(gamma: int, tree_budget: int = 0) -> int:
    """KV slots one request's candidates take in a round: the tree's nodes (``tree_budget``) for a tree, every
    node written whatever the depth; γ for a chain (``tree_budget`` 0)."""
    require(tree_budget >= 0, f"tree budget {tree_budget} is negative")
    return int(tree_budget) if tree_budget else max(int(gamma or 0), 0)


def kv_read_bytes(kv_bytes_per_token: float, context: float, batch: int = 1) -> float:
    """KV bytes one step reads: B · c · m_KV (every request's keys and values over its ``context`` c, once)."""
    require(kv_bytes_per_token >= 0, f"KV bytes per token {kv_bytes_per_token} is negative")
    require(batch >= 0, f"batch size {batch} is negative; give B >= 0")
    return float(batch) * max(float(context), 0.0) * float(kv_bytes_per_token)


def step_read_bytes(weight_bytes: float, kv_bytes_per_token: float, context: float, batch: int = 1) -> float:
    """Bytes one decode step (or verify round) reads: W + B · c · m_KV -- the weights once plus
    :func:`kv_read_bytes`. At B = 1 this is plain decoding's bytes per token."""
    require(weight_bytes >= 0, f"weight bytes {weight_bytes} is negative")
    return float(weight_bytes) + kv_read_bytes(kv_bytes_per_token, context, batch)


def candidate_kv_bytes(batch: int, gamma: int, kv_bytes_per_token: int, block_size: int | None = None) -> int:
    """M_candidate ≈ B · γ · m_KV (γ rounded up to whole blocks when ``block_size`` is given)."""
    require(batch >= 0, f"batch size {batch} is negative; give B >= 0")
    require(kv_bytes_per_token > 0, "KV bytes per token must be positive")
    return batch * reserved_candidate_tokens(gamma, block_size) * kv_bytes_per_token


@dataclass(frozen=True)
class MemoryLedger:
    """Extra memory speculation needs beyond plain decoding, in bytes."""

    batch: int
    gamma: int
    target_kv_per_token: int
    candidate_target_kv: int
    draft_weights: int
    draft_kv: int

    @property
    def total(self) -> int:
        return self.candidate_target_kv + self.draft_weights + self.draft_kv


def speculation_memory(
    target: KVShape,
    batch: int,
    gamma: int,
    *,
    block_size: int | None = None,
    draft: KVShape | None = None,
    draft_parameters: int = 0,
    draft_bytes_per_parameter: int = 2,
    context_tokens: int = 0,
) -> MemoryLedger:
    """Candidate target KV (B·γ·m_KV) + draft weights (params × bytes) + draft KV (B·(context+γ)·m_KV_draft)."""
    require(draft_parameters >= 0, f"draft parameter count {draft_parameters} is negative")
    require(draft_bytes_per_parameter > 0, "bytes per draft parameter must be positive")
    require(context_tokens >= 0, f"context length {context_tokens} is negative")
    candidate = candidate_kv_bytes(batch, gamma, target.bytes_per_token, block_size)
    draft_kv = 0
    if draft is not None:
        draft_kv = (
            batch * (context_tokens + reserved_candidate_tokens(gamma, block_size)) * draft.bytes_per_token
        )
    return MemoryLedger(
        batch=batch,
        gamma=gamma,
        target_kv_per_token=target.bytes_per_token,
        candidate_target_kv=candidate,
        draft_weights=draft_parameters * draft_bytes_per_parameter,
        draft_kv=draft_kv,
    )
