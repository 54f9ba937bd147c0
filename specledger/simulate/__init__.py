"""``specledger simulate``: serving at loads, contexts and scales this machine cannot reach.

A step-level discrete-event simulator of continuous-batching servers with speculation
(:mod:`.replica`, :mod:`.engine`), fed by measured acceptance chains (:mod:`.chains`), priced by a
cost model (measured here, calibrated elsewhere, or a labelled roofline, :mod:`specledger.cost.roofline`),
behind a router with a capacity planner (:mod:`.cluster`).
"""
