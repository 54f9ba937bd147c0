"""The one measured cost surface of a target forward, T(rows per request, batch, context), and what is
built around it (import format, adapters). Pure numpy: nothing here imports torch."""

from specledger.cost.surface import CostSurface, Lookup, Source, SurfacePoint

__all__ = ["CostSurface", "Lookup", "Source", "SurfacePoint"]
