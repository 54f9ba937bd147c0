"""Build a drafter by name. One instance serves many requests (the suffix drafter's
cross-request tree lives in it), so build once per (engine, drafter) pair."""

from __future__ import annotations

from specledger.engine.drafters import catalog
from specledger.engine.drafters.base import Drafter, DrafterOptions
from specledger.engine.protocol import TargetEngine

#: every name :func:`make_drafter` takes, plain (``none``) first (:mod:`specledger.engine.drafters.catalog`)
DRAFTERS: tuple[str, ...] = catalog.names()


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
    An unknown name is a one-line error listing the choices.
    """
    spec = catalog.by_name(name)
    options = DrafterOptions(layers=layers, draft_path=draft_path, calibration_tokens=calibration_tokens)
    return spec.drafter_class().from_engine(engine, options)
