"""The engine: exact, instrumented speculative decoding on a real model (CPU).

- ``model.py``     native Llama-family decoder with a static, position-indexed KV cache
- ``loader.py``    GGUF / Hugging Face directory -> cached weights + tokenizer + config
- ``sampling.py``  SamplingParams and the logits -> probabilities transform shared by p and q
- ``verify.py``    greedy and rejection-sampling verification (the exactness lives here)
- ``drafters/``    one proposer per module behind one interface (``drafters/base.py``)
- ``request.py``   one request's round: gamma plan, proposal, verify, cut and commit, stops, records
- ``decode.py``    the solo loop: drives one request's rounds, timed per round
- ``batch.py``     continuous batching: packs many requests' rounds into one forward per step
Its records (round and request, the ledger's raw material) are :mod:`specledger.records`, a floor below;
their files are :mod:`specledger.rundir`'s.
"""
