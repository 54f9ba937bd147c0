"""Build a drafter by name. One instance serves many requests (the suffix drafter's
cross-request tree lives in it), so build once per (engine, drafter) pair."""

from __future__ import annotations

from specledger.engine.drafters.base import Drafter, NoDrafter
from specledger.engine.protocol import TargetEngine
from specledger.errors import SpecLedgerError

DRAFTERS: tuple[str, ...] = ("none", "ngram", "suffix", "layerskip", "quant-self", "model", "head")


def make_drafter(
    name: str,
    engine: TargetEngine,
    *,
    layers: str | None = None,
    draft_path: str | None = None,
    calibration_tokens: list[int] | None = None,
) -> Drafter:
    """``engine``: a :class:`specledger.engine.decode.Engine` (its model is the target).

    ``layers`` (layerskip): an option such as ``"12"`` or ``"0-7,26-29"``; default: calibrate on
    ``calibration_tokens`` (or a built-in text) for the best predicted speed-up.
    ``draft_path`` (model): a GGUF file or Hugging Face directory with the same tokenizer.
    (head): a head file if it ends in ``.safetensors``; otherwise the head shipped with the package
    for this target, else the one ``specledger train-head`` cached (a missing one is a one-line error
    naming the command that builds it).
    """
    if name == "none":
        return NoDrafter()
    if name == "ngram":
        from specledger.engine.drafters.ngram import NgramDrafter

        return NgramDrafter()
    if name == "suffix":
        from specledger.engine.drafters.suffix import SuffixDrafter

        return SuffixDrafter()
    if name == "layerskip":
        from specledger.engine.drafters.layerskip import LayerSkipDrafter, calibrate, parse_layers

        n_layers = engine.model.config.n_layers
        if layers:
            chosen = parse_layers(layers, n_layers)
        else:
            tokens = calibration_tokens or _calibration_tokens(engine)
            chosen, _ = calibrate(engine.model, tokens)
        return LayerSkipDrafter(engine.model, chosen)
    if name == "quant-self":
        from specledger.engine.drafters.quant_self import QuantSelfDrafter

        return QuantSelfDrafter(engine.model)
    if name == "model":
        if not draft_path:
            raise SpecLedgerError("the 'model' drafter needs --draft PATH (a GGUF file or Hugging Face directory)")
        from specledger.engine.drafters.draft_model import DraftModelDrafter
        from specledger.engine.loader import load_model

        device = getattr(engine, "device", None)
        draft = load_model(draft_path, device=device if device is not None and device.type != "cpu" else None)
        return DraftModelDrafter(draft.model, engine.tokenizer, draft.tokenizer, engine.model.config.vocab_size)
    if name == "head":
        from specledger.engine.drafters.head import HEAD_SUFFIX, make_head_drafter

        path = draft_path if draft_path and str(draft_path).endswith(HEAD_SUFFIX) else None
        return make_head_drafter(engine.model, path)
    raise SpecLedgerError(f"unknown drafter {name!r}; choose one of: {', '.join(DRAFTERS)}")


_CALIBRATION_TEXT = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts several tokens and "
    "lets the target model verify them in one pass; accepted tokens are kept and the rest discarded. "
    "Question: Tom has 3 apples and buys 5 more. How many apples does he have? Answer: 8."
)


def _calibration_tokens(engine: TargetEngine) -> list[int]:
    if engine.tokenizer is not None:
        return engine.tokenizer.encode(_CALIBRATION_TEXT)
    import random

    rnd = random.Random(0)
    return [rnd.randrange(engine.model.config.vocab_size) for _ in range(64)]
