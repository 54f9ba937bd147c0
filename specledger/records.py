"""Round and request records: the raw material of every figure specledger reports.

A *round* is one draft -> verify -> commit cycle. ``proposed`` candidates were verified,
``accepted`` (K) of them matched, and ``committed`` (L) tokens were emitted: normally
L = K + 1 (the bonus/correction token from the target). A *truncated* round was cut by a
stop condition (EOS, stop string, max_tokens) and may commit fewer; truncated rounds are
kept out of acceptance statistics but inside token and time totals.

Times are seconds (float, from ``time.perf_counter``), with one meaning in the solo engine and
in continuous batching (``engine/request.py`` runs the round for both):
  t_draft  -- the request's own drafting: choosing gamma and the drafter's ``propose``
  t_verify -- the target forward pass that verified its candidates; batched, the step's one
              packed forward over every request's rows (each request waits for all of it)
  t_other  -- the rest of the round, charged to this request: its own verification (sampling,
              acceptance), the cut at EOS / max_tokens, the drafter's commit and the release
              (detokenisation, stop strings); batched, plus an equal share (1/B of the step's B
              rounds) of the step's time that is neither the forward nor any request's own
              drafting or bookkeeping (packing the forward, budgets, preemption)
So a solo round's t_draft + t_verify + t_other is its wall time, and a batched step's wall time
(first draft to last release) is t_verify + the sum over its rounds of (t_draft + t_other).
In no round: the prefill (``RequestRecord.t_prefill``), admission and recompute after a
preemption (``extra["recompute_s"]``), and the stream consumer's time between events.
A plain-decoding step is a round with proposed = 0, accepted = 0, committed = 1.

Files are JSONL: one :class:`RequestRecord` per line (its rounds nested), appended and
flushed per request, so an interrupted run loses nothing; :mod:`specledger.rundir` reads and
writes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

#: ``RequestRecord.extra`` key naming the side experiment (``specledger sweep``) or the load points
#: (``specledger run --loads``) a record belongs to; the main analysis leaves such records out
EXPERIMENT_KEY = "experiment"
#: the ``EXPERIMENT_KEY`` value of the load points (``specledger run --loads``)
LOAD_EXPERIMENT = "load"


#: a γ as every front end gives it: a static γ (an int >= 0) or the name of the policy that picks it per round
#: (``heuristic``, ``ema``, ``batch``, ``goodput``); the engine turns it into a policy (engine/policy.as_policy)
GammaSpec = int | str


@dataclass(slots=True)
class RoundRecord:
    """One round of one request; times as in the module docstring, t_round = their sum."""

    drafter: str
    gamma: int  # candidates asked for this round
    proposed: int  # candidates the drafter actually proposed (<= gamma) and the target verified
    accepted: int  # K: accepted prefix length, 0..proposed
    committed: int  # L: tokens emitted this round (K + 1 unless truncated)
    truncated: bool
    t_draft: float
    t_verify: float
    t_other: float
    context_len: int  # tokens in the context when the round started (prompt + committed)
    batch_size: int = 1  # requests that drafted in the step (1 solo)
    #: tree rounds only (absent from chain rounds' JSON): the node budget asked for, the verified
    #: tree's parents (node i's parent, -1 the root; DFS preorder, see engine/tree.py; ``proposed``
    #: = its node count) and the accepted path (node indices; ``accepted`` = its length)
    tree_budget: int = 0
    tree_parents: list[int] | None = None
    tree_path: list[int] | None = None

    @property
    def t_round(self) -> float:
        return self.t_draft + self.t_verify + self.t_other


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    drafter: str
    gamma: GammaSpec  # static gamma, or the name of the policy that chose it per round
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    prompt_tokens: int
    output_tokens: int
    text: str
    token_ids: list[int]
    stop_reason: str  # "eos" | "stop" | "length"
    t_prefill: float  # target prefill (and drafter begin) before the first round
    ttft: float  # seconds from request start to the first emitted token
    total_time: float  # seconds from request start to the last emitted token
    token_times: list[float]  # emission time of every output token, seconds since request start
    chunks: list[int]  # sizes of the groups of tokens that left together, in order
    rounds: list[RoundRecord] = field(default_factory=list)
    category: str = ""
    prompt_id: str = ""
    model: str = ""
    dtype: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    tree_budget: int = 0  # nodes per round asked for (0: chains); absent from chain records' JSON

    def to_json(self) -> str:
        d = asdict(self)
        if not self.tree_budget:
            del d["tree_budget"]
        for r in d["rounds"]:
            if r["tree_parents"] is None:
                del r["tree_budget"], r["tree_parents"], r["tree_path"]
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        """A record from its JSON object, every field's type checked (:func:`checked_fields`): a field of
        the wrong type (``"extra": []``, ``"token_times": ["a"]``) raises :class:`RecordError` naming it,
        before anything reads it. Unknown keys are ignored (records of newer versions load)."""
        kwargs = checked_fields(d, cls, _REQUEST_KINDS, "record")
        kwargs["rounds"] = [RoundRecord(**checked_fields(r, RoundRecord, _ROUND_KINDS, f"rounds[{i}]"))
                            for i, r in enumerate(kwargs.get("rounds", []))]
        return cls(**kwargs)


class RecordError(ValueError):
    """A trace record whose JSON does not have the record's shape; the message names the field."""


