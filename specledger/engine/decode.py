"""The decode loop: prefill, then rounds of draft -> verify -> commit, every round timed.

Cache invariant: the target's static KV cache holds valid entries for positions
[0, len(context) - 1). The last committed token has no KV yet: each round feeds it
together with the candidates, ``[context[-1], x_1 .. x_n]`` at start_pos len(context) - 1,
in one forward pass, which yields the n + 1 distributions verification needs. Rejected
candidates' KV entries are simply overwritten later: rollback is not moving the start
position forward, nothing is copied (gpt-fast's position-indexed cache).

Stops (EOS, stop strings across token boundaries, max_tokens) are applied to the committed
span of each round; anything after the stop is dropped before it is emitted, and the round
is marked truncated if tokens were dropped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specledger.engine.drafters.base import Drafter, NoDrafter
from specledger.engine.policy import GammaPolicy, as_policy
from specledger.engine.sampling import SamplingParams, probs_from_logits
from specledger.engine.trace import RequestRecord, RoundRecord
from specledger.engine.verify import verify_greedy, verify_sampling
from specledger.errors import SpecLedgerError, require


@dataclass(slots=True)
class Emitted:
    """Tokens that left the engine together (one chunk) and the text they released."""

    token_ids: list[int]
    text: str
    t: float  # seconds since the request started


def _first_stop(text: str, stops: Sequence[str], start: int) -> int:
    """Index of the earliest occurrence of any stop string in ``text`` at or after ``start``; -1 if none."""
    best = -1
    for s in stops:
        j = text.find(s, start)
        if j != -1 and (best == -1 or j < best):
            best = j
    return best


def _cut_at_stop(new: list[int], n_out: int, max_tokens: int, eos: frozenset[int]) -> tuple[list[int], str]:
    """Cut a round's committed tokens at the first EOS (kept) and at max_tokens; return (kept, stop reason or "")."""
    reason = ""
    for i, t in enumerate(new):
        if t in eos:
            new, reason = new[: i + 1], "eos"
            break
    room = max_tokens - n_out
    if len(new) > room:  # an EOS inside the room would already have cut `new`
        new, reason = new[:room], "length"
    elif len(new) == room and not reason:
        reason = "length"
    return new, reason


class StopReleaser:
    """Which committed tokens of one request may leave the engine, and the text they release.

    Call :meth:`advance` after every commit with the request's whole output so far. Without stop
    strings everything committed is released at once. With stop strings, text that could still
    begin a stop string (the last ``longest stop - 1`` characters) is held back, and so are the
    tokens that produced it; once a stop string appears, the output is cut before it (those
    tokens are dropped from ``out`` in place) and everything before it is released: nothing
    after a stop is ever emitted. ``text`` is the request's output text so far (the final text
    once the request ends); empty without a tokenizer.
    """

    def __init__(self, decode: Callable[[list[int]], str] | None, stops: Sequence[str] = ()) -> None:
        self.stops = [s for s in stops if s]
        require(not self.stops or decode is not None, "stop strings need a tokenizer")
        self.decode = decode
        self.hold = max((len(s) for s in self.stops), default=1) - 1  # chars held back while a stop could start
        self.text = ""
        self.text_sent = 0  # characters of ``text`` released so far
        self.tok_sent = 0  # tokens of the output released so far

    def advance(self, out: list[int], stop_reason: str) -> tuple[list[int], str, int, str]:
        """Release what may leave now: (released tokens, released text, tokens dropped from the end
        of ``out`` by a stop string, the stop reason -- ``"stop"`` if a stop string was found)."""
        decode, stops, hold = self.decode, self.stops, self.hold
        release_to, release_chars, dropped = len(out), 0, 0
        text = self.text
        if stops:
            text = decode(out)
            j = _first_stop(text, stops, max(0, self.text_sent - hold))
            if j != -1:
                keep = self.tok_sent
                while keep < len(out) and len(decode(out[:keep])) < j:
                    keep += 1
                dropped = len(out) - keep
                del out[keep:]
                text, stop_reason = text[:j], "stop"
            elif not stop_reason:
                release_to = self.tok_sent
                while release_to < len(out) and len(decode(out[: release_to + 1])) <= len(text) - hold:
                    release_to += 1
            release_to = len(out) if stop_reason else release_to
            release_chars = len(text) if stop_reason else len(decode(out[:release_to]))
        elif decode is not None:
            text = decode(out)
            release_chars = len(text)
        self.text = text
        if release_to <= self.tok_sent:
            return [], "", dropped, stop_reason
        released = out[self.tok_sent : release_to]
        delta = text[self.text_sent : release_chars] if decode is not None else ""
        self.text_sent = max(self.text_sent, release_chars)
        self.tok_sent = release_to
        return released, delta, dropped, stop_reason


