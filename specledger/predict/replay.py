"""Exact acceptance at any γ for deterministic drafters under greedy decoding: replay the drafter.

Under greedy decoding the output is the target's argmax chain, whatever the drafter and γ (the
engine is exact, and every run checks it). A model-free drafter (n-gram, suffix) proposes a
deterministic function of the context and of what it has seen. So the rounds that a run at an
unmeasured γ *would* have had are not a statistical guess: they follow from the recorded output,
the prompt and the drafter's own code. :func:`replay_rounds` drives the engine's
:class:`~specledger.engine.request.Request` (the same ``plan`` clamp, ``propose``, greedy verification,
EOS / max_tokens cut and ``commit`` as a real run) with an *oracle target* whose logit row i is
one-hot at the recorded token that follows ``context + candidates[:i]`` -- exactly what the real
target's argmax is while the candidates match, and irrelevant after the first mismatch.

Cross-request state (the suffix drafter's global trie) is reproduced by replaying a setting's
prompts in the run's order through one drafter instance (:func:`replay_setting`), as the run
gives each (drafter, γ, temperature) setting one instance.

What replay cannot do (and the caller falls back to the acceptance chains for): sampled
decoding (the output depends on the rejection sampler's draws), drafters that run a network (their
proposal needs the network: that is a run, not a forecast), outputs cut by a stop string, and a
max_tokens beyond the recorded output of a request that stopped by length (tokens never seen).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specledger.engine.drafters.catalog import PLAIN
from specledger.records import RequestRecord, RoundRecord

if TYPE_CHECKING:
    import torch

    from specledger.engine.drafters.base import Drafter


@dataclass(frozen=True)
class RecordedOutput:
    """One prompt's greedy output as a run recorded it (the first token comes from the prefill)."""

    prompt_id: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    stop_reason: str  # "eos" | "length"
    max_tokens: int


def replayable(drafter: Drafter, temperature: float) -> bool:
    """Replay is exact for a drafter that runs no network, under greedy decoding."""
    return not drafter.uses_model and temperature <= 0.0


def _oracle_rows(output: Sequence[int], start: int, n_rows: int, vocab: int) -> torch.Tensor:
    """Logit rows one-hot at output[start], output[start + 1], ... (the target's argmax chain)."""
    import torch

    rows = torch.zeros(n_rows, vocab)
    for i in range(n_rows):
        j = min(start + i, len(output) - 1)  # past the end nothing is compared (the plan clamps g)
        rows[i, output[j]] = 1.0
    return rows


def replay_rounds(rec: RecordedOutput, drafter: Drafter, gamma: int) -> list[RoundRecord]:
    """The rounds of ``rec`` decoded by ``drafter`` at static ``gamma`` (times 0): proposed, K, L,
    truncation and context of every round, exactly as a greedy run would record them. ``drafter``
    ends the request (its cross-request state learns the output, as in a run). Needs the engine (torch)."""
    from specledger.engine.policy import StaticGamma
    from specledger.engine.request import Request, StopReleaser
    from specledger.engine.sampling import SamplingParams

    out = list(rec.output)
    eos = frozenset({out[-1]}) if rec.stop_reason == "eos" and out else frozenset()
    max_tokens = rec.max_tokens if rec.stop_reason == "eos" else min(rec.max_tokens, len(out))
    vocab = max(out) + 1
    req = Request(list(rec.prompt), drafter, StaticGamma(gamma), SamplingParams(), max_tokens, eos,
                  StopReleaser(None), 0.0)
    req.start(_oracle_rows(out, 0, 1, vocab)[0])
    capacity = len(rec.prompt) + max_tokens + 1
    while not req.stop_reason:
        g = req.plan(1, capacity)
        cand, q = req.propose(g)
        rows = _oracle_rows(out, len(req.out), len(cand) + 1, vocab)
        req.accept(rows, cand, q, g, 0.0, 0.0)
    drafter.end(list(rec.prompt), req.out)
    if req.out != out:  # a broken replay would silently mislead every forecast built on it
        raise AssertionError(f"replay of {rec.prompt_id} diverged from the recorded output")
    return req.rounds


