"""Replay: the rounds a greedy run at an unmeasured γ would record, from the plain output alone."""

from __future__ import annotations

import random

import pytest

from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter
from specledger.predict.replay import RecordedOutput, Replayer, replay_rounds, replay_setting


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Repetitive prompts (so the drafters find matches) over a 64-token vocabulary."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        motif = [rng.randrange(1, 60) for _ in range(rng.randrange(3, 8))]
        out.append((motif * 6)[: rng.randrange(12, 40)] + [rng.randrange(1, 60) for _ in range(5)])
    return out


def _key(rounds):
    return [(r.gamma, r.proposed, r.accepted, r.committed, r.truncated, r.context_len) for r in rounds]


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_replay_reproduces_every_round_of_a_real_run(target, drafter, gamma):
    """Same prompts in the same order, one drafter instance per setting (as `specledger run` does): the
    replayed rounds equal the recorded ones field by field, cross-request state (suffix) included."""
    engine = Engine(target, eos_token_ids=[0])
    prompts = _prompts(5, seed=gamma)
    real_drafter = make_drafter(drafter, None)
    recorded, real = [], {}
    for i, p in enumerate(prompts):
        plain = engine.generate(p, max_tokens=30)
        recorded.append(RecordedOutput(str(i), tuple(p), tuple(plain.token_ids), plain.stop_reason, 30))
        real[str(i)] = engine.generate(p, drafter=real_drafter, gamma=gamma, max_tokens=30)
        assert real[str(i)].token_ids == plain.token_ids
    replayed = replay_setting(recorded, make_drafter(drafter, None), gamma)
    assert sum(r.accepted for rs in replayed.values() for r in rs) > 0  # the check has matches to reproduce
    for pid, rec in real.items():
        assert _key(replayed[pid]) == _key(rec.rounds)


def test_replay_stops_at_eos_inside_an_accepted_span(target):
    out = (5, 6, 7, 5, 6, 7, 5, 6, 0)
    rec = RecordedOutput("p", (5, 6, 7, 5, 6, 7), out, "eos", 40)
    rounds = replay_rounds(rec, make_drafter("ngram", None), 4)
    assert sum(r.committed for r in rounds) == len(out) - 1  # the first token comes from the prefill
    assert rounds[-1].truncated or rounds[-1].committed <= rounds[-1].accepted + 1


def test_replayer_refuses_network_drafters_and_other_budgets():
    rep = Replayer([RecordedOutput("p", (1, 2, 3), (1, 2, 3, 1), "length", 4)])
    assert rep.can("ngram") and rep.can("suffix") and rep.can("ngram", 4)
    assert not rep.can("ngram", 8)  # tokens past the recorded output were never seen
    assert not rep.can("layerskip")  # its proposal needs the network: that is a run, not a forecast
