"""HumanEval pass@1: turn a reply into a program, run the problem's tests on it.

Code extraction: fenced blocks tagged ``python``/``py``/``python3`` or untagged are
candidates; among those defining ``def <entry_point>(`` the longest wins (the last on ties);
without such a block, the longest candidate block; without fences, the raw reply (trimmed to
its longest parseable tail-trimmed span from the first code-looking line when the whole reply
is not valid Python). An unclosed fence (reply cut off by the token limit) runs to the end.

Programs:

* ``complete`` ("code"): if the code defines the entry point, ``prompt + code`` (the prompt
  is valid Python on its own, so its imports and helper functions stay available and the
  model's definition overrides its stub); otherwise the reply is a body-only completion:
  ``prompt + code`` (re-indented by four spaces when that does not parse otherwise).
* ``full`` ("code-edit"): the extracted code alone; the original is never prepended (it
  would pass the tests by itself). No ``def <entry_point>`` means no program: score 0.

Then ``test`` and ``check(<entry_point>)`` are appended, and the program is run in
:mod:`specledger.quality.sandbox`; pass@1 is 1.0 when it passes, else 0.0.
"""

from __future__ import annotations

import re
import textwrap

from .sandbox import ExecutionResult, run_python

_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = frozenset({"", "python", "py", "python3"})
_CODE_START = re.compile(r"^(?:def |class |from |import |@|async def )")


def defines(code: str, entry_point: str) -> bool:
    """Whether ``code`` contains ``def <entry_point>(`` at any indentation."""
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


def parses(code: str) -> bool:
    """Whether ``code`` compiles (``compile`` also rejects ``return`` outside a function)."""
    try:
        compile(code, "<candidate>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def fenced_blocks(text: str) -> list[str]:
    """Contents of Python (or untagged) fenced code blocks, in order."""
    return [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]


def _longest_parseable_span(text: str) -> str:
    lines = text.splitlines()
    start = next((index for index, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return text
    for end in range(len(lines), start, -1):
        candidate = "\n".join(lines[start:end])
        if parses(candidate):
            return candidate
    return text


def extract_code(output: str, entry_point: str) -> str:
    """The code of a reply (see the module doc for the preference order)."""
    blocks = fenced_blocks(output)
    if blocks:
        defining = [block for block in blocks if defines(block, entry_point)]
        pool = defining or blocks
        return max(reversed(pool), key=len) if pool else output
    if parses(output):
        return output
    return _longest_parseable_span(output)


def completion_program(prompt: str, code: str, entry_point: str) -> str:
    """The program for a "complete" item, before tests (see the module doc)."""
    if defines(code, entry_point):
        return prompt.rstrip() + "\n\n\n" + code
    joined = prompt + code
    if parses(joined) or not code.strip():
        return joined
    indented = prompt + textwrap.indent(textwrap.dedent(code), "    ")
    return indented if parses(indented) else joined


def candidate_program(reference: dict, output: str) -> str | None:
    """The model's program for a HumanEval reference, or None when the reply holds no usable code."""
    entry_point = reference["entry_point"]
    code = extract_code(output, entry_point)
    if reference.get("mode", "complete") == "full":
        return code if defines(code, entry_point) else None
    return completion_program(reference["prompt"], code, entry_point)


def test_program(program: str, test: str, entry_point: str) -> str:
    """``program``, the problem's ``check`` function, and the call that runs it."""
    return f"{program.rstrip()}\n\n\n{test.rstrip()}\n\n\ncheck({entry_point})\n"


def run_tests(reference: dict, output: str, timeout_s: float = 5.0) -> ExecutionResult | None:
    """Run the problem's tests on the reply's code; None when there is no program to run."""
    program = candidate_program(reference, output)
    if program is None:
        return None
    return run_python(test_program(program, reference["test"], reference["entry_point"]), timeout_s)


def pass_at_1(reference: dict, output: str, timeout_s: float = 5.0) -> float:
    """1.0 when ``check(entry_point)`` passes on the reply's code within ``timeout_s``, else 0.0."""
    result = run_tests(reference, output, timeout_s)
    return 1.0 if result is not None and result.passed else 0.0
