"""Sweeps that produce traces: the main job (``specledger run``) lives in :mod:`specledger.bench.runner`."""
