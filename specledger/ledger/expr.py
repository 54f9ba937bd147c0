"""Safe arithmetic cost expressions in the number of candidates ``k``.

``parse_cost_expression("10+0.7*k+0.1*k^2")`` returns a callable ``f(k) -> float``. The text is
parsed with :mod:`ast` and only this grammar is accepted: numbers, the name ``k``, binary
``+ - * / ** ^`` (``^`` means power), unary ``+``/``-`` and parentheses.
Anything else (names, calls, attributes, subscripts, comparisons...) is refused with a
:class:`SpecLedgerError` naming the offending piece. Nothing is ever ``eval``-ed, and all
arithmetic is in floats so a huge power overflows instead of hanging.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

from specledger.errors import SpecLedgerError

MAX_EXPRESSION_CHARS = 400
VARIABLE = "k"

_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[float], float]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_ALLOWED = "numbers, k, + - * / ^ (or **) and parentheses"

Evaluator = Callable[[float], float]


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name '{node.id}'"
    if isinstance(node, ast.Call):
        return "a function call"
    if isinstance(node, ast.Attribute):
        return "an attribute access"
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r}"
    if isinstance(node, ast.BinOp):
        return f"the operator {type(node.op).__name__}"
    if isinstance(node, ast.UnaryOp):
        return f"the unary operator {type(node.op).__name__}"
    return f"a {type(node).__name__} node"


def _compile(node: ast.AST, text: str) -> Evaluator:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecLedgerError(
                f"cost expression {text!r}: {_describe(node)} is not allowed; use {_ALLOWED}"
            )
        number = float(value)
        return lambda k: number
    if isinstance(node, ast.Name):
        if node.id != VARIABLE:
            raise SpecLedgerError(
                f"cost expression {text!r}: {_describe(node)} is not allowed; the only variable is k"
            )
        return lambda k: float(k)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        op = _BINARY[type(node.op)]
        left, right = _compile(node.left, text), _compile(node.right, text)
        return lambda k: op(left(k), right(k))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        unary = _UNARY[type(node.op)]
        operand = _compile(node.operand, text)
        return lambda k: unary(operand(k))
    raise SpecLedgerError(f"cost expression {text!r}: {_describe(node)} is not allowed; use {_ALLOWED}")


@dataclass(frozen=True)
class CostExpression:
    """A parsed expression f(k); ``self(k)`` evaluates it (finite float or SpecLedgerError)."""

    text: str
    _evaluate: Evaluator = field(repr=False, compare=False)

    def __call__(self, k: float) -> float:
        try:
            value = self._evaluate(float(k))
        except ZeroDivisionError:
            raise SpecLedgerError(f"cost expression {self.text!r} divides by zero at k={k}") from None
        except OverflowError:
            raise SpecLedgerError(f"cost expression {self.text!r} overflows at k={k}") from None
        if isinstance(value, complex) or not math.isfinite(value):
            raise SpecLedgerError(f"cost expression {self.text!r} is not a finite real number at k={k}")
        return float(value)


def parse_cost_expression(text: str) -> CostExpression:
    """Parse ``text`` (e.g. ``10+0.7*k+0.1*k^2``) into a :class:`CostExpression`; ``^`` means ``**``.

    Only numbers, ``k``, ``+ - * / ** ^``, unary minus/plus and parentheses are accepted.
    """
    if not isinstance(text, str) or not text.strip():
        raise SpecLedgerError("cost expression is empty; give e.g. '10+0.7*k+0.1*k^2'")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise SpecLedgerError(
            f"cost expression is longer than {MAX_EXPRESSION_CHARS} characters; simplify it"
        )
    source = text.strip().replace("^", "**")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError:
        raise SpecLedgerError(
            f"cost expression {text!r} is not valid arithmetic; use {_ALLOWED}, e.g. '10+0.7*k+0.1*k^2'"
        ) from None
    return CostExpression(text=text.strip(), _evaluate=_compile(tree.body, text.strip()))
