"""The engine's user-facing choices, importable without torch (the CLI modules read them at import time)."""

from __future__ import annotations

#: ``--dtype`` values that choose the *weights* (activations stay float32 on the CPU): the GGUF file's own block
#: quantization kept quantized (``gguf``, engine/quant_gguf.py), every linear re-quantized to one GGUF block format
#: from the float32 weights (``q8_0``, ``q4_0``, ``q4_1``), or weight-only per-channel int8 (engine/int8.py).
QUANT_DTYPES = ("gguf", "q8_0", "q4_0", "q4_1", "int8")

#: the ``--dtype`` help every verb that loads a target shows
DTYPE_HELP = ("auto (on the CPU a GGUF's own quantized blocks, else float32; bfloat16 on a GPU) | float32 | bfloat16 | "
              "gguf (the GGUF file's own quantized blocks) | q8_0 | q4_0 | q4_1 (every linear quantized so) | int8")

__all__ = ["DTYPE_HELP", "QUANT_DTYPES"]
