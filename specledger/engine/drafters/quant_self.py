"""``quant-self``: the target itself with weight-only int8 weights, as the draft.

Quantisation changes only q (the draft's distribution); the verifying p is the unchanged
target, so outputs stay exactly the target's: verification accepts or corrects every candidate
against p, whatever q proposed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specledger.engine.drafters.neural import NeuralDrafter

if TYPE_CHECKING:
    from specledger.engine.model import Transformer


class QuantSelfDrafter(NeuralDrafter):
    def __init__(self, target: Transformer) -> None:
        from specledger.engine.int8 import quantize_int8

        super().__init__(quantize_int8(target), layers=None, name="quant-self")
