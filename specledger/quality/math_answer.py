"""Final-answer extraction and comparison for ASDiv-style word problems.

The final answer is the text after the last ``Answer:`` (also ``answer is``, ``\\boxed{...}``),
else the whole reply. References are normalised with
:func:`specledger.workloads.normalise_answer`: a number, a list of numbers, or text.

* number: the first number of the ``Answer:`` text (else the last number of the reply) equals
  the reference within a relative tolerance of 1e-4;
* list of k numbers: the first k numbers of the ``Answer:`` text (else the last k of the reply)
  match elementwise;
* text: equal after lowercasing, dropping periods, quotes and emphasis, a leading "the", and
  collapsing whitespace (``"3:30 P.M."`` == ``"3:30 pm"``). Without an ``Answer:`` line the last
  non-empty line is compared.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from specledger.workloads import normalise_answer

RELATIVE_TOLERANCE = 1e-4

_ANSWER = re.compile(r"\banswer\b\W{0,3}?(?:is\b|[:=])\s*(.+)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|(?<![\w.])-?\.\d+")


def final_answer_text(output: str) -> str | None:
    """The reply's stated final answer (last ``Answer:``/``answer is``, else last ``\\boxed{}``), or None."""
    matches = _ANSWER.findall(output)
    if matches:
        return matches[-1].strip()
    boxed = _BOXED.findall(output)
    if boxed:
        return boxed[-1].strip()
    return None


def parse_number(token: str) -> float:
    """A number token as float: ``"1,250" -> 1250.0``, ``"5/2" -> 2.5``, ``"-.5" -> -0.5``."""
    token = token.replace(",", "")
    if "/" in token:
        numerator, denominator = token.split("/")
        if int(denominator) == 0:
            return math.nan
        return float(Fraction(int(numerator), int(denominator)))
    return float(token)


def numbers_in(text: str) -> list[float]:
    """Every number in ``text`` in order (thousands separators and simple fractions understood)."""
    return [parse_number(token) for token in _NUMBER.findall(text)]


def numbers_close(value: float, reference: float) -> bool:
    return math.isclose(value, reference, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-9)


def normalise_text(text: str) -> str:
    """Lowercase, no periods/quotes/asterisks/trailing punctuation, no leading "the", single spaces."""
    text = text.lower().replace(".", "")
    text = re.sub(r"[\"'`*_]", "", text)
    text = re.sub(r"\s+", " ", text).strip(" ,;:!?")
    return re.sub(r"^the ", "", text)


def _last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def math_score(reference: object, output: str) -> float:
    """1.0 when the reply's final answer matches the reference (see module doc), else 0.0."""
    if isinstance(reference, str):
        reference = normalise_answer(reference)
    stated = final_answer_text(output)
    if isinstance(reference, bool) or not isinstance(reference, (int, float, list, str)):
        raise TypeError(f"unsupported math reference {reference!r}")
    if isinstance(reference, str):
        candidate = stated if stated is not None else _last_line(output)
        return float(normalise_text(candidate) == normalise_text(reference))
    expected = [float(value) for value in (reference if isinstance(reference, list) else [reference])]
    if stated is not None:
        found = numbers_in(stated)[: len(expected)]
    else:
        found = numbers_in(output)[-len(expected) :] if expected else []
    if len(found) != len(expected):
        return 0.0
    return float(all(numbers_close(value, target) for value, target in zip(found, expected)))