class Engine:
    """One target model, its tokenizer and a reusable static KV cache; decodes one request at a time."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        eos_token_ids: Sequence[int] = (),
        max_context: int | None = None,
        name: str = "",
        dtype: str = "",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.max_context = int(max_context or model.config.max_seq_len)
        self.name = name
        self.dtype = dtype
        self._cache = None
        self.loaded: Any = None  # the LoadedModel (tokenizer, chat template) when built from one

    @classmethod
    def from_loaded(cls, lm: Any) -> Engine:
        engine = cls(lm.model, lm.tokenizer, lm.eos_token_ids, lm.max_context, lm.name,
                     str(lm.dtype).replace("torch.", ""))
        engine.loaded = lm
        return engine

    # -- helpers -------------------------------------------------------------------------
    def cache_for(self, needed: int):
        """The engine's target KV cache, grown (never shrunk) to hold ``needed`` positions."""
        if self._cache is None or self._cache.capacity < needed:
            cap = min(self.max_context, max(needed, 256))
            cap = min(self.max_context, 1 << (cap - 1).bit_length()) if cap < self.max_context else cap
            self._cache = self.model.new_cache(max(cap, needed))
        return self._cache

    def decode_text(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def check_prompt(self, prompt_ids: Sequence[int], max_tokens: int) -> None:
        require(len(prompt_ids) > 0, "the prompt is empty; give at least one token")
        require(max_tokens >= 1, f"max_tokens must be >= 1, got {max_tokens}")
        total = len(prompt_ids) + max_tokens
        if total > self.max_context:
            raise SpecLedgerError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's context "
                f"({self.max_context}); shorten the prompt or lower --max-tokens"
            )

    # -- the loop ------------------------------------------------------------------------
    @torch.inference_mode()
    def stream(
        self,
        prompt_ids: Sequence[int],
        drafter: Drafter | None = None,
        gamma: int | GammaPolicy = 0,
        params: SamplingParams = SamplingParams(),
        max_tokens: int = 128,
        stop: Sequence[str] = (),
        request_id: str | None = None,
        ignore_eos: bool = False,
    ) -> Iterator[Emitted | RoundRecord | RequestRecord]:
        """Decode one request, yielding ``Emitted`` chunks and ``RoundRecord`` s as they happen,
        then the final ``RequestRecord`` (which also holds every round)."""
        prompt = [int(t) for t in prompt_ids]
        self.check_prompt(prompt, max_tokens)
        drafter = drafter or NoDrafter()
        policy = as_policy(gamma)
        policy.reset()
        releaser = StopReleaser(self.decode_text if self.tokenizer is not None else None, stop)
        eos = frozenset() if ignore_eos else self.eos_token_ids
        rng = torch.Generator().manual_seed(params.seed if params.seed is not None else 0)
        model = self.model
        perf = time.perf_counter

        t_start = perf()
        cache = self.cache_for(len(prompt) + max_tokens + 1)
        capacity = cache.capacity
        logits = model(torch.tensor([prompt]), 0, cache, last_only=True)[0, -1]
        first = int(logits.argmax()) if params.greedy else int(
            torch.multinomial(probs_from_logits(logits, params), 1, generator=rng)
        )
        drafter.begin(prompt, params)
        t_prefill = perf() - t_start

        rounds: list[RoundRecord] = []
        token_times: list[float] = []
        chunks: list[int] = []
        stop_reason = ""

        kept, stop_reason = _cut_at_stop([first], 0, max_tokens, eos)
        out = list(kept)
        context = prompt + out
        while True:
            # ---- emit what the last step committed (shared by prefill and rounds) ----------
            t_emit = perf()
            released, delta, dropped, stop_reason = releaser.advance(out, stop_reason)
            if rounds and dropped:
                rounds[-1].truncated = True
                rounds[-1].committed -= dropped
            t_now = perf()
            now = t_now - t_start
            if rounds:  # detokenisation and stop checks are part of the round's other cost
                rounds[-1].t_other += t_now - t_emit
            if released:
                token_times.extend([now] * len(released))
                chunks.append(len(released))
                yield Emitted(released, delta, now)
            if rounds:
                yield rounds[-1]
            if stop_reason:
                break

            # ---- one round -------------------------------------------------------------------
            t0 = perf()
            remaining = max_tokens - len(out)
            g = min(policy.choose(len(context), 1), remaining - 1, capacity - len(context))
            proposal = drafter.propose(context, g, params, rng) if g > 0 else None
            t1 = perf()
            cand = proposal.tokens[:g] if proposal is not None else []
            n = len(cand)
            start = len(context) - 1
            logits = model(torch.tensor([[context[-1]] + cand]), start, cache)[0]
            t2 = perf()
            if params.greedy:
                k, new = verify_greedy(logits, cand)
            else:
                q = proposal.q[:n] if (proposal is not None and proposal.q is not None) else None
                k, new = verify_sampling(probs_from_logits(logits, params), cand, q, rng)
            kept, stop_reason = _cut_at_stop(new, len(out), max_tokens, eos)
            out.extend(kept)
            context.extend(kept)
            drafter.commit(context)
            t3 = perf()
            rounds.append(
                RoundRecord(drafter.name, g, n, k, len(kept), len(kept) < len(new), t1 - t0, t2 - t1, t3 - t2, start + 1)
            )
            policy.observe(n, k, t3 - t0, t_draft=t1 - t0)

        total_time = (token_times[-1] if token_times else perf() - t_start)
        drafter.end(prompt, out)
        yield RequestRecord(
            request_id=request_id or uuid.uuid4().hex[:12],
            drafter=drafter.name,
            gamma=policy.name if not isinstance(gamma, int) else gamma,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=params.seed,
            prompt_tokens=len(prompt),
            output_tokens=len(out),
            text=releaser.text,
            token_ids=out,
            stop_reason=stop_reason,
            t_prefill=t_prefill,
            ttft=token_times[0] if token_times else total_time,
            total_time=total_time,
            token_times=token_times,
            chunks=chunks,
            rounds=rounds,
            model=self.name,
            dtype=self.dtype,
        )

    def generate(self, prompt_ids: Sequence[int], **kwargs: Any) -> RequestRecord:
        """Run :meth:`stream` to the end and return the request record."""
        record = None
        for ev in self.stream(prompt_ids, **kwargs):
            record = ev
        assert isinstance(record, RequestRecord)
        return record
