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
    """Load the target (default: bundled SmolLM2-135M-Instruct) on ``device`` and wrap it in an Engine; its
    ``dtype`` names the weights when they are quantized (``gguf:q4_1+q8_0`` for the bundled file's own blocks)."""
    from specledger.engine.decode import Engine
    from specledger.engine.loader import load_model

    lm = load_model(target, dtype=dtype, device=device)
    engine = Engine.from_loaded(lm)
    if lm.weights:  # quantized weights (--dtype gguf | q8_0 | q4_0 | q4_1 | int8): the run reports which
        engine.dtype = lm.weights
    return engine


def deploy_dtype(target: str | None, dtype: str = "auto", device: str = "cpu") -> str:
    """What ``specledger run`` loads for ``--dtype auto``: on the CPU, a GGUF target (the bundled one by default)
    on its own quantized blocks, ``gguf`` -- what a CPU user deploys (llama.cpp runs the file as it is) -- when
    the native kernels are built; otherwise ``dtype`` unchanged (float32 on the CPU, bfloat16 on a GPU)."""
    if dtype != "auto" or device != "cpu":
        return dtype
    from pathlib import Path

    from specledger.engine import kernels
    from specledger.engine.loader import default_target_path

    path = Path(target).expanduser() if target else default_target_path()
    return "gguf" if path.suffix.lower() == ".gguf" and kernels.lib() is not None else dtype
