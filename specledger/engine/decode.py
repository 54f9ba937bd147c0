"""The solo decode loop: prefill, then rounds of draft -> verify -> commit, every round timed.

The round (gamma plan, proposal, verification, cut and commit, RoundRecord, release past stop
strings, the final RequestRecord) is :class:`specledger.engine.request.Request`'s, the same code
the continuous-batching scheduler (``batch.py``) runs; this loop owns the forward passes, the
KV cache and the clock.

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
from typing import TYPE_CHECKING, Any

import torch

from specledger.engine.device import RoundClock, model_device
from specledger.engine.drafters.base import Drafter, NoDrafter
from specledger.engine.policy import GammaPolicy, as_policy
from specledger.engine.request import (
    Emitted,
    Prefilled,
    PrefillProgress,
    Request,
    StopReleaser,
    check_request,
    check_tree_budget,
    cut_at_stop,
)
from specledger.engine.sampling import SamplingParams
from specledger.records import GammaSpec, RequestRecord, RoundRecord

if TYPE_CHECKING:
    from specledger.engine.model import Transformer

# all but Engine: engine/request.py
__all__ = ["Emitted", "Engine", "Prefilled", "PrefillProgress", "StopReleaser", "cut_at_stop"]


class Engine:
    """One target model, its tokenizer and a reusable static KV cache; decodes one request at a time."""

    def __init__(
        self,
        model: Transformer,
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
        self.dtype_reason = ""  # why build_engine loaded this dtype (engine/build.py:resolve_dtype)
        self._cache = None
        self.device = model_device(model)  # the cache, token ids and the sampling RNG live here too
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

    def sibling(self) -> Engine:
        """The same target, tokenizer and limits with a KV cache of its own: several requests' streams can be
        open at once, e.g. one prompt's settings interleaved round by round (:mod:`specledger.engine.interleave`)."""
        twin = Engine(self.model, self.tokenizer, self.eos_token_ids, self.max_context, self.name, self.dtype)
        twin.loaded = self.loaded
        return twin

    def decode_text(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def check_prompt(self, prompt_ids: Sequence[int], max_tokens: int) -> None:
        check_request(len(prompt_ids), max_tokens, self.max_context, "the model's context")

    # -- the loop ------------------------------------------------------------------------
    @torch.inference_mode()
    def stream(
        self,
        prompt_ids: Sequence[int],
        drafter: Drafter | None = None,
        gamma: GammaSpec | GammaPolicy = 0,
        params: SamplingParams = SamplingParams(),
        max_tokens: int = 128,
        stop: Sequence[str] = (),
        request_id: str | None = None,
        ignore_eos: bool = False,
        tree_budget: int = 0,
        clock: Callable[[], float] | None = None,
        prefill_chunk: int = 0,
        prefilled: Prefilled | None = None,
        chunk_text: bool = True,
    ) -> Iterator[Emitted | PrefillProgress | RoundRecord | RequestRecord]:
        """Decode one request, yielding ``Emitted`` chunks and ``RoundRecord`` s as they happen,
        then the final ``RequestRecord`` (which also holds every round). The round itself is
        :class:`~specledger.engine.request.Request`'s; this loop runs its forward passes and clock.
        ``tree_budget`` > 0: each round verifies a token tree of at most that many nodes (depth at
        most gamma) in one pass and commits the accepted path's k/v in place; 0: chains.
        ``clock``: the request's time base (arrival, token times, total; default ``perf_counter``). A
        consumer that suspends the stream between rounds passes a clock that stops while it is suspended
        (:class:`specledger.engine.interleave.PausableClock`); a round's own marks never span a yield.
        ``prefill_chunk`` > 0: the prefill runs in passes of at most that many prompt positions, yielding a
        :class:`PrefillProgress` between them, so streams run side by side share the machine's slow moments
        in their prefills too, not only in their rounds (0: one pass, no such event).
        ``prefilled``: this prompt's prefill, already run (:meth:`prefill`); its k/v are copied into this
        request's cache and its measured time counts as this request's prefill (ignored when it is another
        prompt's, or lacks the hidden states this drafter reads).
        ``chunk_text``: each chunk carries its text delta (the output detokenized every round: O(output) per round);
        False (:meth:`generate`): chunks carry tokens only, the text is decoded once at the end (stop strings still
        detokenize every round: they need it)."""
        self.check_prompt(prompt_ids, max_tokens)
        check_tree_budget(tree_budget, self.max_context - len(prompt_ids) - max_tokens)
        policy = as_policy(gamma)
        policy.reset()
        perf, model, device = clock or time.perf_counter, self.model, self.device
        rclock = RoundClock(device)
        drafter = drafter or NoDrafter()
        want_hidden = drafter.wants_hidden
        shared = prefilled is not None and prefilled.prompt == tuple(int(t) for t in prompt_ids) and (
            prefilled.hidden is not None or not want_hidden)
        arrival = perf() - (prefilled.seconds if shared else 0.0)
        req = Request(prompt_ids, drafter, policy, params, max_tokens,
                      frozenset() if ignore_eos else self.eos_token_ids,
                      StopReleaser(self.decode_text if self.tokenizer is not None and (chunk_text or stop) else None,
                                   stop),
                      arrival, request_id or uuid.uuid4().hex[:12], tree_budget=tree_budget, device=device)
        cache = self.cache_for(len(req.prompt) + max_tokens + 1)
        capacity = cache.capacity
        hidden = None
        n_prompt = len(req.prompt)
        if shared:
            cache.kv[..., :n_prompt, :].copy_(prefilled.cache.kv[..., :n_prompt, :])
            req.start(prefilled.logits.clone(), prefilled.hidden if want_hidden else None)
        else:
            logits, prompt_hidden = yield from self._prefill_passes(req.prompt, cache, want_hidden, prefill_chunk)
            req.start(logits, prompt_hidden)
        req.t_prefill = perf() - req.t_arrival  # start() read the first token back: the device is done
        chunk = req.release()
        if chunk is not None:
            yield req.stamp(chunk, perf())
        while tree_budget and not req.stop_reason:  # the same round clock as the chain loop below
            m0 = rclock.mark()
            n, g = req.plan_tree(tree_budget, 1, capacity)
            tree = req.propose_tree(n, g)
            m1 = rclock.mark()
            start = len(req.context) - 1
            rows = [req.context[-1]] + tree.tokens
            kv = hidden = None
            if tree.is_chain:  # the chain pass (fast, no k/v to compact)
                logits, hidden = _chain_pass(model, torch.tensor([rows], device=device), start, cache, want_hidden)
            elif want_hidden:  # a learned head reads the accepted path's features
                logits, kv, hidden = model.forward_tree(rows, [0] * len(rows), tree.positions(start), cache,
                                                        return_hidden=True)
            else:
                logits, kv = model.forward_tree(rows, [0] * len(rows), tree.positions(start), cache)
            m2 = rclock.mark()
            rd, path = req.accept_tree(logits, tree, g, 0.0, 0.0, budget=tree_budget, hidden=hidden)
            if kv is not None:
                model.commit_tree_kv(cache, 0, rd.context_len, kv, [i + 1 for i in path])
            yield from _end_round(req, rd, rclock, m0, m1, m2, perf)
        while not req.stop_reason:
            m0 = rclock.mark()
            g = req.plan(1, capacity)
            cand, q = req.propose(g)
            m1 = rclock.mark()
            context = req.context
            ids = torch.tensor([[context[-1]] + cand], device=device)
            logits, hidden = _chain_pass(model, ids, len(context) - 1, cache, want_hidden)
            m2 = rclock.mark()
            rd = req.accept(logits, cand, q, g, 0.0, 0.0, hidden=hidden)  # the commit: the round's one read-back
            yield from _end_round(req, rd, rclock, m0, m1, m2, perf)
        yield req.finish(perf(), self.decode_text, self.name, self.dtype,
                         extra={"prefill_shared": True} if shared else None)

    def _prefill_passes(self, prompt: Sequence[int], cache: Any, want_hidden: bool, chunk: int = 0
                        ) -> Iterator[PrefillProgress]:
        """Fill ``cache`` positions [0, len(prompt)) with the prompt's k/v, in passes of ``chunk`` positions
        (0: one pass), yielding a :class:`PrefillProgress` between passes; returns (the last position's logits
        [vocab], the prompt's hidden states [len(prompt), d_model] or None)."""
        n_prompt = len(prompt)
        step = chunk if chunk > 0 else n_prompt
        hiddens = []
        for a in range(0, n_prompt, step):  # one pass unless chunked; chunks fill the cache in order
            if a:
                yield PrefillProgress(a, n_prompt)
            ids = torch.tensor([list(prompt[a:a + step])], device=self.device)
            if want_hidden:
                logits, h = self.model(ids, a, cache, last_only=True, return_hidden=True)
                hiddens.append(h[0])
            else:
                logits = self.model(ids, a, cache, last_only=True)
        hidden = (hiddens[0] if len(hiddens) == 1 else torch.cat(hiddens)) if want_hidden else None
        return logits[0, -1], hidden

    @torch.inference_mode()
    def prefill(self, prompt_ids: Sequence[int], max_tokens: int, want_hidden: bool = False) -> Prefilled:
        """Run the prompt's prefill once into this engine's cache and time it (the first token read back, as a
        request's TTFT does): the :class:`Prefilled` that requests of this prompt share (``stream(prefilled=)``).
        The cache is this engine's own: use a twin that decodes nothing while the prefill is shared."""
        self.check_prompt(prompt_ids, max_tokens)
        prompt = [int(t) for t in prompt_ids]
        cache = self.cache_for(len(prompt) + 1)
        t0 = time.perf_counter()
        gen = self._prefill_passes(prompt, cache, want_hidden)
        try:
            while True:
                next(gen)
        except StopIteration as done:
            logits, hidden = done.value
        int(logits.argmax())  # the read-back: the device is done
        return Prefilled(tuple(prompt), cache, logits.clone(), hidden, time.perf_counter() - t0)

    def generate(self, prompt_ids: Sequence[int], **kwargs: Any) -> RequestRecord:
        """Run :meth:`stream` to the end and return the request record (its text decoded once, at the end, unless
        ``chunk_text=True`` is asked: no chunk leaves here)."""
        record = None
        for ev in self.stream(prompt_ids, **{"chunk_text": False, **kwargs}):
            record = ev
        assert isinstance(record, RequestRecord)
        return record


def _chain_pass(model: Transformer, ids: torch.Tensor, start: int, cache: Any, want_hidden: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One verify forward over a chain's rows (the last committed token + the candidates): (logits,
    hidden states or None) of the single request."""
    if want_hidden:
        logits, hidden = model(ids, start, cache, return_hidden=True)
        return logits[0], hidden[0]
    return model(ids, start, cache)[0], None


def _end_round(req: Any, rd: RoundRecord, clock: RoundClock, m0: Any, m1: Any, m2: Any,
               now: Callable[[], float] = time.perf_counter) -> Iterator[Any]:
    """A round's tail, chain or tree alike: release the committed tokens, split the round's time at its
    marks (draft | verify | other), close the round, then yield the chunk (stamped) and the round record."""
    chunk = req.release()
    m3 = clock.mark()
    rd.t_draft, rd.t_verify, t_other = clock.split(m0, m1, m2, m3)
    req.close_round(t_other)
    if chunk is not None:
        yield req.stamp(chunk, now())
    yield rd
