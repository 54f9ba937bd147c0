"""The engine: exact, instrumented speculative decoding on a real model (CPU).

- ``model.py``     native Llama-family decoder (the forward passes: decode, packed, tree) over
  ``model_config.py`` (ModelConfig, the static position-indexed KVCache) and ``layers.py`` (RoPE,
  RMSNorm, the prepacked row-invariant Linear)
- ``build.py``     ``build_engine``: the engine of a target by name (the verbs' one constructor)
- ``loader.py``    GGUF / Hugging Face directory -> cached weights + tokenizer + config
- ``sampling.py``  SamplingParams and the logits -> probabilities transform shared by p and q
- ``verify.py``    greedy and rejection-sampling verification (the exactness lives here)
- ``drafters/``    one proposer per module behind one interface (``drafters/base.py``)
- ``request.py``   one request's round: gamma plan, proposal, verify, cut and commit, stops, records
- ``decode.py``    the solo loop: drives one request's rounds, timed per round
- ``batch.py``     continuous batching: packs many requests' rounds into one forward per step;
  what it takes and gives (requests, events, step records): ``batch_types.py``
Its records (round and request, the ledger's raw material) are :mod:`specledger.records`, a floor below;
their files are :mod:`specledger.rundir`'s.
"""
