"""The native float32 row path of a decoder layer: decode steps, verify passes, packed batches, trees.

One layer over M rows, each row at (cache slot, position), with the row-wise kernels of
``engine/kernels`` only (see ``ops.c`` and ``gemv.c``)::

    x += Wo . attend(rope(Wqkv . rmsnorm(x)))     attend writes the row's k/v first
    x += W2 . (silu(gate) * up),  gate|up = W13 . rmsnorm(x)

Invariant: every op computes a row with one fixed sequence of float operations whatever the other
rows, so a row's output is bit-identical whether it runs alone (plain decode), in a chain verify
pass, in a packed batch or as a tree node -- greedy speculation stays token-identical to plain
decoding. The residual adds are folded into the linears' stores (same rounding as ``x + W h``).
Six native calls and a handful of Python lines per layer, against ~25 torch ops on the torch path.
"""

from __future__ import annotations

from typing import Any

import torch

from specledger.engine import kernels
from specledger.engine.kernels import ops
from specledger.errors import SpecLedgerError


def available(model: Any) -> bool:
    """Whether ``model`` can take the native row path: CPU float32, kernel built, native linears on."""
    first = model.layers[0].wqkv if len(model.layers) else None
    return (model.device.type == "cpu" and model.dtype == torch.float32 and kernels.lib() is not None
            and getattr(first, "native", False) and getattr(first, "prepack", False))


def add_linear(linear: Any, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual + linear(x)``, fused into the kernel when the linear supports it (same bits)."""
    fused = getattr(linear, "fused_add", None)
    return fused(x, residual) if fused is not None else residual + linear(x)


def block_rows(block: Any, x: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor, tree: bool, kv_out: torch.Tensor | None = None) -> torch.Tensor:
    """One layer over rows ``x`` [M, dim]; ``kv_cache`` [2, S, nkv, cap, hd]; ``slots``/``positions``
    int64 [M]; ``cos``/``sin`` the float32 RoPE tables [P, hd]; ``tree`` as :func:`ops.attend`;
    ``kv_out`` [2, M, nkv, hd] receives the rows' new k/v when given. Returns the new [M, dim]."""
    m = x.shape[0]
    nh, nkv, hd = block.n_heads, block.n_kv_heads, block.head_dim
    qkv = block.wqkv(ops.rms_norm(x, block.attn_norm, block.eps)).view(m, nh + 2 * nkv, hd)
    ops.rope_(qkv, cos, sin, positions, nh + nkv)
    if kv_out is not None:
        kv_out.copy_(qkv[:, nh:].view(m, 2, nkv, hd).transpose(0, 1))
    out = ops.attend(qkv, kv_cache[0], kv_cache[1], slots, positions, nh, nkv, tree)
    x = add_linear(block.wo, out, x)
    gate_up = block.w13(ops.rms_norm(x, block.mlp_norm, block.eps))
    return add_linear(block.w2, ops.silu_mul(gate_up), x)


def run_layers(model: Any, x: torch.Tensor, cache_kv: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
               max_slot: int, layers: Any = None, tree: bool = False, kv_out: torch.Tensor | None = None,
               ) -> torch.Tensor:
    """:func:`block_rows` through ``layers`` (all if None) of ``model``; ``cache_kv`` [L, 2, S, nkv, cap, hd].
    Callers have checked positions against the capacity; ``max_slot`` (a host int: no read-back) is
    checked here, so the kernels never write outside the cache."""
    if max_slot >= cache_kv.shape[2]:
        raise SpecLedgerError(f"rows address cache slot {max_slot}; the KV cache holds {cache_kv.shape[2]} slots")
    model._ensure_rope()
    _, cos, sin = model._rope_cache
    slots, positions = slots.contiguous(), positions.contiguous()
    for i in range(len(model.layers)) if layers is None else layers:
        x = block_rows(model.layers[i], x, cache_kv[i], slots, positions, cos, sin, tree,
                       None if kv_out is None else kv_out[i])
    return x
