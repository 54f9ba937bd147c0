"""Training the ``head`` drafter (``specledger train-head``): the prompts it reads (:mod:`.data`, the workloads'
TRAIN split only) and the self-distillation itself (:mod:`.train`). Its own package so that the engine, which runs
the head (:mod:`specledger.engine.drafters.head`), never imports the workloads."""
