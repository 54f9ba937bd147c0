"""``quant-self``: the target itself with weight-only int8 weights, as the draft.

Quantisation changes only q (the draft's distribution); the verifying p is the unchanged
target, so outputs stay exactly the target's: verification accepts or corrects every candidate
against p, whatever q proposed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specledger.engine.drafters import catalog
from specledger.engine.drafters.neural import NeuralDrafter

if TYPE_CHECKING:
    from specledger.engine.drafters.base import DrafterOptions
    from specledger.engine.model import Transformer
    from specledger.engine.protocol import TargetEngine


class QuantSelfDrafter(NeuralDrafter):
    spec = catalog.QUANT_SELF

    def __init__(self, target: Transformer) -> None:
        from specledger.engine.int8 import quantize_int8

        super().__init__(quantize_int8(target), layers=None, name=self.spec.name)

    @classmethod
    def from_engine(cls, engine: TargetEngine, options: DrafterOptions) -> QuantSelfDrafter:
        """The int8 copy of ``engine``'s own target."""
        return cls(engine.model)
