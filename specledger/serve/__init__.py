"""``specledger serve``: the engine behind an OpenAI-compatible HTTP API with vLLM-named metrics."""
