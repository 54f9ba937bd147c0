"""``specledger sweep``: the side experiments that produce traces beside a run's -- quantization x
speculation (``quantization.py``), γ policies (``policies.py``), serving under load and long contexts
(``serving.py``); ``experiment.py`` holds what they share. The main job (``specledger run``) is
:mod:`specledger.mainjob`; ``benchmarks/`` (outside the package) times the engine itself."""
