"""The main job (``specledger run``): plain decoding and every drafter over real workloads, across γ
and temperature, one request at a time (``job.py``), then each setting at every load > 1 under
continuous batching (``loads.py``); ``cli.py`` is the verb. It writes a run directory
(:class:`specledger.rundir.RunDir`) that ``specledger report`` summarises."""
