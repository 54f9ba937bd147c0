"""The one measured cost surface: seconds of one target forward as a function of the rows (query tokens)
per request, the batch (requests in the step) and the context (tokens already in each request's KV cache).

Pure numpy (no torch): the surface is read by forecasts, the simulator and the CLI, none of which needs a
model. Measured points come from ``specledger calibrate`` (this machine, or ``--device cuda``) or from an
import file (``calibrate --import FILE.jsonl``), one JSON object per line::

    {"batch": 64, "q": 4, "ctx": 512, "ms": 52.432}

``q`` is rows per request (the step forwards ``batch * q`` rows), ``ms`` the median milliseconds of one
forward; an optional ``repeats`` (integer >= 1) weights the point in the monotone fit, other keys (e.g.
``ms_min``) are kept in ``meta["extra"]``. The rules that turn points into a price are in
:class:`CostSurface`'s docstring.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from specledger.cost.serialized import CostSurfaceDict, ImportLineDict, SurfacePointDict
from specledger.errors import SpecLedgerError
from specledger.rundir import read_json, write_json_atomic

Source = Literal["measured", "interpolated", "extrapolated"]

KIND = "cost-surface"
#: relative standard error of a price read between measured points (no extrapolation on any axis)
INTERP_REL_SD = 0.05
#: added relative standard error per doubling beyond the measured range, summed over the axes
EXTRAP_REL_SD_PER_DOUBLING = 0.10
#: the power p of the batch axis: between measured batches the price is read on the straight line through
#: (batch^p, T^p) -- T^2 = F^2 + (G · batch)^2 with F and G fixed by the two bracketing measured batches
#: (CostSurface rule 2); p = 1 would be the straight line in batch
BATCH_POWER = 2.0
IMPORT_KEYS = ("batch", "q", "ctx", "ms")
IMPORT_EXAMPLE = '{"batch": 1, "q": 4, "ctx": 512, "ms": 23.5}'


@dataclass(frozen=True)
class SurfacePoint:
    """One measured forward: ``batch`` requests of ``rows`` query tokens each over ``context`` cached tokens."""

    batch: int  # requests in the step (>= 1)
    rows: int  # rows (query tokens) per request in the step (>= 1); total rows = batch * rows
    context: int  # tokens already in each request's KV cache (>= 0)
    seconds: float  # median seconds of one target forward (> 0, finite)
    repeats: int = 1


@dataclass(frozen=True)
class Lookup:
    """A price read off the surface, with where it came from and how sure it is."""

    seconds: float
    source: Source
    rel_sd: float  # relative standard error for forecast intervals (see CostSurface)


# ----------------------------------------------------------------------------- small pure helpers


def isotonic(values: Sequence[float], weights: Sequence[float] | None = None) -> np.ndarray:
    """Weighted least-squares non-decreasing fit of ``values`` (pool adjacent violators): a run of
    decreasing neighbours is replaced by its weighted mean, so one noisy high point is pooled with the
    ones after it instead of ratcheting every later value up (as a running max would)."""
    w = [1.0] * len(values) if weights is None else [float(x) for x in weights]
    blocks: list[tuple[float, float, int]] = []  # (mean, weight, members)
    for y, wi in zip(values, w):
        blocks.append((float(y), wi, 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append(((m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2))
    return np.array([m for m, _, n in blocks for _ in range(n)], dtype=float)


def doublings(x: float, lo: float, hi: float) -> float:
    """How far ``x`` lies outside [lo, hi] in doublings: log2(x / hi) above, log2(lo / x) below, 0 inside."""
    if x > hi:
        return math.log2(x / hi)
    if x < lo:
        return math.log2(lo / x)
    return 0.0


def _pow(a: Any, p: float) -> Any:
    """``a ** p``, skipped for p = 1 (the plain linear reads on every lookup: ``a ** 1`` is ``a`` exactly)."""
    return a if p == 1 else a ** p


def along(axis: Sequence[float], x: float, values: np.ndarray, dists: np.ndarray,
          offset: float = 0.0, power: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Read rows of ``values`` (one per measured ``axis`` coordinate, ascending) at ``x``, straight lines
    drawn in the coordinates (x^p, v^p) with p = ``power`` (p = 1: plain piecewise linear).

    Inside the axis, between bracketing rows (x0, v0) and (x1, v1):
    v = ((1 - u) · v0^p + u · v1^p)^(1/p), u = (x^p - x0^p) / (x1^p - x0^p), a weighted power mean of v0
    and v1 (non-decreasing in each; exact where the two are equal). Above the last: that line through the
    last two rows continued, its slope in v^p clipped at >= 0 (one row only: that row). Below the first:
    the first row (clamped). ``dists`` (same shape) carries the extrapolation distance of every value;
    the result's is the largest of the rows used plus the doublings of ``x`` outside the axis (computed on
    ``x + offset``, so a context of 0 has a finite distance)."""
    n = len(axis)
    if x <= axis[0]:
        v, d = values[0], dists[0]
    elif x >= axis[-1]:
        v, d = values[-1], dists[-1]
        if x > axis[-1] and n >= 2:
            slope = np.maximum((_pow(values[-1], power) - _pow(values[-2], power))
                               / (_pow(axis[-1], power) - _pow(axis[-2], power)), 0.0)
            v = np.where(slope > 0, _pow(_pow(values[-1], power) + slope * (_pow(x, power) - _pow(axis[-1], power)),
                                         1 / power), v)
            d = np.maximum(d, dists[-2])
    else:
        j = bisect.bisect_right(axis, x)
        u = (_pow(x, power) - _pow(axis[j - 1], power)) / (_pow(axis[j], power) - _pow(axis[j - 1], power))
        if u == 0.0:
            v, d = values[j - 1], dists[j - 1]
        else:
            lo, hi = values[j - 1], values[j]
            mean = _pow(_pow(lo, power) + u * (_pow(hi, power) - _pow(lo, power)), 1 / power)
            v = np.where(lo == hi, lo, mean)  # exact where the two are equal (p-th power and root need not be)
            d = np.maximum(dists[j - 1], dists[j])
    return v, d + doublings(x + offset, axis[0] + offset, axis[-1] + offset)