def _numbers(v: Any) -> bool:
    return isinstance(v, list) and set(map(type, v)) <= {int, float}


def _ints(v: Any) -> bool:
    return isinstance(v, list) and set(map(type, v)) <= {int}


#: what each JSON type of a field may be (JSON has no tuple; bool is not a number here)
_KINDS: dict[str, tuple[str, Any]] = {
    "str": ("a string", lambda v: isinstance(v, str)),
    "int": ("an integer", lambda v: type(v) is int),
    "number": ("a number", lambda v: type(v) in (int, float)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "int?": ("an integer or null", lambda v: v is None or type(v) is int),
    "int|str": ("an integer or a string", lambda v: type(v) is int or isinstance(v, str)),
    "dict": ("an object", lambda v: isinstance(v, dict)),
    "list[dict]": ("a list of objects", lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v)),
    "list[int]": ("a list of integers", _ints),
    "list[int]?": ("a list of integers or null", lambda v: v is None or _ints(v)),
    "list[number]": ("a list of numbers", _numbers),
}
_REQUEST_KINDS = {
    "request_id": "str", "drafter": "str", "gamma": "int|str", "temperature": "number", "top_p": "number",
    "top_k": "int", "seed": "int?", "prompt_tokens": "int", "output_tokens": "int", "text": "str",
    "token_ids": "list[int]", "stop_reason": "str", "t_prefill": "number", "ttft": "number",
    "total_time": "number", "token_times": "list[number]", "chunks": "list[int]", "rounds": "list[dict]",
    "category": "str", "prompt_id": "str", "model": "str", "dtype": "str", "extra": "dict", "tree_budget": "int",
}
_ROUND_KINDS = {
    "drafter": "str", "gamma": "int", "proposed": "int", "accepted": "int", "committed": "int", "truncated": "bool",
    "t_draft": "number", "t_verify": "number", "t_other": "number", "context_len": "int", "batch_size": "int",
    "tree_budget": "int", "tree_parents": "list[int]?", "tree_path": "list[int]?",
}


def checked_fields(d: Any, cls: type, kinds: dict[str, str], where: str) -> dict[str, Any]:
    """The keys of ``d`` that are fields of ``cls``, each value of its field's kind; :class:`RecordError`
    names the first that is not, or the first required field (no default) that is missing."""
    if not isinstance(d, dict):
        raise RecordError(f"{where} must be a JSON object, got {type(d).__name__}")
    missing = [f.name for f in fields(cls)
               if f.default is MISSING and f.default_factory is MISSING and f.name not in d]
    if missing:
        raise RecordError(f"{where} lacks field(s) {', '.join(map(repr, missing[:4]))}")
    out: dict[str, Any] = {}
    for name, kind in kinds.items():
        if name not in d:
            continue
        what, ok = _KINDS[kind]
        if not ok(d[name]):
            raise RecordError(f"{where} field {name!r} must be {what}, got {type(d[name]).__name__}")
        out[name] = d[name]
    return out


def main_records(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The records of the main job: side-experiment records (``extra["experiment"]`` set, e.g. the
    four-way's int8 target or a second plain baseline of the same prompt) would pair wrongly with
    the main baselines, so they are analysed only by their own experiment (its JSON file); the load
    points too (:func:`load_records`)."""
    return [r for r in records if not r.extra.get(EXPERIMENT_KEY)]


def load_records(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The records of the load points (``extra.experiment == "load"``)."""
    return [r for r in records if r.extra.get(EXPERIMENT_KEY) == LOAD_EXPERIMENT]


#: the drafter name plain decoding's records carry (no drafter); the one spelling below :mod:`specledger.engine`,
#: whose drafter catalog (:data:`specledger.engine.drafters.catalog.PLAIN`) names it so
PLAIN_DRAFTER = "none"


def setting_label(drafter: str, gamma: GammaSpec, tree_budget: int = 0) -> str:
    """A setting's label: ``plain`` (drafter ``none`` or γ 0), ``ngram γ=4``, ``ngram γ=4 tree=16``."""
    if drafter == PLAIN_DRAFTER or gamma == 0:
        return "plain"
    return f"{drafter} γ={gamma}" + (f" tree={tree_budget}" if tree_budget else "")
