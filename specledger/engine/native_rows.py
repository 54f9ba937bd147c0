"""The native float32 row path of a decoder layer: decode steps, verify passes, packed batches, trees.

One layer over M rows, each row at (cache slot, position), with the row-wise kernels of
``engine/kernels`` only (see ``ops.c`` and ``gemv.c``)::

    x += Wo . attend(rope(Wqkv . rmsnorm(x)))     attend writes the row's k/v first
    x += W2 . (silu(gate) * up),  gate|up = W13 . rmsnorm(x)

Invariant: every op computes a row with one fixed sequence of float operations whatever the other
rows, so a row's output is bit-identical whether it runs alone (plain decode), in a chain verify
pass, in a packed batch or as a tree node -- greedy speculation stays token-identical to plain
decoding. The residual adds are folded into the linears' stores (same rounding as ``x + W h``).
Nine native calls and a handful of Python lines per layer, against ~25 torch ops on the torch path; and
:func:`run_layers` runs the whole stack in one native call (``specledger_layers_f32`` in ``ops.c``: the same
calls in the same order, in C), handing a tree's rows' k/v back for its commit when asked.
"""

from __future__ import annotations

import ctypes
import math
import weakref
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


class _LayerF32(ctypes.Structure):
    """One layer's pointers for ``specledger_layers_f32`` (packed weights, biases or NULL, norm weights) and its
    linears' kinds (float32 or quantized weights)."""

    _fields_ = [*((name, ctypes.c_void_p) for name in
                  ("wqkv", "bqkv", "wo", "bo", "w13", "w2", "attn_norm", "mlp_norm")),
                ("kind", ctypes.c_int32 * 4)]  # per linear: 0 float32, else a GGUF block kind (quant_gguf.KIND)


#: per model: (key, the ctypes array of its layers' pointers) and {layer ids: ctypes int32 array}. A side table, not
#: model attributes: a deep copy or pickle of the model must not carry (or share) raw pointers into another's packs.
_STACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LAYER_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_LINEARS = ("wqkv", "wo", "w13", "w2")

#: bumped whenever any module's submodules, parameters or buffers are assigned (torch's global registration hooks)
#: or a decoder's tensors are converted (:class:`EpochOnApply`). A stack (or ends) built at the current epoch needs
#: per forward only its float32 linears' keys checked: the full check walks every layer's modules, ~0.05 ms with
#: warm caches but 0.1-0.3 ms of a ~3 ms quantized decode step once the weight stream has evicted them. In-place
#: changes need no check (the kernels read norms and quantized weights where they lie); a tensor's storage swapped
#: by hand (``p.data = t``) is the one change not seen -- the stack keeps the old storage alive, never a dangling
#: pointer.
_EPOCH = [0]


def bump_epoch(*_: Any) -> None:
    """Invalidate every cached stack and ends (their next forward runs the full check)."""
    _EPOCH[0] += 1


for _register in (torch.nn.modules.module.register_module_module_registration_hook,
                  torch.nn.modules.module.register_module_parameter_registration_hook,
                  torch.nn.modules.module.register_module_buffer_registration_hook):
    _register(bump_epoch)


class EpochOnApply:
    """Mixin for the decoder's modules: ``.to()``, ``.float()`` and every other conversion (``Module._apply``) bump
    the epoch, since they may move a tensor's storage without assigning it."""

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)  # type: ignore[misc]
        bump_epoch()
        return out


def _stack(model: Any) -> Any:
    """The ctypes array of every layer's weight pointers, rebuilt whenever a pack or a norm changed (each linear
    repacks itself when its weight changed, as its own forward does; the norms' storage and version); None when
    a linear is not on the native kernel. At the epoch it was built at (see ``_EPOCH``) only its float32 linears are
    checked; else the full check: flat comprehensions over the modules' own dicts."""
    cached = _STACKS.get(model)
    if cached is not None and cached[2] == _EPOCH[0] and all(lin._weight_key() == lin._packed_key
                                                              for lin in cached[3]):
        return cached[1]
    epoch = _EPOCH[0]
    blocks = list(model.layers._modules.values())  # the modules' own dicts: nn.Module.__getattr__ costs ~0.2 ms here
    lins = [block._modules[name] for block in blocks for name in _LINEARS]
    for lin in [lin for lin in lins if lin._weight_key() != lin._packed_key]:
        lin._repack()
    packs = [lin._native for lin in lins]
    if None in packs:
        return None
    key = packs + [(n.data_ptr(), 0 if n.is_inference() else n._version)
                   for block in blocks for n in (block._parameters["attn_norm"], block._parameters["mlp_norm"])]
    mutable = [lin for lin in lins if not getattr(lin, "kind", 0)]  # float32 packs: copies, repacked on change
    if cached is not None and cached[0] == key:
        _STACKS[model] = (key, cached[1], epoch, mutable, cached[4])
        return cached[1]
    arr = (_LayerF32 * len(model.layers))()
    for i, (a, block) in enumerate(zip(arr, model.layers)):
        wqkv, wo, w13, w2 = packs[4 * i: 4 * i + 4]
        a.wqkv, a.wo, a.w13, a.w2 = (n.packed.data_ptr() for n in (wqkv, wo, w13, w2))
        a.bqkv = None if wqkv.bias is None else wqkv.bias.data_ptr()
        a.bo = None if wo.bias is None else wo.bias.data_ptr()
        a.attn_norm, a.mlp_norm = block.attn_norm.data_ptr(), block.mlp_norm.data_ptr()
        a.kind[:] = [getattr(n, "kind", 0) for n in (wqkv, wo, w13, w2)]
    storages = [n.untyped_storage() for block in blocks for n in (block.attn_norm, block.mlp_norm)]
    _STACKS[model] = (key, arr, epoch, mutable, storages)  # the packs (in the key) and norms' storages kept alive
    return arr


