"""Measure any OpenAI-compatible serving endpoint (vLLM, SGLang, ours) with the same ledger.

Modules: ``prometheus`` (metrics text -> spec-decode figures), ``sse`` (streaming parser),
``vllm_bench`` (``vllm bench serve`` JSON import), ``loadgen`` (async load generator),
``metrics`` (TTFT/TPOT/ITL summaries), ``cli`` (verbs ``probe`` and ``import-vllm-bench``).
Heavy or network pieces are imported from their modules, not here.
"""