def monotone(values: np.ndarray, dists: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Running max along the last axis (rows). Values combined from monotone lines with non-negative weights
    are already monotone; only a clipped extrapolation slope can dent them. A raised value inherits the
    largest distance up to it."""
    m = np.maximum.accumulate(values)
    if np.array_equal(m, values):
        return values, dists
    return m, np.where(m > values, np.maximum.accumulate(dists), dists)


#: a batch, row count, context or repeat count above this is not a measurement (and would overflow floats)
MAX_AXIS = 2**53


def _shown(v: Any) -> str:
    """``repr(v)``, short: a 10**400 from a file is not echoed digit by digit."""
    text = repr(v) if not (isinstance(v, int) and v.bit_length() > 64) else f"an integer of {v.bit_length()} bits"
    return text if len(text) <= 60 else text[:57] + "..."


def point_problem(batch: Any, rows: Any, context: Any, seconds: Any, repeats: Any = 1) -> str | None:
    """What is wrong with one point's values (None: nothing). Integers must lie within ±2**53 (a float holds
    them exactly; 10**400 from a file is refused, not overflowed)."""
    for name, v in (("batch", batch), ("rows", rows), ("context", context), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            return f"{name} must be an integer, got {_shown(v)}"
        if isinstance(v, (int, np.integer)) and abs(int(v)) > MAX_AXIS:
            return f"{name} must be an integer up to {MAX_AXIS}, got {_shown(v)}"
        if not math.isfinite(v) or v != int(v):
            return f"{name} must be an integer, got {_shown(v)}"
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.integer, np.floating)):
        return f"the time must be a number, got {_shown(seconds)}"
    if isinstance(seconds, (int, np.integer)) and abs(int(seconds)) > MAX_AXIS:
        return f"the time must be finite and at most {MAX_AXIS}, got {_shown(seconds)}"
    if batch < 1 or rows < 1:
        return f"batch and rows per request must be >= 1, got batch={batch}, rows={rows}"
    if context < 0:
        return f"context must be >= 0, got {context}"
    if repeats < 1:
        return f"repeats must be >= 1, got {repeats}"
    if not math.isfinite(seconds) or seconds <= 0:
        return f"the time must be finite and > 0, got {seconds!r}"
    return None


# ----------------------------------------------------------------------------- the surface


class CostSurface:
    """T(rows per request, batch, context) of one target forward, from measured points.

    Rules, in the order a price is built:

    1. Rows, at every measured (batch, context): the measured times along rows are made non-decreasing by
       isotonic regression (pool adjacent violators, weights = repeats; :func:`isotonic`), not a running max:
       noise such as q = 16 at 23.2 ms after q = 8 at 24.3 ms is pooled (both 23.7 ms). The raw values are
       kept (:attr:`points`); the fitted ones are :attr:`monotone_points`. Each such line is read on the
       union of all measured rows (the knots): piecewise linear between its own measured rows, above its
       last row the slope of its last two (clipped at >= 0, one row only: slope 0), below its first row its
       first value.
    2. Batch, at every measured context, between the batches measured at that context (a grid may be
       incomplete: each context uses its own batches): a forward costs the larger of a floor that does not
       grow with the batch (kernel launches, the weight stream) and work proportional to the batch (KV
       reads, arithmetic per row), joined smoothly: T(b)^2 = F^2 + (G · b)^2, with F and G fixed per knot
       by the two bracketing measured batches b0 < b1, i.e. T^2 is linear in b^2 (:func:`along` with
       p = :data:`BATCH_POWER`):

           T(b) = sqrt(T(b0)^2 + (T(b1)^2 - T(b0)^2) · (b^2 - b0^2) / (b1^2 - b0^2))

       A straight line in b (the rule before) prices the knee between a launch-bound batch 1 and a
       work-bound batch 64 too high (issue 48: the H200 file's held-back batches 4 and 16 at context 4096,
       21.6 % at the median, all high); the H200 batches 4 and 16 measured at context 512, read from 1 and
       64: 11.8 % median / 49.4 % worst straight, 6.3 % / 26.9 % by this rule against the raw medians (no
       rows-monotone price can beat 24.2 % there), 1.8 % / 8.5 % against the held-out lines' isotonic fit
       (tests/test_cost_surface.py).
       This is a weighted power mean of the two measured values, so it lies between them and stays
       non-decreasing in rows. Beyond the largest measured batch the same curve continues (its slope in
       T^2 per knot clipped at >= 0; it tends to G · b, work proportional to the batch); below the smallest,
       the smallest's value.
    3. Context: linear between the two bracketing measured contexts; beyond the largest the slope of the
       last two (clipped at >= 0), below the smallest the smallest's value. With one measured context,
       context is not an axis: every other context gets that context's value (slope 0 -- nothing measured
       says which way it goes) and is labelled extrapolated.
    4. Rows again: piecewise linear between the knots of the line built in 2-3, beyond the last knot the
       slope of the last two (clipped at >= 0), below the first the first value. After each of 2 and 3 a
       running max along the knots removes any dent a clipped slope can make, so the price is
       non-decreasing in rows everywhere.

    Labels: ``measured`` only at a measured (batch, rows, context); ``interpolated`` when no axis was read
    outside its measured range (every value used lies inside the hull on every axis); else
    ``extrapolated``. ``rel_sd``: at a measured point |raw - fitted| / fitted (0 unless the isotonic fit
    pooled it: the only spread a median without its repeats shows); interpolated :data:`INTERP_REL_SD`
    (5 %); extrapolated 5 % + :data:`EXTRAP_REL_SD_PER_DOUBLING` (10 %) per doubling outside the measured
    range, summed over the axes (rows and batch: log2(x / last) or log2(first / x); context the same on
    context + 1).
    """

    def __init__(self, points: Sequence[SurfacePoint], source: str, meta: dict | None = None, *,
                 batch_power: float = BATCH_POWER) -> None:
        """``batch_power`` is rule 2's p (1 = straight in batch; kept for held-out comparisons, not saved)."""
        if not points:
            raise SpecLedgerError(f"a cost surface needs at least one measured point ({source})")
        seen: set[tuple[int, int, int]] = set()
        for p in points:
            problem = point_problem(p.batch, p.rows, p.context, p.seconds, p.repeats)
            if problem:
                raise SpecLedgerError(f"bad cost surface point {p} ({source}): {problem}")
            key = (int(p.batch), int(p.rows), int(p.context))
            if key in seen:
                raise SpecLedgerError(f"duplicate cost surface point batch={key[0]} rows={key[1]} context={key[2]} "
                                      f"({source}); keep one measurement per point")
            seen.add(key)
        self.points: tuple[SurfacePoint, ...] = tuple(sorted(
            (SurfacePoint(int(p.batch), int(p.rows), int(p.context), float(p.seconds), int(p.repeats)) for p in points),
            key=lambda p: (p.context, p.batch, p.rows)))
        if not (isinstance(batch_power, (int, float)) and math.isfinite(batch_power) and batch_power >= 1):
            raise SpecLedgerError(f"batch_power must be a finite number >= 1, got {batch_power!r}")
        self.source = source
        self.meta: dict[str, Any] = dict(meta or {})
        self.batch_power = float(batch_power)
        self._knots = np.array(sorted({p.rows for p in self.points}), dtype=float)
        self._contexts = sorted({p.context for p in self.points})
        self._batches_at: dict[int, list[int]] = {}
        self._lines: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (context, batch) -> values, dists
        fitted: list[SurfacePoint] = []
        for c in self._contexts:
            bs = sorted({p.batch for p in self.points if p.context == c})
            self._batches_at[c] = bs
            for b in bs:
                line = [p for p in self.points if p.context == c and p.batch == b]
                iso = isotonic([p.seconds for p in line], [p.repeats for p in line])
                fitted += [SurfacePoint(p.batch, p.rows, p.context, float(s), p.repeats) for p, s in zip(line, iso)]
                self._lines[(c, b)] = self._line_at_knots([p.rows for p in line], iso)
        self.monotone_points: tuple[SurfacePoint, ...] = tuple(fitted)
        self._measured = {(p.batch, p.rows, p.context): (raw.seconds, p.seconds)
                          for raw, p in zip(self.points, fitted)}
        self._at_batch: dict[tuple[int, float], tuple[np.ndarray, np.ndarray]] = {}

    # ------------------------------------------------------------------ building blocks
    def _line_at_knots(self, rows: Sequence[int], fitted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One measured (batch, context) line read at every knot (rule 1): values and extrapolation distances."""
        axis = [float(r) for r in rows]
        out = [along(axis, k, fitted[:, None], np.zeros((len(axis), 1))) for k in self._knots]
        return np.array([v[0] for v, _ in out]), np.array([d[0] for _, d in out])

    def _batch_line(self, context: int, batch: float) -> tuple[np.ndarray, np.ndarray]:
        """The knot line at ``batch`` within one measured ``context`` (rule 2), cached."""
        key = (context, batch)
        hit = self._at_batch.get(key)
        if hit is None:
            bs = self._batches_at[context]
            vals = np.stack([self._lines[(context, b)][0] for b in bs])
            dists = np.stack([self._lines[(context, b)][1] for b in bs])
            hit = self._at_batch[key] = monotone(*along([float(b) for b in bs], float(batch), vals, dists,
                                                        power=self.batch_power))
        return hit

    def _knot_line(self, batch: float, context: float) -> tuple[np.ndarray, np.ndarray]:
        """The knot line at (batch, context) (rules 2-3)."""
        cs = self._contexts
        if context <= cs[0]:
            use = cs[:1]  # clamped below (one measured context: not an axis, slope 0 either side)
        elif context >= cs[-1]:
            use = cs[-2:]  # at or beyond the last: the slope of the last two
        else:
            j = bisect.bisect_right(cs, context)
            use = cs[j - 1:j + 1]
        lines = [self._batch_line(c, batch) for c in use]
        vals, dists = np.stack([v for v, _ in lines]), np.stack([d for _, d in lines])
        return monotone(*along([float(c) for c in use], float(context), vals, dists, offset=1.0))

    # ------------------------------------------------------------------ prices
    def lookup(self, rows: float, batch: float = 1, context: float = 0) -> Lookup:
        """The price of one forward of ``batch`` requests x ``rows`` rows each over ``context`` cached tokens."""
        hit = self._measured.get((batch, rows, context))  # 4.0 == 4: a float at a measured point hits
        if hit is not None:
            raw, fitted = hit
            return Lookup(fitted, "measured", abs(raw - fitted) / fitted)
        vals, dists = self._knot_line(float(batch), float(context))
        v, d = along(list(self._knots), float(rows), vals[:, None], dists[:, None])
        dist = float(d[0])
        if dist == 0.0:
            return Lookup(float(v[0]), "interpolated", INTERP_REL_SD)
        return Lookup(float(v[0]), "extrapolated", INTERP_REL_SD + EXTRAP_REL_SD_PER_DOUBLING * dist)

    def forward_s(self, rows: float, batch: float = 1, context: float = 0) -> float:
        """Seconds of one forward (:meth:`lookup`'s ``seconds``)."""
        return self.lookup(rows, batch, context).seconds

    def step_s(self, total_rows: int, batch: int, context: float) -> float:
        """A batched step of ``total_rows`` rows over ``batch`` requests:
        forward_s(total_rows / batch, batch, context)."""
        b = max(int(batch), 1)
        return self.forward_s(max(total_rows, b) / b, b, context)

    def round_s(self, rows: int, context: float) -> float:
        """A solo round verifying ``rows`` rows: forward_s(rows, 1, context)."""
        return self.forward_s(rows, 1, context)

    # ------------------------------------------------------------------ axes
    @property
    def rows_axis(self) -> tuple[int, ...]:
        """Rows per request measured anywhere (the knots)."""
        return tuple(int(k) for k in self._knots)

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(sorted({p.batch for p in self.points}))

    @property
    def contexts(self) -> tuple[int, ...]:
        return tuple(self._contexts)

    # ------------------------------------------------------------------ files
    def to_dict(self) -> CostSurfaceDict:
        return {"kind": KIND, "source": self.source, "meta": self.meta,
                "points": [SurfacePointDict(**asdict(p)) for p in self.points]}

    @classmethod
    def from_dict(cls, d: CostSurfaceDict, where: str = "cost surface") -> CostSurface:
        if not isinstance(d, dict) or d.get("kind") != KIND or not isinstance(d.get("points"), list):
            raise SpecLedgerError(f"{where} is not a cost surface (kind {KIND!r} with a points list); "
                                  "write one with `specledger calibrate --out FILE`")
        pts = []
        for i, p in enumerate(d["points"]):
            try:
                pts.append(SurfacePoint(p["batch"], p["rows"], p["context"], p["seconds"], p.get("repeats", 1)))
            except (KeyError, TypeError, AttributeError):
                raise SpecLedgerError(f"{where}: point {i} needs batch, rows, context, seconds; "
                                      "re-write it with `specledger calibrate`") from None
        return cls(pts, str(d.get("source", "")), dict(d.get("meta") or {}))

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_dict` atomically (:func:`specledger.rundir.write_json_atomic`)."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostSurface:
        """A surface profile JSON, or an import-format ``.jsonl`` (:meth:`from_jsonl`)."""
        p = Path(path)
        if not p.is_file():
            raise SpecLedgerError(f"cost surface not found: {p}; write one with `specledger calibrate --out {p}`")
        if p.suffix == ".jsonl":
            return cls.from_jsonl(p)
        return cls.from_dict(read_json(p, "give a cost surface (`specledger calibrate --out FILE`)"), str(p))

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike) -> CostSurface:
        """Read the import format (module docstring); every bad line is a one-line SpecLedgerError naming
        the file, the line and the fix."""
        p = Path(path)
        if not p.is_file():
            raise SpecLedgerError(f"cost surface file not found: {p}")
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise SpecLedgerError(
                f"{p} is not UTF-8 text; give one JSON object per line like {IMPORT_EXAMPLE}"
            ) from None
        points: list[SurfacePoint] = []
        extra: list[dict[str, Any]] = []
        first_line: dict[tuple[int, int, int], int] = {}
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                point, more = _parse_import_line(line, f"{p}:{n}")
                key = (point.batch, point.rows, point.context)
                if key in first_line:
                    raise SpecLedgerError(f"{p}:{n}: duplicate point batch={key[0]} q={key[1]} ctx={key[2]} (also on "
                                          f"line {first_line[key]}); keep one line per point")
                first_line[key] = n
                points.append(point)
                if more:
                    extra.append({"batch": point.batch, "q": point.rows, "ctx": point.context, **more})
        if not points:
            raise SpecLedgerError(f"{p}: no points (empty file); give one JSON object per line like {IMPORT_EXAMPLE}")
        meta: dict[str, Any] = {"file": str(p)}
        if extra:
            meta["extra"] = extra
        return cls(points, f"measured surface imported from {p.name} ({len(points)} points)", meta)

    def to_jsonl(self) -> str:
        """The import format, one line per measured (raw) point, newline-terminated."""
        lines = []
        for p in self.points:
            obj: ImportLineDict = {"batch": p.batch, "q": p.rows, "ctx": p.context, "ms": p.seconds * 1e3}
            if p.repeats != 1:
                obj["repeats"] = p.repeats
            lines.append(json.dumps(obj))
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return (f"CostSurface({len(self.points)} points, rows {self.rows_axis}, batches {self.batches}, "
                f"contexts {self.contexts}; {self.source})")


def _parse_import_line(line: str, where: str) -> tuple[SurfacePoint, dict[str, Any]]:
    """One import line -> (point, its extra keys); a bad line is a one-line SpecLedgerError at ``where``."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SpecLedgerError(f"{where}: not valid JSON ({exc.msg}); each line must be one object like "
                              f"{IMPORT_EXAMPLE}") from None
    except (ValueError, RecursionError) as exc:  # an int past 4300 digits; nesting past the recursion limit
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise SpecLedgerError(f"{where}: not readable JSON ({reason}); each line must be one object like "
                              f"{IMPORT_EXAMPLE}") from None
    if not isinstance(obj, dict):
        raise SpecLedgerError(f"{where}: expected a JSON object like {IMPORT_EXAMPLE}, got {type(obj).__name__}")
    missing = [k for k in IMPORT_KEYS if k not in obj]
    if missing:
        raise SpecLedgerError(f"{where}: missing {', '.join(missing)}; each line needs batch, q (rows per request), "
                              f"ctx and ms, like {IMPORT_EXAMPLE}")
    repeats = obj.get("repeats", 1)
    problem = point_problem(obj["batch"], obj["q"], obj["ctx"], obj["ms"], repeats)
    if problem:
        problem = problem.replace("rows per request", "q").replace("the time", "ms").replace("rows=", "q=")
        raise SpecLedgerError(f"{where}: {problem}; fix or delete that line")
    more = {k: v for k, v in obj.items() if k not in (*IMPORT_KEYS, "repeats")}
    return SurfacePoint(int(obj["batch"]), int(obj["q"]), int(obj["ctx"]), float(obj["ms"]) / 1e3, int(repeats)), more


__all__ = ["BATCH_POWER", "CostSurface", "EXTRAP_REL_SD_PER_DOUBLING", "INTERP_REL_SD", "KIND", "Lookup", "Source",
           "SurfacePoint", "along", "doublings", "isotonic", "monotone", "point_problem"]