def _layer_ids(model: Any, layers: Any) -> Any:
    ids = tuple(range(len(model.layers))) if layers is None else tuple(int(i) for i in layers)
    cache = _LAYER_IDS.setdefault(model, {})
    if ids not in cache:
        if any(not 0 <= i < len(model.layers) for i in ids):
            raise SpecLedgerError(f"layers {list(ids)} are not all in the model's {len(model.layers)}")
        cache[ids] = (ctypes.c_int32 * max(len(ids), 1))(*ids)
    return ids, cache[ids]


def _run_stack(model: Any, x: torch.Tensor, cache_kv: torch.Tensor, slots: torch.Tensor,
               positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layers: Any, tree: bool,
               kv_out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The layers in one native call (see the module doc); None where it does not apply."""
    stack = _stack(model)
    if stack is None or cache_kv.stride(-1) != 1 or not cache_kv[0, 0].is_contiguous():
        return None
    if kv_out is not None and (not kv_out.is_contiguous() or kv_out.dtype != torch.float32
                               or kv_out.shape[1:] != (2, x.shape[0], cache_kv.shape[-3], cache_kv.shape[-1])):
        return None
    ids, id_arr = _layer_ids(model, layers)
    first = model.layers[0]
    nh, nkv, hd, hidden = first.n_heads, first.n_kv_heads, first.head_dim, first.hidden_dim
    m, dim = x.shape
    x = x.contiguous().clone()
    scratch = torch.empty(m * (dim + (nh + 2 * nkv) * hd + nh * hd + 3 * hidden), dtype=torch.float32, device=x.device)
    kernels.lib().specledger_layers_f32(
        stack, id_arr, len(ids), x.data_ptr(), cache_kv.data_ptr(), cache_kv.stride(0), cache_kv.stride(1),
        slots.data_ptr(), positions.data_ptr(), m, dim, nh, nkv, hd, hidden, cache_kv.shape[-2], first.eps,
        cos.data_ptr(), sin.data_ptr(), 1.0 / math.sqrt(hd), int(tree), scratch.data_ptr(),
        None if kv_out is None else kv_out.data_ptr(), torch.get_num_threads())
    return x


class _EndsF32(ctypes.Structure):
    """The ends around the stack for ``specledger_forward_f32``: the embedding table, the final norm, the LM head
    (pointers), and the table's and the head's kinds (0 float32, else a GGUF block kind)."""

    _fields_ = [*((name, ctypes.c_void_p) for name in ("table", "norm", "head", "head_bias")),
                ("table_kind", ctypes.c_int32), ("head_kind", ctypes.c_int32), ("vocab", ctypes.c_int32)]


_ENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _ends(model: Any) -> _EndsF32 | None:
    """The model's embedding, final norm and LM head for the one-call forward, or None when one of them has no
    native form (a float32 table or a quantized one; a head on the native kernel; the same vocabulary). Cached
    per epoch as :func:`_stack` is (a float32 head's key checked per forward)."""
    cached = _ENDS.get(model)
    if cached is not None and cached[0] == _EPOCH[0] and (cached[2] is None
                                                          or cached[2]._weight_key() == cached[2]._packed_key):
        return cached[1]
    epoch, head = _EPOCH[0], model.lm_head
    ends, keep = _build_ends(model)
    _ENDS[model] = (epoch, ends, None if getattr(head, "kind", 0) else head, keep)
    return ends


def _build_ends(model: Any) -> tuple[_EndsF32 | None, list[Any]]:
    """(the ends or None, the tensors whose storage they point into, kept alive with them)."""
    embed, head, norm = model.embed, model.lm_head, model.norm
    table = getattr(embed, "table", None)  # a QuantEmbedding reads its quantized table
    if table is not None and getattr(table, "kind", 0):
        table_kind, table_ptr, rows = table.kind, table.packed.data_ptr(), table.out_features
    elif isinstance(embed, torch.nn.Embedding) and embed.weight.dtype == torch.float32 and embed.weight.is_contiguous():
        table_kind, table_ptr, rows = 0, embed.weight.data_ptr(), embed.num_embeddings
    else:
        return None, []
    if getattr(head, "kind", 0):  # a QuantLinear: its packed blocks are its weight
        head_kind, packed, bias = head.kind, head.packed, head.bias
    else:
        if head._weight_key() != head._packed_key:  # as the head's own forward does
            head._repack()
        nat = head._native
        if nat is None or nat.dtype != torch.float32:
            return None, []
        head_kind, packed, bias = 0, nat.packed, nat.bias
    if rows != head.out_features or norm.dtype != torch.float32 or not norm.is_contiguous():
        return None, []
    table_tensor = embed.weight if table_kind == 0 else table.packed  # (a QuantEmbedding's .weight dequantizes)
    keep = [t.untyped_storage() for t in (norm, packed, bias, table_tensor) if t is not None]
    return _EndsF32(table_ptr, norm.data_ptr(), packed.data_ptr(), None if bias is None else bias.data_ptr(),
                    table_kind, head_kind, rows), keep


def forward_logits(model: Any, tokens: torch.Tensor, cache_kv: torch.Tensor, slots: torch.Tensor,
                   positions: torch.Tensor, max_slot: int, last_only: bool) -> torch.Tensor | None:
    """``model(tokens)``'s float32 logits [B, T, V] ([B, 1, V] if ``last_only``) in one native call
    (``specledger_forward_f32``: the embedding lookup, the stack, the final norm and the head in one parallel
    region, bit for bit as the modules and :func:`run_layers` compute them); None where it does not apply."""
    if max_slot >= cache_kv.shape[2]:
        raise SpecLedgerError(f"rows address cache slot {max_slot}; the KV cache holds {cache_kv.shape[2]} slots")
    ends = _ends(model)
    stack = None if ends is None else _stack(model)
    if stack is None or cache_kv.stride(-1) != 1 or not cache_kv[0, 0].is_contiguous():
        return None
    bsz, seq = tokens.shape
    m = bsz * seq
    ids = tokens.reshape(-1).to(torch.int64).contiguous()
    cpu = torch.device("cpu")  # explicit: a caller's default device (even "meta") must not place these
    heads = torch.arange(seq - 1, m, seq, device=cpu) if last_only else torch.arange(m, device=cpu)
    logits = torch.empty((bsz, 1 if last_only else seq, ends.vocab), dtype=torch.float32, device=cpu)
    model._ensure_rope()
    _, cos, sin = model._rope_cache
    slots, positions = slots.contiguous(), positions.contiguous()
    layer_ids, id_arr = _layer_ids(model, None)
    first = model.layers[0]
    nh, hd = first.n_heads, first.head_dim
    if kernels.lib().specledger_forward_f32(
            ctypes.byref(ends), ids.data_ptr(), heads.data_ptr(), len(heads), logits.data_ptr(), stack, id_arr,
            len(layer_ids), cache_kv.data_ptr(), cache_kv.stride(0), cache_kv.stride(1), slots.data_ptr(),
            positions.data_ptr(), m, model.config.dim, nh,
            first.n_kv_heads, hd, first.hidden_dim, cache_kv.shape[-2], first.eps, cos.data_ptr(), sin.data_ptr(),
            1.0 / math.sqrt(hd), torch.get_num_threads()):
        raise SpecLedgerError(f"token ids must lie in [0, {ends.vocab}) (the model's vocabulary); got "
                              f"{int(ids.min())}..{int(ids.max())}")
    return logits


def run_layers(model: Any, x: torch.Tensor, cache_kv: torch.Tensor, slots: torch.Tensor,
               positions: torch.Tensor, max_slot: int, layers: Any = None, tree: bool = False,
               kv_out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`block_rows` through ``layers`` (all if None) of ``model``; ``cache_kv`` [L, 2, S, nkv, cap, hd].
    Callers have checked positions against the capacity; ``max_slot`` (a host int: no read-back) is
    checked here, so the kernels never write outside the cache."""
    if max_slot >= cache_kv.shape[2]:
        raise SpecLedgerError(f"rows address cache slot {max_slot}; the KV cache holds {cache_kv.shape[2]} slots")
    model._ensure_rope()
    _, cos, sin = model._rope_cache
    slots, positions = slots.contiguous(), positions.contiguous()
    if (out := _run_stack(model, x, cache_kv, slots, positions, cos, sin, layers, tree, kv_out)) is not None:
        return out
    for i in range(len(model.layers)) if layers is None else layers:
        x = block_rows(model.layers[i], x, cache_kv[i], slots, positions, cos, sin, tree,
                       None if kv_out is None else kv_out[i])
    return x