def replay_setting(recs: Sequence[RecordedOutput], drafter: Drafter, gamma: int) -> dict[str, list[RoundRecord]]:
    """{prompt_id: rounds} for every recorded output, in order, through one drafter instance."""
    return {r.prompt_id: replay_rounds(r, drafter, gamma) for r in recs}


REPLAY_ASSUMPTION = ("rounds replayed exactly: the drafter's own code run over each prompt's recorded greedy output "
                     "(no acceptance model)")


class Replayer:
    """Replayed rounds of a run's prompts at any γ, for the drafters replay is exact for (memoised)."""

    def __init__(self, outputs: Sequence[RecordedOutput]) -> None:
        self.outputs = list(outputs)
        self._by_id = {o.prompt_id: o for o in self.outputs}
        self._memo: dict[tuple[str, int], dict[str, list[RoundRecord]]] = {}
        self._ok: dict[str, bool] = {}

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord], prompts: dict[str, Sequence[int]],
                     max_tokens: int | None) -> Replayer | None:
        """From a run's greedy plain records (in the run's order) and its prompts' token ids; None when the
        run kept no token ids (runs before they were saved) or has no greedy plain record."""
        outs: dict[str, RecordedOutput] = {}
        for r in records:
            pid = r.prompt_id or r.request_id
            if (r.drafter != PLAIN.name or r.temperature > 0 or pid in outs or pid not in prompts
                    or r.stop_reason not in ("eos", "length") or not r.token_ids):
                continue
            own = r.extra.get("max_tokens")  # a per-category budget, when the run recorded one
            m = own if isinstance(own, int) else max_tokens if max_tokens is not None else r.output_tokens
            outs[pid] = RecordedOutput(pid, tuple(int(t) for t in prompts[pid]), tuple(r.token_ids), r.stop_reason, m)
        return cls(list(outs.values())) if outs else None

    def can(self, drafter: str, max_tokens: int | None = None) -> bool:
        """Replay is exact here: a drafter that runs no network, and every output's own max_tokens (``max_tokens``
        None: each request keeps its own budget)."""
        if max_tokens is not None and any(o.max_tokens != max_tokens for o in self.outputs):
            return False
        if drafter not in self._ok:
            from specledger.engine.drafters.registry import make_drafter

            try:
                self._ok[drafter] = replayable(make_drafter(drafter, None), 0.0)
            except Exception:  # noqa: BLE001 - a drafter that needs an engine runs a network: not replayable
                self._ok[drafter] = False
        return self._ok[drafter]

    def rounds(self, drafter: str, gamma: int) -> dict[str, list[RoundRecord]]:
        """{prompt_id: rounds} of ``drafter`` at ``gamma`` over every recorded prompt, in the run's order."""
        key = (drafter, gamma)
        if key not in self._memo:
            from specledger.engine.drafters.registry import make_drafter

            self._memo[key] = replay_setting(self.outputs, make_drafter(drafter, None), gamma)
        return self._memo[key]

    def output_tokens(self, prompt_id: str) -> int:
        return len(self._by_id[prompt_id].output)


def run_forecast_inputs(records: Sequence[RequestRecord], meta: dict[str, Any] | None) -> tuple[Any, Replayer | None]:
    """(measured cost surface or None, replayer or None) of a run from its ``run.json`` (``meta``): the
    surface measured at its start and its prompts' token ids (runs before either was saved get None; so does the
    replayer where the engine is not installed)."""
    from specledger.cost.surface import CostSurface
    from specledger.rundir import SURFACE_KEY

    meta = meta or {}
    surface = CostSurface.from_dict(meta[SURFACE_KEY]) if meta.get(SURFACE_KEY) else None
    prompts = {pid: p["token_ids"] for pid, p in (meta.get("prompts") or {}).items()
               if isinstance(p, dict) and p.get("token_ids")}
    max_tokens = (meta.get("config") or {}).get("max_tokens")
    replayer = Replayer.from_records(records, prompts, max_tokens if isinstance(max_tokens, int) else None) \
        if prompts and engine_available() else None
    return surface, replayer


def engine_available() -> bool:
    """Whether the local engine (torch) imports here: replay runs the engine's own round code; without it (a
    ``pip install specledger`` without the ``engine`` extra) forecasts use the acceptance chains instead."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
