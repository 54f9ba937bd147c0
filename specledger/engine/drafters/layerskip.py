"""``layerskip``: self-speculation with a subset of the target's own layers and its LM head.

The draft is the target run through ``layers`` only (early exit: the first k layers; or a
skip pattern), followed by the shared final norm and LM head. No extra weights: the only
extra memory is the draft's KV cache for the layers it runs. Layers come from an option
or from :func:`calibrate`, which measures, teacher-forced on a short text, how often each
candidate layer set's argmax agrees with the full model, and picks the set that maximises
the ledger's predicted speed-up E[L](a, gamma) / (1 + gamma * c) with c = draft layers / all layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from specledger.engine.drafters import catalog
from specledger.engine.drafters.neural import NeuralDrafter
from specledger.errors import require

if TYPE_CHECKING:
    from specledger.engine.drafters.base import DrafterOptions
    from specledger.engine.model import Transformer
    from specledger.engine.protocol import TargetEngine


def parse_layers(spec: str, n_layers: int) -> list[int]:
    """``"12"`` -> first 12 layers (early exit); ``"0-9,20-29"`` -> those ranges; ``"0,2,4"`` -> those layers."""
    spec = spec.strip()
    try:
        if spec.isdigit():
            k = int(spec)
            require(1 <= k < n_layers, f"layerskip: early exit after {k} layers must be in 1..{n_layers - 1}")
            return list(range(k))
        layers: list[int] = []
        for part in spec.split(","):
            if "-" in part:
                a, b = (int(x) for x in part.split("-"))
                layers.extend(range(a, b + 1))
            else:
                layers.append(int(part))
    except ValueError:
        from specledger.errors import SpecLedgerError

        raise SpecLedgerError(f"layerskip: cannot parse layers {spec!r}; use e.g. 12 or 0-9,20-29") from None
    require(
        all(0 <= i < n_layers for i in layers) and layers == sorted(set(layers)) and len(layers) < n_layers,
        f"layerskip: layers must be increasing, distinct, in 0..{n_layers - 1}, and fewer than all",
    )
    return layers


def candidate_layer_sets(n_layers: int) -> list[list[int]]:
    """Early exits at 1/5..1/2 of the depth and a few 'skip the middle' patterns."""
    sets: list[list[int]] = []
    for frac in (0.2, 0.3, 0.4, 0.5):
        k = max(1, round(n_layers * frac))
        sets.append(list(range(k)))
    for keep_head, keep_tail in ((0.25, 0.15), (0.3, 0.2), (0.35, 0.15)):
        h, t = max(1, round(n_layers * keep_head)), max(1, round(n_layers * keep_tail))
        if h + t < n_layers:
            sets.append(list(range(h)) + list(range(n_layers - t, n_layers)))
    return sets


@torch.inference_mode()
def agreement(model: Transformer, tokens: Sequence[int], layers: Sequence[int] | None) -> torch.Tensor:
    """Argmax predictions of the (sub)model at every position of ``tokens`` (teacher-forced)."""
    cache = model.new_cache(len(tokens) + 1)
    return model(torch.tensor([list(tokens)], device=model.device), 0, cache, layers=layers)[0].argmax(-1)


def calibrate(model: Transformer, tokens: Sequence[int], gamma: int = 4) -> tuple[list[int], list[dict]]:
    """Pick the layer set maximising predicted speed-up; returns (layers, table of candidates)."""
    from specledger.ledger import expected_length_constant  # pure math

    n = model.config.n_layers
    full = agreement(model, tokens, None)
    table = []
    for layers in candidate_layer_sets(n):
        a = float((agreement(model, tokens, layers) == full).float().mean())
        c = len(layers) / n
        predicted = expected_length_constant(min(a, 0.999999), gamma) / (1 + gamma * c)
        table.append({"layers": layers, "acceptance": a, "cost_ratio": c, "predicted_speedup": predicted})
    best = max(table, key=lambda r: r["predicted_speedup"])
    return best["layers"], table


_CALIBRATION_TEXT = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts several tokens and "
    "lets the target model verify them in one pass; accepted tokens are kept and the rest discarded. "
    "Question: Tom has 3 apples and buys 5 more. How many apples does he have? Answer: 8."
)


def calibration_tokens(engine: TargetEngine) -> list[int]:
    """The built-in calibration text in ``engine``'s tokens (64 seeded random ids without a tokenizer)."""
    if engine.tokenizer is not None:
        return engine.tokenizer.encode(_CALIBRATION_TEXT)
    import random

    rnd = random.Random(0)
    return [rnd.randrange(engine.model.config.vocab_size) for _ in range(64)]


class LayerSkipDrafter(NeuralDrafter):
    spec = catalog.LAYERSKIP

    def __init__(self, target: Transformer, layers: Sequence[int]) -> None:
        super().__init__(target, layers=layers, name=self.spec.name)

    @classmethod
    def from_engine(cls, engine: TargetEngine, options: DrafterOptions) -> LayerSkipDrafter:
        """``options.layers`` if given, else the layers :func:`calibrate` picks on ``options.calibration_tokens``
        (default: :func:`calibration_tokens`)."""
        n_layers = engine.model.config.n_layers
        if options.layers:
            chosen = parse_layers(options.layers, n_layers)
        else:
            chosen, _ = calibrate(engine.model, options.calibration_tokens or calibration_tokens(engine))
        return cls(engine.model, chosen)
