"""``specledger calibrate``: measure the cost surface of the target on this machine, directly.

A grid of forward passes, each timed as the median of ``repeats`` after one untimed warm-up
(which also pays one-off kernel/primitive creation):

    solo rounds    rows ∈ ROWS         × context ∈ contexts     (model forward over rows at start = context)
    batched steps  batch ∈ BATCHES     × rows per request ∈ {1, 3, 5} × context   (forward_packed)
    prefill        prompt tokens ∈ PROMPTS
    drafting       model-free drafters (ngram, suffix) proposing γ ∈ {1, 4, 8} over contexts of that length

``--device cuda`` moves the model there and times with ``torch.cuda.synchronize`` (the engine
itself decodes on the CPU; this measures what the same forwards cost on the accelerator).

The KV cache content does not change the cost of a forward (attention reads every slot up to
the position either way), so no real prompt is needed. The points are fitted into the same
:class:`~specledger.cost.costmodel.CostModel` forms a run fits from its traces (non-negative
least squares, so the result is monotone); the per-round ``other`` overhead cannot be measured
without decoding and is left at 0 (say so in ``source``) — a run's traces supply it.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from specledger.cost.costmodel import (
    BEGIN_TERMS,
    DRAFT_TERMS,
    FORWARD_TERMS,
    OTHER_TERMS,
    PREFILL_TERMS,
    CostModel,
    Part,
    draft_features,
    fit_part,
    forward_features,
    prefill_features,
)
from specledger.cost.surface import CostSurface, SurfacePoint
from specledger.engine.drafters.catalog import PLAIN, model_free_names
from specledger.rundir import write_text_atomic

if TYPE_CHECKING:
    from specledger.engine.model import Transformer

ROWS = (1, 2, 3, 5, 9, 17)
BATCHES = (2, 4, 8)
PER_REQUEST_ROWS = (1, 3, 5)
CONTEXTS = (64, 256, 1024, 2048)
PROMPTS = (16, 64, 256, 512, 1024)
#: rows per request timed by :func:`measure_rows_axis`: every γ + 1 up to 33 where the cost may step
#: (powers of two and the row after each), enough to see the verify premium of many candidates
ROWS_AXIS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 16, 17, 24, 25, 32, 33)


def _timer(device: str) -> Callable[..., float]:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def timed(repeats: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
        """Median seconds of ``fn(*args, **kwargs)`` over ``repeats`` calls after one untimed warm-up."""
        fn(*args, **kwargs)  # warm-up
        sync()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            sync()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    return timed


def grid_size(contexts: Sequence[int]) -> int:
    return len(ROWS) * len(contexts) + len(BATCHES) * len(PER_REQUEST_ROWS) * len(contexts) + len(PROMPTS)


class CalibrationPointsDict(TypedDict, total=False):
    """The measured grid, each point's ``seconds`` beside its coordinates: solo forwards (``rows``, ``batch`` 1,
    ``context``), batched forwards (``rows`` in all), prefills (``prompt_tokens``) and per model-free drafter its
    proposals (``gamma``, ``context``)."""

    solo: list[dict[str, float]]
    batched: list[dict[str, float]]
    prefill: list[dict[str, float]]
    draft: dict[str, list[dict[str, float]]]


def measure(
    model: Transformer,
    contexts: Sequence[int] = CONTEXTS,
    repeats: int = 3,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> CalibrationPointsDict:
    """Time the grid (see module docstring); returns the raw points in seconds."""
    cfg = model.config
    max_rows = max(max(ROWS), max(BATCHES) * max(PER_REQUEST_ROWS))
    contexts = [c for c in contexts if c + max_rows + 1 <= cfg.max_seq_len] or [max(cfg.max_seq_len // 4, 1)]
    prompts = [p for p in PROMPTS if p < cfg.max_seq_len] or [max(cfg.max_seq_len // 2, 1)]
    timed = _timer(device)
    tok = lambda n: [(7 * i + 3) % cfg.vocab_size for i in range(n)]  # noqa: E731
    points: CalibrationPointsDict = {"solo": [], "batched": [], "prefill": []}
    step = progress or (lambda _msg: None)
    with torch.inference_mode():
        cap = min(cfg.max_seq_len, max(contexts) + max_rows + 1)
        cache = model.new_cache(cap)
        for c in contexts:
            for r in ROWS:
                x = torch.tensor([tok(r)])
                s = timed(repeats, model, x, c, cache)
                points["solo"].append({"rows": r, "batch": 1, "context": c, "seconds": s})
                step(f"solo rows={r} ctx={c}")
        bcache = model.new_cache(cap, batch_size=max(BATCHES))
        for c in contexts:
            for b in BATCHES:
                for per in PER_REQUEST_ROWS:
                    slots = [s for s in range(b) for _ in range(per)]
                    pos = [c + i for _ in range(b) for i in range(per)]
                    toks = tok(b * per)
                    s = timed(repeats, model.forward_packed, toks, slots, pos, bcache)
                    points["batched"].append({"rows": b * per, "batch": b, "context": c, "seconds": s})
                    step(f"batch={b} rows={b * per} ctx={c}")
        for p in prompts:
            pcache = model.new_cache(min(cfg.max_seq_len, p + 1))
            x = torch.tensor([tok(p)])
            s = timed(repeats, model, x, 0, pcache, last_only=True)
            points["prefill"].append({"prompt_tokens": p, "seconds": s})
            step(f"prefill P={p}")
    return points


def measure_drafters(vocab_size: int, contexts: Sequence[int], repeats: int = 5) -> dict[str, list[dict[str, float]]]:
    """Model-free drafters' propose time over pseudo-text contexts (repetitive, so they find matches)."""
    from specledger.engine.drafters.registry import make_drafter
    from specledger.engine.sampling import SamplingParams

    out: dict[str, list[dict[str, float]]] = {}
    params = SamplingParams()
    rng = torch.Generator().manual_seed(0)
    timed = _timer("cpu")
    for name in model_free_names():
        try:
            d = make_drafter(name, None)
        except Exception:  # noqa: BLE001 - a drafter that needs an engine is simply not calibrated here
            continue
        pts = []
        for c in contexts:
            ctx = [(i * 31 + (i // 50)) % min(vocab_size, 97) for i in range(c)]
            d.begin(ctx, params)
            for g in (1, 4, 8):
                s = timed(repeats, d.propose, ctx, g, params, rng)
                pts.append({"gamma": g, "context": c, "seconds": s})
            d.end(ctx, [])
        out[name] = pts
    return out


def fit_points(points: CalibrationPointsDict, source: str) -> CostModel:
    """The cost model of measured grid points (same forms as a run's fit)."""
    fwd = [(forward_features(p["rows"], p["batch"], p["context"]), p["seconds"])
           for p in points["solo"] + points["batched"]]
    forward = fit_part(FORWARD_TERMS, [x for x, _ in fwd], [y for _, y in fwd], n_boot=30)
    pre = points["prefill"]
    prefill = fit_part(PREFILL_TERMS, [prefill_features(p["prompt_tokens"]) for p in pre],
                       [p["seconds"] for p in pre], n_boot=30)
    draft = {}
    for name, pts in points.get("draft", {}).items():
        draft[name] = fit_part(DRAFT_TERMS, [draft_features(p["gamma"], p["context"]) for p in pts],
                               [p["seconds"] for p in pts], n_boot=30)
    return CostModel(source, forward, prefill, draft, {PLAIN.name: Part.zero(OTHER_TERMS)},
                     {k: Part.zero(BEGIN_TERMS) for k in draft},
                     {"points": points, "other": "not measured by calibrate (0); a run's traces fit it"})


def surface_from_points(points: CalibrationPointsDict | Sequence[dict[str, float]], source: str) -> CostSurface:
    """The measured forwards of a calibration as a :class:`CostSurface`: ``points`` is :func:`measure`'s
    dict (its ``solo`` and ``batched`` lists) or a list of ``{"rows", "batch", "context", "seconds"}`` with
    ``rows`` the step's total rows (batch x rows per request), as :func:`measure` records them."""
    pts = list(points.get("solo", [])) + list(points.get("batched", [])) if isinstance(points, dict) else list(points)
    return CostSurface([SurfacePoint(int(p["batch"]), int(p["rows"]) // int(p["batch"]), int(p["context"]),
                                     float(p["seconds"]), int(p.get("repeats", 1))) for p in pts], source)


def measure_rows_axis(
    model: Transformer,
    contexts: Sequence[int],
    rows: Sequence[int] = ROWS_AXIS,
    repeats: int = 5,
    interleaved: bool = True,
    device: str = "cpu",
) -> CostSurface:
    """Time solo forwards of ``rows`` rows at each context (batch 1): the rows axis a forecast of many
    candidates needs, measured where it is needed instead of extrapolated from the γ a run used.

    One untimed warm-up pass over every point, then ``repeats`` timed passes. ``interleaved``: each pass
    visits every point once (round-robin), so drift of the machine (clock, another process) hits every
    point alike instead of whole points; else each point's repeats run back to back. The price of a point is
    the median of its repeats: a decode's rounds pay the typical forward, not the luckiest one (on a
    shared 2-core VM the fastest of 3 sat 10-25 % below the median, unevenly across rows, and bent the
    shape), and one busy moment cannot move a median of 5 (the run fits the level on its own rounds:
    ``CostModel``). Contexts that do not fit the model (context + max rows > max_seq_len) are
    left out; none fitting is a quarter of max_seq_len. About 3 contexts x 18 rows x 3 repeats forwards.
    On cuda the model must already be there and the call made under ``torch.device(device)``, as
    :func:`calibrate` does."""
    cfg = model.config
    top = max(rows)
    ctxs = [c for c in contexts if c + top + 1 <= cfg.max_seq_len] or [max(cfg.max_seq_len // 4, 0)]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    grid = [(c, r) for c in ctxs for r in rows]
    inputs = {r: torch.tensor([[(7 * i + 3) % cfg.vocab_size for i in range(r)]]) for r in rows}
    samples: dict[tuple[int, int], list[float]] = {g: [] for g in grid}
    with torch.inference_mode():
        cache = model.new_cache(min(cfg.max_seq_len, max(ctxs) + top + 1))

        def once(c: int, r: int) -> float:
            t0 = time.perf_counter()
            model(inputs[r], c, cache)
            sync()
            return time.perf_counter() - t0

        for c, r in grid:  # warm-up (kernel / primitive creation)
            once(c, r)
        if interleaved:
            for _ in range(repeats):
                for c, r in grid:
                    samples[(c, r)].append(once(c, r))
        else:
            for c, r in grid:
                samples[(c, r)] = [once(c, r) for _ in range(repeats)]
    order = "interleaved" if interleaved else "back to back"
    source = (f"rows axis measured on {platform.processor() or platform.machine()} ({device}, solo, {repeats} "
              f"repeats {order}, median, {time.strftime('%Y-%m-%dT%H:%M:%S%z')})")
    return CostSurface([SurfacePoint(1, r, c, statistics.median(samples[(c, r)]), repeats) for c, r in grid],
                       source)


def check_device(device: str) -> None:
    """``cpu``, or ``cuda[:N]`` where torch sees a CUDA device; anything else is a one-line error."""
    from specledger.engine.device import resolve_device

    resolve_device(device)


def surface_path(out: str | os.PathLike) -> Path:
    """Where :func:`write_calibration` puts the surface beside a cost model JSON: ``NAME.surface.json``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.surface.json")


def write_calibration(cost: CostModel, out: str | os.PathLike) -> CostSurface:
    """Write a calibration: ``out`` ending in ``.jsonl`` gets the surface in the import format (what
    ``calibrate --device cuda --out gpu.jsonl`` makes for ``calibrate --import`` elsewhere); any other
    ``out`` gets the cost model JSON and its forward points as a surface profile at :func:`surface_path`.
    Returns the surface."""
    surface = surface_from_points(cost.meta["points"], cost.source)
    if str(out).endswith(".jsonl"):
        write_text_atomic(out, surface.to_jsonl())
    else:
        cost.save(out)
        surface.save(surface_path(out))
    return surface


def calibrate(
    target: str | None = None,
    dtype: str = "auto",
    device: str = "cpu",
    contexts: Sequence[int] = CONTEXTS,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
    model: Transformer = None,
) -> CostModel:
    """Measure and fit the cost model of ``target`` (or of an already built ``model``) on ``device``."""
    check_device(device)
    if model is None:
        from specledger.engine.build import deploy_dtype
        from specledger.engine.loader import load_model

        model = load_model(target, dtype=deploy_dtype(target, dtype, device)).model
    if device == "cpu":
        points = measure(model, contexts, repeats, device, progress)
    else:  # weights, RoPE tables and every tensor the forward creates live on the device
        model = model.to(device)
        model.rope_cos, model.rope_sin = model.rope_cos.to(device), model.rope_sin.to(device)
        model._rope_cache = None
        with torch.device(device):
            points = measure(model, contexts, repeats, device, progress)
    points["draft"] = measure_drafters(model.config.vocab_size, [c for c in contexts if c <= 4096][:3])
    name = platform.processor() or platform.machine()
    source = (f"calibrated on {name} ({torch.get_num_threads()} threads, {device}, "
              f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')})")
    return fit_points(points, source)
