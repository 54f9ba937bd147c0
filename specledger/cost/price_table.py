"""The step prices a surface gives at a grid of points, and where each comes from (``specledger cost``)."""

from __future__ import annotations

from specledger.errors import SpecLedgerError


def int_list(text: str, flag: str, minimum: int) -> list[int]:
    """``1,4,16`` -> [1, 4, 16]; anything else (or a value below ``minimum``) is a one-line error."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecLedgerError(f"{flag} must be comma-separated integers, e.g. 1,4,16; got {text!r}") from None
    if not out or min(out) < minimum:
        raise SpecLedgerError(f"{flag} needs integers >= {minimum}, got {text!r}")
    return out


def price_table(surface, batches: list[int], rows: list[int], contexts: list[int]) -> list[dict]:  # noqa: ANN001
    """One ``{"batch", "rows", "context", "ms", "source", "rel_sd"}`` per point (rows = rows per request)."""
    out = []
    for c in contexts:
        for b in batches:
            for r in rows:
                look = surface.lookup(r, b, c)
                out.append({"batch": b, "rows": r, "context": c, "ms": look.seconds * 1e3, "source": look.source,
                            "rel_sd": look.rel_sd})
    return out
