"""Measure any OpenAI-compatible serving endpoint (vLLM, SGLang, ours) with the same ledger.

Modules: ``prometheus`` (metrics text -> samples), ``spec_figures`` (-> spec-decode figures; their acceptance
ledger is :mod:`specledger.ledger.server_acceptance`), ``histograms`` (latency histograms, counter rates),
``sse`` (streaming parser), ``vllm_bench`` (``vllm bench serve`` JSON import), ``loadgen`` (async load
generator), ``metrics`` (TTFT/TPOT/ITL summaries), ``workload`` (what is sent), ``endpoint`` (measure one
endpoint, or it and a baseline), ``fetch`` (the one bounded reader
of server answers: total timeout, size bound; credentials kept out of files), ``safe_text`` (the one escape
of server- and file-supplied text for the terminal), ``records`` (results as
run records), ``outputs`` (the run directory), ``tables`` (the rows the commands print), ``options`` (probe's
options checked), ``imports`` (benchmark files as import documents), ``launch`` and its pieces (``probe
--launch``). The verbs are :mod:`specledger.cli.probe`; nothing here imports the report.
Heavy or network pieces are imported from their modules, not here.
"""
