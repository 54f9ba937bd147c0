"""The engine: exact, instrumented speculative decoding on a real model (CPU).

- ``model.py``     native Llama-family decoder with a static, position-indexed KV cache
- ``loader.py``    GGUF / Hugging Face directory -> cached weights + tokenizer + config
- ``sampling.py``  SamplingParams and the logits -> probabilities transform shared by p and q
- ``verify.py``    greedy and rejection-sampling verification (the exactness lives here)
- ``drafters/``    one proposer per module behind one interface (``drafters/base.py``)
- ``decode.py``    the decode loop: draft -> verify -> commit -> stop checks, timed per round
- ``trace.py``     round and request records (the ledger's raw material), JSONL I/O
"""
