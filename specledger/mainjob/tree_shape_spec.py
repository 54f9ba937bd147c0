"""``--tree-shape``: which tree a drafter proposes in a tree round (``generate``, ``run``).

    dynamic            EAGLE-2's best-first tree, a new shape every round (the default)
    dp                 the DP's static shape under the assumed acceptance by rank
                       (:data:`specledger.engine.tree_shape.DEFAULT_RANK_ACCEPTANCE`, every depth)
    dp:0.6,0.2,0.1     the DP's static shape under this acceptance by rank (every depth)
    dp:RUN_DIR         the DP's static shape under the acceptance by depth and rank measured on that run's
                       trees and chains of the same drafter (:func:`specledger.ledger.trees.count_depth_rank`)
"""

from __future__ import annotations

from pathlib import Path

from specledger.engine.tree_shape import StaticTreeShape, rows_from_spec
from specledger.errors import SpecLedgerError, require

EXAMPLE = "dynamic, dp, dp:0.6,0.2,0.1 or dp:RUN_DIR"


def check_tree_shape(spec: str) -> None:
    """A one-line error unless ``spec`` is one of the module's forms (the run directory is read later)."""
    require(spec == "dynamic" or spec == "dp" or spec.startswith("dp:"),
            f"--tree-shape must be {EXAMPLE}; got {spec!r}")
    if spec.startswith("dp:"):
        rest = spec[3:]
        require(bool(rest), f"--tree-shape dp: needs acceptance by rank or a run directory ({EXAMPLE})")
        if not Path(rest).exists():
            _vector(rest)


def _vector(text: str) -> list[list[float]]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecLedgerError(f"--tree-shape dp:{text} is neither a run directory nor acceptance by rank "
                              "(e.g. dp:0.6,0.2,0.1)") from None
    return rows_from_spec(values)


def tree_shape_from_spec(spec: str, drafter: str) -> StaticTreeShape | None:
    """The static shape ``spec`` asks for (None: dynamic), for ``drafter``'s rounds."""
    check_tree_shape(spec)
    if spec == "dynamic":
        return None
    if spec == "dp":
        return StaticTreeShape.default()
    rest = spec[3:]
    if not Path(rest).exists():
        return StaticTreeShape(_vector(rest), f"acceptance by rank {rest} (given) at every depth")
    return measured_tree_shape(Path(rest), drafter)


def measured_tree_shape(run_dir: Path, drafter: str) -> StaticTreeShape:
    """p_{d,i} counted over ``run_dir``'s solo main-job trees and chains of ``drafter``."""
    from specledger.ledger.trees import count_depth_rank
    from specledger.predict.tree_forecast import MIN_TRIES, solo_main, verified_trees
    from specledger.rundir import TRACE_NAME, read_records

    trace = run_dir / TRACE_NAME
    require(trace.is_file(), f"--tree-shape dp:{run_dir}: no {TRACE_NAME} there; give a run directory")
    rounds = [rd for r in solo_main(read_records(trace)) if r.drafter == drafter for rd in r.rounds]
    counts = count_depth_rank(verified_trees(rounds))
    require(counts.rounds > 0, f"--tree-shape dp:{run_dir}: the run has no full proposing rounds of drafter "
            f"{drafter!r} to measure acceptance by depth and rank on")
    rows, pooled = counts.rows(MIN_TRIES)
    return StaticTreeShape(rows, f"acceptance by depth×rank measured on {counts.rounds} trees/chains of {drafter} "
                                 f"in {run_dir} ({pooled} sparse cells at the rank's pooled value)")
