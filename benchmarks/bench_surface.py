"""How well does the cost surface predict forwards it was not given? Hold-out checks on measured H200 surfaces.

For each import-format file (default: the two H200 measurements in ../shared/gpu, see its README), points
are held out, a :class:`~specledger.cost.surface.CostSurface` is built from the rest, and the held-out
points are predicted and compared with their measured medians:

  (i)   leave one out, every interior point (one the reduced surface labels interpolated);
  (ii)  rows extrapolation: every q = 16 held out (read from q <= 8);
        context extrapolation: all of batch 64 at context 4096 held out;
  (iii) batch interpolation: every batch 16 held out (between batches 4 and 64);
  (iv)  the issue-48 shape: batches 4 and 16 at context 512 held out (read from batches 1 and 64, as the
        file's context 4096 has only those), once straight in batch (the rule before) and once by rule 2,
        judged against the raw medians and against the held-out lines' own isotonic fit, with the floor no
        rows-monotone price can beat on the raw ones.

Then the roofline-free ratio T(q) / T(1) measured per batch and context. Prints, asserts nothing.

    .venv/bin/python benchmarks/bench_surface.py [FILE.jsonl ...]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

from specledger.cost.surface import BATCH_POWER, CostSurface, SurfacePoint

DEFAULT = [Path(__file__).resolve().parents[2] / "shared" / "gpu" / name
           for name in ("h200-hf-eager-llama3-8b.jsonl", "h200-hf-eager-smollm2-135m.jsonl")]


def hold_out(surface: CostSurface, held: Callable[[SurfacePoint], bool], batch_power: float = BATCH_POWER
             ) -> list[tuple[SurfacePoint, float, str]]:
    """Build a surface without the points ``held`` selects (batch axis power ``batch_power``, CostSurface rule 2);
    (point, predicted seconds, label) for each of them."""
    keep = [p for p in surface.points if not held(p)]
    out = [p for p in surface.points if held(p)]
    reduced = CostSurface(keep, "held out", batch_power=batch_power)
    return [(p, (look := reduced.lookup(p.rows, p.batch, p.context)).seconds, look.source) for p in out]


def leave_one_out(surface: CostSurface) -> tuple[list[tuple[SurfacePoint, float, str]], int]:
    """Every point predicted by a surface built without it; the interior ones (labelled interpolated) and
    the count of boundary ones left out of the table (their reduced surface extrapolates)."""
    rows = [hold_out(surface, lambda q, p=p: q == p)[0] for p in surface.points]
    interior = [r for r in rows if r[2] == "interpolated"]
    return interior, len(rows) - len(interior)


def show(title: str, rows: list[tuple[SurfacePoint, float, str]]) -> dict:
    """Print the held-out points' measured vs predicted times; return them with the median / max |error|."""
    print(f"\n  {title}")
    print(f"  {'batch':>5} {'q':>3} {'ctx':>5} {'measured ms':>11} {'predicted ms':>12} {'source':>13} {'error %':>8}")
    errs, points = [], []
    for p, pred, label in rows:
        err = 100 * (pred - p.seconds) / p.seconds
        errs.append(abs(err))
        points.append({"batch": p.batch, "rows": p.rows, "context": p.context, "measured_ms": 1e3 * p.seconds,
                       "predicted_ms": 1e3 * pred, "source": label, "error_pct": err})
        print(f"  {p.batch:>5} {p.rows:>3} {p.context:>5} {1e3 * p.seconds:>11.3f} {1e3 * pred:>12.3f} "
              f"{label:>13} {err:>+8.1f}")
    if errs:
        print(f"  median |error| {statistics.median(errs):.1f} %, max |error| {max(errs):.1f} % ({len(errs)} points)")
    return {"title": title, "points": points, "median_abs_error_pct": statistics.median(errs) if errs else None,
            "max_abs_error_pct": max(errs) if errs else None}


def knee_floor(surface: CostSurface, held: Callable[[SurfacePoint], bool]) -> float:
    """The smallest worst |error| a rows-monotone price can reach on the ``held`` raw points: over every line,
    every pair q < q' with T_q > T_q' forces one value for both, off by (T_q - T_q') / (T_q + T_q')."""
    lines: dict[tuple[int, int], dict[int, float]] = {}
    for p in filter(held, surface.points):
        lines.setdefault((p.batch, p.context), {})[p.rows] = p.seconds
    return max([0.0] + [(ln[a] - ln[b]) / (ln[a] + ln[b]) for ln in lines.values()
                        for a in ln for b in ln if a < b])


def ratios(surface: CostSurface) -> None:
    """T(q) / T(1) at every measured (batch, context): the verify premium of q rows per request."""
    qs = surface.rows_axis
    print("\n  measured T(q) / T(1) per batch and context (raw medians)")
    print(f"  {'batch':>5} {'ctx':>5} " + " ".join(f"{'q=' + str(q):>6}" for q in qs))
    raw = {(p.batch, p.rows, p.context): p.seconds for p in surface.points}
    for c in surface.contexts:
        for b in surface.batches:
            if (b, 1, c) not in raw:
                continue
            cells = [f"{raw[(b, q, c)] / raw[(b, 1, c)]:>6.2f}" if (b, q, c) in raw else f"{'-':>6}" for q in qs]
            print(f"  {b:>5} {c:>5} " + " ".join(cells))


def check(path: Path) -> list[dict]:
    """Every hold-out of the module docstring on one import file, then its T(q) / T(1); returns the
    hold-outs (see :func:`show`)."""
    surface = CostSurface.from_jsonl(path)
    print(f"\n=== {path.name}: {surface!r}")
    interior, boundary = leave_one_out(surface)
    out = [show(f"(i) leave one out, every interior point ({boundary} boundary points would be extrapolated: "
                "left out)", interior)]
    top = max(surface.rows_axis)
    out.append(show(f"(ii-a) rows extrapolation: all q={top} held out", hold_out(surface, lambda p: p.rows == top)))
    big, far = max(surface.batches), max(surface.contexts)
    out.append(show(f"(ii-b) context extrapolation: batch {big} at context {far} held out",
                    hold_out(surface, lambda p: p.batch == big and p.context == far)))
    out.append(show("(iii) batch interpolation: every batch 16 held out", hold_out(surface, lambda p: p.batch == 16)))
    knee = lambda p: p.context == 512 and p.batch in (4, 16)  # noqa: E731
    if len(hold_out(surface, knee)) == 10:
        out.append(show("(iv-a) batches 4 and 16 at context 512 held out, straight in batch (the rule before)",
                        hold_out(surface, knee, batch_power=1)))
        out.append(show(f"(iv-b) the same, T^p linear in batch^p, p = {BATCH_POWER:g} (rule 2)",
                        hold_out(surface, knee)))
        fitted = {(p.batch, p.rows, p.context): p for p in surface.monotone_points}
        out.append(show("(iv-c) the same predictions against the held-out lines' own isotonic fit (rule 1)",
                        [(fitted[(p.batch, p.rows, p.context)], pred, label)
                         for p, pred, label in hold_out(surface, knee)]))
        print(f"  no price non-decreasing in rows can be within {100 * knee_floor(surface, knee):.1f} % at worst "
              "of these raw medians (a slower-then-faster pair on one line)")
    ratios(surface)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*", type=Path, default=DEFAULT)
    for path in ap.parse_args().files:
        check(path)


if __name__ == "__main__":
    main()
