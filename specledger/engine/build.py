"""The engine of a target model by name: the one constructor the CLI verbs share (``generate``, ``run``,
``sweep``, ``serve``).

Callers import it at call time (``from specledger.engine.build import build_engine`` inside the verb),
so a test can stand a tiny engine in by patching this module's attribute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specledger.engine.decode import Engine


def build_engine(target: str | None, dtype: str = "auto", device: str = "cpu") -> Engine:
    """Load the target (default: bundled SmolLM2-135M-Instruct) on ``device`` and wrap it in an Engine; ``auto``
    is resolved here, once for every verb (:func:`resolve_dtype`). The engine's ``dtype`` names the weights when
    they are quantized (``gguf:q4_1+q8_0`` for the bundled file's own blocks) and ``dtype_reason`` says why."""
    from specledger.engine.decode import Engine
    from specledger.engine.loader import load_model

    chosen, reason = resolve_dtype(target, dtype, device)
    lm = load_model(target, dtype=chosen, device=device)
    engine = Engine.from_loaded(lm)
    if lm.weights:  # quantized weights (--dtype gguf | q8_0 | q4_0 | q4_1 | int8): the run reports which
        engine.dtype = lm.weights
    engine.dtype_reason = reason
    return engine


def resolve_dtype(target: str | None, dtype: str = "auto", device: str = "cpu") -> tuple[str, str]:
    """The one owner of ``--dtype auto``: ``(dtype to load, why)``, the same for ``run``, ``serve``, ``generate``,
    ``sweep``, ``calibrate`` and ``predict``. On the CPU a GGUF target (the bundled one by default) runs on its own
    quantized blocks (``gguf``) -- what a CPU user deploys, as llama.cpp runs the file as it is -- when the native
    kernels are built; otherwise float32 on the CPU (bit-exact verify rows) and bfloat16 on a GPU. A dtype given
    explicitly is kept as it is."""
    if dtype != "auto":
        return dtype, "--dtype given"
    if device != "cpu":
        return dtype, f"auto on {device}: bfloat16"
    from pathlib import Path

    from specledger.engine import kernels
    from specledger.engine.loader import default_target_path

    path = Path(target).expanduser() if target else default_target_path()
    if path.suffix.lower() != ".gguf":
        return dtype, "auto: a model directory runs in float32 on the CPU"
    if kernels.lib() is None:
        return dtype, "auto: the native kernels are not built, so the GGUF is de-quantized to float32"
    return "gguf", "auto: the GGUF's own quantized blocks, as a CPU user deploys it (--dtype float32 de-quantizes)"


def weights_line(engine: Engine) -> str:
    """The line every verb prints about the weights it loaded: ``weights: <dtype> (<why>)``."""
    return f"weights: {engine.dtype} ({getattr(engine, 'dtype_reason', '') or 'as built'})"


def deploy_dtype(target: str | None, dtype: str = "auto", device: str = "cpu") -> str:
    """The dtype :func:`resolve_dtype` picks (without its reason)."""
    return resolve_dtype(target, dtype, device)[0]
