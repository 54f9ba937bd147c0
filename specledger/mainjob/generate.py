"""The work behind ``specledger generate`` (the command: :mod:`specledger.cli.generate`): decode one prompt with
speculative decoding, then its round ledger (:mod:`specledger.analysis.request_ledger`) beside the warm, interleaved
comparison with plain decoding (:mod:`specledger.mainjob.compare`) and plain decode's bandwidth."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specledger.engine.drafters.catalog import NGRAM, PLAIN
from specledger.errors import SpecLedgerError

if TYPE_CHECKING:
    from specledger.engine.protocol import TargetEngine

#: how the ledger's floats are shown
LEDGER_FORMATS = {
    "E[L]": "{:.3f}", "t_draft_ms": "{:.2f}", "t_verify_ms": "{:.2f}", "t_other_ms": "{:.2f}",
    "t_round_ms": "{:.2f}", "ttft_ms": "{:.1f}", "tokens_per_s": "{:.1f}", "plain_tokens_per_s": "{:.1f}",
    "T0_ms": "{:.2f}", "predicted_speedup": "{:.3f}", "speedup": "{:.3f}",
    "decode_speedup": "{:.3f}", "end_to_end_speedup": "{:.3f}", "spec_tokens_per_s": "{:.1f}",
    "plain_decode_tokens_per_s": "{:.1f}", "plain_decode_GB_per_s": "{:.2f}", "machine_read_GB_per_s": "{:.1f}",
}


def ledger_rows(led: dict) -> list[tuple[str, str]]:
    """The ledger as (name, shown value) rows, drafter and gamma left out (they title the table)."""
    rows = []
    for k, v in led.items():
        if k in ("drafter", "gamma"):
            continue
        if isinstance(v, float) and k in LEDGER_FORMATS:
            v = LEDGER_FORMATS[k].format(v)
        elif k in ("decode_speedups", "end_to_end_speedups"):
            v = ", ".join(f"{x:.3f}" for x in v) or "-"
        elif k == "conditional_acceptance":
            v = ", ".join("-" if a is None else f"{a:.2f}" for a in v) or "-"
        rows.append((k, str(v)))
    return rows


def bandwidth(engine: TargetEngine, plain: Any) -> dict:
    """Plain decode's bandwidth beside this machine's read bandwidth measured now
    (:func:`specledger.engine.bandwidth.plain_decode_bandwidth`); ``plain`` is a plain-decoding record (or, with
    --drafter none, the run itself)."""
    from specledger.engine.bandwidth import plain_decode_bandwidth

    figures = plain_decode_bandwidth(engine.model, [plain], device=engine.device)
    for key in ("bytes_per_token", "kv_read_bytes_per_token", "mean_context"):  # the bandwidth line shows them
        figures.pop(key, None)
    return figures


def layers_of(d: Any) -> str | None:
    """The layer option that rebuilds a layerskip drafter without calibrating again."""
    layers = getattr(d, "layers", None)
    return ",".join(map(str, layers)) if layers else None


@dataclass
class GenerateOptions:
    """The options of ``specledger generate`` (see its help)."""

    prompt: str
    drafter: str = NGRAM.name
    gamma: int = 4
    tree_budget: int = 0
    tree_shape: str = "dynamic"
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: list[str] | None = None
    target: str | None = None
    draft: str | None = None
    layers: str | None = None
    dtype: str = "auto"
    device: str = "cpu"
    raw: bool = False
    compare: bool = True
    repeats: int = 2
    trace: Path | None = None

    def check(self) -> None:
        """Reject bad options before the (slow) model load."""
        from specledger.mainjob.tree_shape_spec import check_tree_shape

        if self.gamma < 0:
            raise SpecLedgerError(f"--gamma must be >= 0, got {self.gamma}")
        if self.tree_budget < 0:
            raise SpecLedgerError(f"--tree-budget must be >= 1 (0 for chains), got {self.tree_budget}")
        check_tree_shape(self.tree_shape)


def _compare(engine: TargetEngine, ids: Any, again: Callable[[], Any], o: GenerateOptions, kwargs: dict,
             tb: int) -> Any:
    from specledger.mainjob.compare import compare_plain_spec

    return compare_plain_spec(engine, ids, again, o.drafter, o.gamma, kwargs, repeats=o.repeats, tree_budget=tb)


def run_generate(o: GenerateOptions, on_text: Callable[[str], None] | None = None) -> tuple[Any, dict]:
    """Decode ``o.prompt`` (each emitted piece of text to ``on_text``, then a newline), then, with ``o.compare``,
    warm both sides up and interleave plain and speculative decoding; append the records to ``o.trace`` when
    given. Returns the speculative request's record and its ledger."""
    from specledger.analysis.request_ledger import request_ledger
    from specledger.engine.build import build_engine, weights_line
    from specledger.engine.decode import Emitted
    from specledger.engine.drafters.registry import make_drafter
    from specledger.engine.sampling import SamplingParams
    from specledger.mainjob.tree_shape_spec import tree_shape_from_spec
    from specledger.records import RequestRecord
    from specledger.rundir import append_records

    o.check()
    params = SamplingParams(temperature=o.temperature, top_k=o.top_k, top_p=o.top_p, seed=o.seed)
    engine = build_engine(o.target, o.dtype) if o.device == "cpu" else build_engine(o.target, o.dtype, o.device)
    ids = engine.loaded.encode_prompt(o.prompt, chat=not o.raw)
    tb = o.tree_budget if o.drafter != PLAIN.name else 0
    shape = tree_shape_from_spec(o.tree_shape, o.drafter) if tb else None

    def build(chosen: str | None = o.layers) -> Any:
        made = make_drafter(o.drafter, engine, layers=chosen, draft_path=o.draft)
        made.tree_shape = shape
        return made

    d = build()
    kwargs = dict(max_tokens=o.max_tokens, params=params, stop=o.stop or [])
    record = None
    gamma = o.gamma if o.drafter != PLAIN.name else 0
    for ev in engine.stream(ids, drafter=d, gamma=gamma, tree_budget=tb, **kwargs):
        if isinstance(ev, Emitted) and on_text is not None:
            on_text(ev.text)
        elif isinstance(ev, RequestRecord):
            record = ev
    if on_text is not None:
        on_text("\n")  # the streamed text ends before the comparison starts
    plain, comparison = None, None
    if o.compare and o.drafter != PLAIN.name:  # warm both sides up, then interleave (specledger.mainjob.compare)
        comparison = _compare(engine, ids, lambda: build(o.layers or layers_of(d)), o, kwargs, tb)
        record, plain = comparison.spec[-1], comparison.plain[-1]
    if o.trace is not None:
        append_records(o.trace, [r for r in (record, plain) if r is not None])
    led = {"weights": weights_line(engine).removeprefix("weights: "), **request_ledger(record, plain)}
    if shape is not None:
        led["tree_shape"] = shape.describe(tb, o.gamma)
    if comparison is not None:
        for key in ("speedup", "predicted_speedup"):  # one warm pair's figure; the medians below replace it
            led.pop(key, None)
        led.update(comparison.summary())
    led.update(bandwidth(engine, plain if plain is not None else record))
    return record, led
