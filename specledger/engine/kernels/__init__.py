"""The native row-invariant skinny matmul (``gemv.c``): built once per machine, called through ctypes.

Decode reads every weight once per token, so its speed is the speed of the weight stream. On the
2-core EPYC target oneDNN's and MKL's kernels stream the decode shapes at a third of the machine's
read bandwidth; ``gemv.c`` streams them near it (figures: ``benchmarks/bench_engine.py``). It is
also row-invariant by construction (see the C file), so plain decode, verify passes and packed
batches agree bit for bit in float32 *and* bfloat16.

The shared library is compiled on first use with the system C compiler (``$CC``, else ``cc``)
into ``<cache root>/kernels/`` (the cache root as in :mod:`specledger.engine.loader`), keyed by the
source, the flags and the CPU's feature flags, written under a temporary name and renamed into
place. Without a compiler, or with ``SPECLEDGER_NATIVE=0``, :func:`lib` returns None and
:class:`specledger.engine.layers.Linear` uses oneDNN as before; :func:`status` says which and why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, TypedDict

import torch

_SRCS = tuple(Path(__file__).with_name(name) for name in ("gemv.c", "ops.c", "qgemv.c"))
_HEADERS = tuple(Path(__file__).with_name(name)
                 for name in ("simd.h", "attend.h", "qgemv_vnni.h", "specledger_kernels.h"))
_FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-fPIC", "-shared"]
_ABI = 7  # SPECLEDGER_ABI in specledger_kernels.h (the interface, declared once)
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_status = "not loaded yet"
_tried = False


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _cache_root() -> Path:
    env = os.environ.get("SPECLEDGER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specledger"


def _build(target: Path, cc: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        proc = subprocess.run([cc, *_FLAGS, *map(str, _SRCS), "-o", str(out), "-lm"], capture_output=True, text=True,
                              timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[:300]}")
        os.replace(out, target)


_p, _i, _f, _i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_int64
#: every binding: name -> (restype, argtypes), mirroring ``specledger_kernels.h`` (pointers as c_void_p);
#: tests/test_kernel_interface.py checks the two agree.
SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "specledger_gemv_abi": (_i, []),
    "specledger_pack_f32": (None, [_p, _p, _i, _i]),
    "specledger_pack_bf16": (None, [_p, _p, _i, _i]),
    "specledger_gemv_f32": (None, [_p, _p, _p, _p, _p, _i, _i, _i, _i]),
    "specledger_gemv_bf16": (None, [_p, _p, _p, _p, _i, _i, _i, _i]),
    "specledger_rmsnorm_f32": (None, [_p, _p, _p, _i, _i, _f]),
    "specledger_rope_f32": (None, [_p, _p, _p, _p, _i, _i, _i, _i]),
    "specledger_attn_f32": (None, [_p, _p, _p, _p, _p, _p, _i, _i, _i, _i, _i, _f, _i, _i]),
    "specledger_silu_mul_f32": (None, [_p, _p, _i, _i]),
    "specledger_layers_f32": (None, [_p, _p, _i, _p, _p, _i64, _i64, _p, _p, _i, _i, _i, _i, _i, _i, _i, _f, _p, _p,
                                     _f, _i, _p, _p, _i]),
    "specledger_forward_f32": (_i, [_p, _p, _p, _i, _p, _p, _p, _i, _p, _i64, _i64, _p, _p, _i, _i, _i, _i, _i, _i, _i,
                                    _f, _p, _p, _f, _i]),
    # qgemv.c: GGUF block-quantized weights (see specledger/engine/quant_gguf.py)
    "specledger_qpack": (None, [_i, _p, _p, _i, _i]),
    "specledger_qdequant_rows": (None, [_i, _p, _p, _i, _i, _i, _p]),
    "specledger_qlinear": (None, [_i, _p, _p, _p, _p, _p, _i, _i, _i, _i]),
    "specledger_qchunk_bytes": (_i, [_i]),
    "specledger_qpath": (ctypes.c_char_p, []),
}


def _bind(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    if lib.specledger_gemv_abi() != _ABI:
        raise RuntimeError("stale kernel library (ABI mismatch)")
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def lib() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on first use; None if unavailable (see :func:`status`)."""
    global _lib, _status, _tried
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get("SPECLEDGER_NATIVE", "1") == "0":
            _status = "off (SPECLEDGER_NATIVE=0): oneDNN linears"
            return None
        if platform.system() != "Linux":
            _status = f"off: native kernel built on Linux only ({platform.system()}): oneDNN linears"
            return None
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not cc:
            _status = "off: no C compiler (install gcc): oneDNN linears"
            return None
        key = hashlib.sha256(
            b"\0".join([*(src.read_bytes() for src in (*_SRCS, *_HEADERS)), " ".join(_FLAGS).encode(),
                        _cpu_flags().encode(), platform.machine().encode(), cc.encode()])
        ).hexdigest()[:16]
        target = _cache_root() / "kernels" / f"gemv-{key}.so"
        try:
            if not target.exists():
                _build(target, cc)
            _lib = _bind(target)
            _status = f"native gemv ({target.name})"
        except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
            _lib, _status = None, f"off: {str(exc).splitlines()[0][:200]}: oneDNN linears"
    return _lib


