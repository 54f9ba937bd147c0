"""GGUF block-quantized weights kept quantized: Q8_0, Q4_0 and Q4_1 linears on the native kernel (``qgemv.c``).

A GGUF file's linear weights are read as they are stored (32 weights per block, per-block fp16 scales: Q8_0
``w = d q``, Q4_0 ``w = d (q - 8)``, Q4_1 ``w = d q + m``) and repacked, byte for byte, into the kernel's layout;
nothing is dequantized. Decode then streams the file's bytes (SmolLM2-135M Q4_1: ~96 MB per token instead of
538 MB in float32). Activations stay float32 between the linears; each linear quantizes its input rows to 8-bit
blocks as llama.cpp does (per row: row-invariant), takes exact integer block dot products and combines them with one
fixed sequence of float operations per output (see ``qgemv.c``). So a k-row verify pass gives every row the bits of a
one-row decode step, and greedy speculation on the quantized target is token-identical to its plain decoding.

The quantized target is a different model from the float32 one (weights and activations both rounded): it is the
correctness reference for its *own* speculation; its distance from float32 is a quality question.

Supported block formats: :data:`SUPPORTED`. A linear (or fused q|k|v, gate|up group) stored in another format --
K-quants such as Q5_K or Q6_K -- is dequantized to float32 (gguf-py) and runs on the float32 kernel; the load reports
which (:attr:`QuantReport.fallback`), so a run says what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from specledger.engine import kernels
from specledger.errors import SpecLedgerError

if TYPE_CHECKING:
    from specledger.engine.model import Transformer

#: GGUF block formats with native kernels, and the kernel's code for each
KIND = {"Q8_0": 1, "Q4_0": 2, "Q4_1": 3}
SUPPORTED = tuple(KIND)
#: bytes of one 32-weight block in the file (and in the packed layout)
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
GROUP = 16  # outputs per packed group (qgemv.c's QN)


def _lib() -> Any:
    lib = kernels.lib()
    if lib is None:
        raise SpecLedgerError(f"quantized weights need the native kernel, which is {kernels.status()}; "
                              "use --dtype fp32")
    return lib


def packed_bytes(fmt: str, n: int, k: int) -> int:
    """Bytes of the packed copy: ``ceil(n / 32) * 32`` outputs (groups of 16 in pairs) x ``k / 32`` blocks x the
    format's block bytes."""
    return ((n + 2 * GROUP - 1) // (2 * GROUP)) * 2 * (k // 32) * _lib().specledger_qchunk_bytes(KIND[fmt])


class QuantLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` [n, k] in a GGUF block format, float32 rows in and out (any leading shape).

    ``blocks``: the file's rows, uint8 [n, k / 32 * BLOCK_BYTES[fmt]]. Presents the attributes the native row path
    (:mod:`specledger.engine.native_rows`) reads from a linear: ``_native`` (itself), ``packed``, ``bias``, ``kind``."""

    prepack = True
    native = True

    def __init__(self, fmt: str, blocks: np.ndarray | torch.Tensor, n: int, k: int,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if fmt not in KIND:
            raise SpecLedgerError(f"GGUF block format {fmt} has no native kernel; supported: {', '.join(SUPPORTED)}")
        if k % 32:
            raise SpecLedgerError(f"a {fmt} weight needs an input width divisible by 32, got {k}")
        raw = torch.as_tensor(np.ascontiguousarray(blocks, dtype=np.uint8)).contiguous()
        if raw.numel() != n * (k // 32) * BLOCK_BYTES[fmt]:
            raise SpecLedgerError(f"{fmt} data of {raw.numel()} bytes does not fit a [{n}, {k}] weight")
        self.fmt, self.kind, self.in_features, self.out_features = fmt, KIND[fmt], k, n
        packed = torch.empty(packed_bytes(fmt, n, k), dtype=torch.uint8)
        _lib().specledger_qpack(self.kind, raw.data_ptr(), packed.data_ptr(), n, k)
        self.register_buffer("packed", packed)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        object.__setattr__(self, "_native", self)  # a plain attribute: not a submodule of itself (slow lookups)
        self._packed_key = ("quant", fmt)

    def _weight_key(self) -> tuple:
        return ("quant", self.fmt)

    def _repack(self) -> None:  # the packed bytes are the weight: nothing derived to rebuild
        self._packed_key = self._weight_key()

    def _call(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if x.device.type != "cpu" or x.dtype != torch.float32 or x.shape[-1] != self.in_features:
            raise ValueError(f"quantized linear takes CPU float32 rows of {self.in_features}, got {x.device} "
                             f"{x.dtype} {tuple(x.shape)}")
        x = x.contiguous()
        rows = x.numel() // self.in_features
        y = torch.empty((*x.shape[:-1], self.out_features), dtype=torch.float32)
        res = None
        if residual is not None:
            res = residual.contiguous()
            if res.shape != y.shape or res.dtype != torch.float32:
                raise ValueError(f"residual {tuple(res.shape)} {res.dtype} does not match output {tuple(y.shape)}")
        if rows:
            _lib().specledger_qlinear(self.kind, x.data_ptr(), self.packed.data_ptr(),
                                      None if self.bias is None else self.bias.data_ptr(),
                                      None if res is None else res.data_ptr(), y.data_ptr(), rows,
                                      self.out_features, self.in_features, torch.get_num_threads())
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._call(x, None)

    def fused_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)``, the add folded into the kernel's store (one rounding of the same sum)."""
        return self._call(x, residual)

    def dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows of the dequantized weight, float32 [len(rows), k] (the embedding lookup of a tied table)."""
        idx = rows.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty((idx.numel(), self.in_features), dtype=torch.float32)
        _lib().specledger_qdequant_rows(self.kind, self.packed.data_ptr(), idx.data_ptr(), idx.numel(),
                                        self.out_features, self.in_features, out.data_ptr())
        return out.view(*rows.shape, self.in_features)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight, float32 [n, k] (built on each access: for drafters that read head rows)."""
        return self.dequantize_rows(torch.arange(self.out_features))

    def extra_repr(self) -> str:
        return f"{self.fmt}, in_features={self.in_features}, out_features={self.out_features}"


class QuantEmbedding(nn.Module):
    """Token embedding over a quantized table: a lookup dequantizes the rows it reads (exactly ``d q [+ m]``).
    With tied embeddings the table is the LM head's :class:`QuantLinear` (one copy, counted once)."""

    def __init__(self, table: QuantLinear) -> None:
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table.dequantize_rows(tokens)

    @property
    def weight(self) -> torch.Tensor:
        return self.table.weight


# ------------------------------------------------------------------------------------------ one arena, huge pages
_HUGE = 2 << 20


def _madvise_huge(ptr: int, nbytes: int) -> bool:
    """Ask Linux for transparent huge pages on [ptr, ptr + nbytes) (2 MiB aligned, not touched yet); False if not."""
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.madvise(ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes), 14) == 0  # MADV_HUGEPAGE
    except (OSError, AttributeError):
        return False


def consolidate(model: Transformer) -> bool:
    """Move every :class:`QuantLinear`'s packed bytes into one arena, in the order a forward reads them (layer by
    layer, then the head), backed by 2 MiB pages where the kernel grants them: decode streams ~100 MB per token
    through ~120 small matrices, and with 4 KiB pages each matrix restarts the hardware prefetcher and walks the
    page tables every 4 KiB. Same bytes, same results; returns whether huge pages were asked for."""
    lins = [lin for block in model.layers for lin in (block.wqkv, block.wo, block.w13, block.w2)] + [model.lm_head]
    lins = [lin for lin in dict.fromkeys(lins) if isinstance(lin, QuantLinear)]
    if not lins:
        return False
    sizes = [(lin.packed.numel() + 4095) // 4096 * 4096 for lin in lins]
    total = sum(sizes)
    raw = torch.empty(total + _HUGE, dtype=torch.uint8)
    start = (-raw.data_ptr()) % _HUGE
    arena = raw[start : start + total]
    huge = _madvise_huge(arena.data_ptr(), total)
    at = 0
    for lin, size in zip(lins, sizes):
        n = lin.packed.numel()
        view = arena[at : at + n]
        view.copy_(lin.packed)
        lin.packed = view  # a registered buffer: assignment replaces it
        at += size
    return huge


# ------------------------------------------------------------------------------------------ quantizing (tests, --dtype)
def quantize_blocks(weight: torch.Tensor, fmt: str) -> np.ndarray:
    """``weight`` [n, k] float -> GGUF ``fmt`` blocks (gguf-py's reference quantizer), uint8 [n, k/32 * bytes]."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return quantize(weight.detach().float().cpu().numpy(), GGMLQuantizationType[fmt])


def quantize_linear(linear: nn.Module, fmt: str) -> QuantLinear:
    """A :class:`QuantLinear` of ``linear``'s float weight quantized to ``fmt``."""
    n, k = linear.weight.shape
    return QuantLinear(fmt, quantize_blocks(linear.weight, fmt), n, k, getattr(linear, "bias", None))


def quantize_model(model: Transformer, fmt: str, head_fmt: str | None = None) -> Any:
    """``model`` (float32 Transformer) with every block's four linears quantized to ``fmt`` and the LM head (and,
    tied, the embedding table) to ``head_fmt`` (default ``fmt``), in place; returns it."""
    for block in model.layers:
        for name in ("wqkv", "wo", "w13", "w2"):
            setattr(block, name, quantize_linear(getattr(block, name), fmt))
    _install_head(model, quantize_linear(model.lm_head, head_fmt or fmt))
    consolidate(model)
    return model


def _install_head(model: Transformer, head: nn.Module) -> None:
    tied = model.config.tie_embeddings
    model.lm_head = head
    if tied and isinstance(head, QuantLinear):
        model.embed = QuantEmbedding(head)


# ------------------------------------------------------------------------------------------ loading a GGUF file
@dataclass
class QuantReport:
    """What a quantized load kept: per format, how many linears; which fell back to float32, and why."""

    kept: dict[str, int] = field(default_factory=dict)
    fallback: list[str] = field(default_factory=list)
    weight_bytes: int = 0

    @property
    def label(self) -> str:
        """The run's dtype: ``gguf:q4_1+q8_0`` (formats kept, most linears first; ``+f32`` if any fell back)."""
        names = [f.lower() for f, _ in sorted(self.kept.items(), key=lambda kv: -kv[1])]
        if self.fallback:
            names.append("f32")
        return "gguf:" + "+".join(names or ["f32"])

    def line(self) -> str:
        kept = ", ".join(f"{n} {f}" for f, n in sorted(self.kept.items(), key=lambda kv: -kv[1]))
        out = f"weights kept quantized: {kept or 'none'}"
        if self.fallback:
            out += f"; dequantized to float32 (no native kernel): {', '.join(self.fallback)}"
        return out


def _reverse_permute_rows(n: int, n_head: int) -> np.ndarray:
    """Row order that undoes convert_hf_to_gguf's q/k permutation (as transformers' GGUF loader undoes it)."""
    dim = n // n_head // 2
    return np.arange(n).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(n)


def _tensor(reader: Any, name: str) -> tuple[str, np.ndarray, int, int] | None:
    for t in reader.tensors:
        if t.name == name:
            k, n = int(t.shape[0]), int(t.shape[1]) if len(t.shape) > 1 else 1
            return t.tensor_type.name, np.asarray(t.data), n, k
    return None


def _dequantize(fmt: str, data: np.ndarray, n: int, k: int) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    if fmt in ("F32", "F16", "BF16"):
        arr = data.astype(np.float32) if fmt != "BF16" else dequantize(data, GGMLQuantizationType.BF16)
    else:
        arr = dequantize(data, GGMLQuantizationType[fmt])
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(n, k))


def _group(reader: Any, names: list[str], perms: list[np.ndarray | None], report: QuantReport,
           label: str, bias: torch.Tensor | None) -> nn.Module:
    """One fused linear from GGUF tensors ``names`` (rows concatenated in order, each reordered by its perm)."""
    from specledger.engine.layers import Linear

    parts = []
    for name, perm in zip(names, perms):
        found = _tensor(reader, name)
        if found is None:
            raise SpecLedgerError(f"GGUF file has no tensor {name!r}; use a complete Llama GGUF")
        fmt, data, n, k = found
        parts.append((fmt, data if perm is None else data[perm], n, k))
    fmts = {p[0] for p in parts}
    k = parts[0][3]
    n = sum(p[2] for p in parts)
    if len(fmts) == 1 and (fmt := fmts.pop()) in KIND and k % 32 == 0:
        report.kept[fmt] = report.kept.get(fmt, 0) + 1
        return QuantLinear(fmt, np.concatenate([p[1].reshape(p[2], -1) for p in parts]), n, k, bias)
    report.fallback.append(f"{label} ({'/'.join(sorted({p[0] for p in parts}))})")
    lin = Linear(k, n, bias=bias is not None)
    with torch.no_grad():
        lin.weight.copy_(torch.cat([_dequantize(*p) for p in parts]))
        if bias is not None:
            lin.bias.copy_(bias)
    return lin.requires_grad_(False)


def load_quantized(model: Transformer, gguf_path: str, check: bool = True) -> QuantReport:
    """Replace ``model``'s linears (built from the same file, dequantized) by the file's quantized tensors, in place.

    ``check``: nine rows of each replaced linear, spread over it (rows 1 and n/2 included: the q/k row permutation
    moves them, where it leaves rows 0 and n-1 in place), dequantized, must match the float32 weights they replace
    (a wrong tensor mapping or row order is a one-line error, not a silently different model)."""
    from gguf import GGUFReader

    cfg = model.config
    if cfg.attention_bias:
        raise SpecLedgerError("quantized GGUF loading supports Llama models without attention biases; use --dtype fp32")
    _lib()
    reader = GGUFReader(str(gguf_path))
    report = QuantReport()
    n_heads, n_kv = cfg.n_heads, cfg.n_kv_heads
    for i, block in enumerate(model.layers):
        p = f"blk.{i}."
        q_rows = _tensor(reader, p + "attn_q.weight")
        k_rows = _tensor(reader, p + "attn_k.weight")
        if q_rows is None or k_rows is None:
            raise SpecLedgerError(f"GGUF file has no attention tensors for layer {i}; use a complete Llama GGUF")
        perms = [_reverse_permute_rows(q_rows[2], n_heads), _reverse_permute_rows(k_rows[2], n_kv), None]
        new = {
            "wqkv": _group(reader, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], perms, report,
                           f"blk.{i}.attn_qkv", None),
            "wo": _group(reader, [p + "attn_output.weight"], [None], report, f"blk.{i}.attn_output", None),
            "w13": _group(reader, [p + "ffn_gate.weight", p + "ffn_up.weight"], [None, None], report,
                          f"blk.{i}.ffn_gate_up", None),
            "w2": _group(reader, [p + "ffn_down.weight"], [None], report, f"blk.{i}.ffn_down", None),
        }
        for name, lin in new.items():
            if check:
                _check_same(getattr(block, name), lin, f"layer {i} {name}")
            setattr(block, name, lin)
    head_name = "output.weight" if _tensor(reader, "output.weight") is not None else "token_embd.weight"
    head = _group(reader, [head_name], [None], report, head_name.split(".")[0], None)
    if check:
        _check_same(model.lm_head, head, "the LM head")
    if cfg.tie_embeddings or head_name == "token_embd.weight":
        _install_head(model, head)
    else:
        model.lm_head = head
    consolidate(model)
    report.weight_bytes = model.weight_bytes()
    return report


def _check_same(old: nn.Module, new: nn.Module, where: str) -> None:
    w = old.weight.detach().float()
    n = w.shape[0]
    rows = torch.unique(torch.tensor([0, 1, n // 2, n - 1, *torch.linspace(0, n - 1, 5).long().tolist()]))
    got = new.dequantize_rows(rows) if isinstance(new, QuantLinear) else new.weight.detach()[rows]
    if got.shape != w[rows].shape or not torch.allclose(got, w[rows], rtol=1e-3, atol=1e-5):
        raise SpecLedgerError(f"the GGUF's quantized tensors for {where} do not match its dequantized weights; "
                              "the file's layout is not supported: use --dtype fp32")