def status() -> str:
    """One line: whether the native kernel is in use, and if not, why."""
    lib()
    return _status


class KernelsInfoDict(TypedDict):
    """Which kernels ran: the native library or not, the quantized matmul's instruction-set path ("avx512-vnni",
    "avx2", "portable"; "none" without the library) and the loader's status line."""

    native: bool
    path: str
    status: str


def describe() -> KernelsInfoDict:
    """Which kernels ran, for a run's record: ``{"native": bool, "path": "avx512-vnni" | "avx2" | "portable" |
    "none", "status": status()}``; ``path`` is the quantized matmul's instruction-set path (``specledger_qpath``),
    "none" when the library is not in use (oneDNN / torch fallback)."""
    loaded = lib()
    path = loaded.specledger_qpath().decode() if loaded is not None else "none"
    return {"native": loaded is not None, "path": path, "status": _status}


_NB = 8
_FNS = {torch.float32: ("specledger_pack_f32", "specledger_gemv_f32"),
        torch.bfloat16: ("specledger_pack_bf16", "specledger_gemv_bf16")}


def supports(weight: torch.Tensor) -> bool:
    """Whether ``weight`` [N, K] can run on the native kernel (CPU, fp32/bf16, K % 16 == 0)."""
    return (weight.device.type == "cpu" and weight.dtype in _FNS and weight.dim() == 2
            and weight.shape[1] % 16 == 0 and lib() is not None)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The kernel's packed copy of ``weight`` [N, K] (a flat tensor of the same dtype)."""
    n, k = weight.shape
    w = weight.detach().contiguous()
    packed = torch.empty(((n + _NB - 1) // _NB) * _NB * k, dtype=w.dtype, device="cpu")
    getattr(lib(), _FNS[w.dtype][0])(w.data_ptr(), packed.data_ptr(), n, k)
    return packed


class PackedLinear:
    """``y = x @ W.T + b`` on the native kernel; ``x`` [..., K] in the weight's dtype."""

    __slots__ = ("packed", "bias", "n", "k", "fn", "dtype")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.n, self.k = weight.shape
        self.dtype = weight.dtype
        self.packed = pack(weight)
        self.bias = None if bias is None else bias.detach().to(weight.dtype).contiguous()
        self.fn = getattr(lib(), _FNS[weight.dtype][1])

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T + b``; with ``residual`` (float32 only, shaped like the output) ``residual + that``,
        bit for bit as torch's ``residual + linear(x)`` (one rounding of the same sum)."""
        if x.device.type != "cpu" or x.dtype != self.dtype or x.shape[-1] != self.k:
            raise ValueError(f"native linear takes CPU {self.dtype} rows of {self.k}, "
                             f"got {x.device} {x.dtype} {tuple(x.shape)}")
        if not x.is_contiguous():
            x = x.contiguous()
        rows = x.numel() // self.k
        y = torch.empty((*x.shape[:-1], self.n), dtype=self.dtype, device="cpu")
        bias = None if self.bias is None else self.bias.data_ptr()
        args = (x.data_ptr(), self.packed.data_ptr(), bias)
        if self.dtype == torch.float32:
            res = None
            if residual is not None:
                res = residual.contiguous()
                if res.shape != y.shape or res.dtype != torch.float32:
                    raise ValueError(f"residual {tuple(res.shape)} {res.dtype} does not match output {tuple(y.shape)}")
            self.fn(*args, None if res is None else res.data_ptr(), y.data_ptr(), rows, self.n, self.k,
                    torch.get_num_threads())
            return y
        self.fn(*args, y.data_ptr(), rows, self.n, self.k, torch.get_num_threads())
        return y if residual is None else residual + y
