"""One request's round, written once: the solo loop drives one request, the batch scheduler packs many.

:class:`Request` owns everything about a request that does not depend on how its forward passes
are scheduled: the first token from the prefill's last logits, the gamma plan (one clamp), the
drafter's proposal, verification of its logit rows, the cut at EOS / max_tokens, the commit,
the :class:`RoundRecord`, the release of tokens and text past stop strings, and the final
:class:`RequestRecord`. The driver owns the target's forward passes and the clock. A round::

    t0 = perf()
    g = req.plan(batch_size, capacity)       # the policy's gamma, clamped (see plan)
    cand, q = req.propose(g)
    t1 = perf()
    rows = target([req.context[-1]] + cand)  # alone (solo) or packed with other requests
    t2 = perf()
    rd = req.accept(rows, cand, q, g, t_draft=t1 - t0, t_verify=t2 - t1, batch_size=B)
    chunk = req.release()                    # Emitted or None; a stop string may cut rd
    req.close_round(t_other)                 # rd.t_other set, the policy observes the round
    req.stamp(chunk, now)                    # the chunk's emission time

Time meanings are stated once, in :mod:`specledger.records`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specledger.engine.drafters.base import Drafter
from specledger.engine.policy import GammaPolicy, StaticGamma
from specledger.engine.sampling import SamplingParams, probs_from_logits
from specledger.engine.tree import DraftTree, verify_tree_greedy, verify_tree_sampling
from specledger.engine.verify import argmax_rows, verify_greedy, verify_sampling
from specledger.errors import SpecLedgerError, require
from specledger.records import RequestRecord, RoundRecord


@dataclass(slots=True)
class Emitted:
    """Tokens that left the engine together (one chunk) and the text they released."""

    token_ids: list[int]
    text: str
    t: float  # seconds since the request started


@dataclass(slots=True)
class PrefillProgress:
    """A chunked prefill paused between chunks (``Engine.stream(prefill_chunk=...)``): ``done`` of ``total``
    prompt positions hold their k/v. A consumer running several streams side by side ends a turn here."""

    done: int
    total: int


@dataclass(frozen=True)
class Prefilled:
    """One prompt's target prefill, run once and shared by every request that decodes that prompt side by side
    (``Engine.stream(prefilled=...)``). A drafter that needs no network of the target's to prefill (plain, n-gram,
    suffix; a draft model or a head prefills its own state after this, on the request's clock) sees exactly what
    its own prefill would have computed, so outputs are unchanged; each request's clock starts ``seconds`` before
    it copies the k/v, so its TTFT and total time include the prefill once, the same prefill for every setting."""

    prompt: tuple[int, ...]
    cache: Any  # KVCache; positions [0, len(prompt)) hold the prompt's k/v
    logits: Any  # torch.Tensor [vocab]: the last prompt position's logits
    hidden: Any  # torch.Tensor [len(prompt), d_model] when a drafter reads the target's features, else None
    seconds: float  # the prefill's measured time (the first token read back)


def check_request(n_prompt: int, max_tokens: int, limit: int, limit_name: str, who: str = "") -> None:
    """A request fits: a non-empty prompt, max_tokens >= 1, prompt + max_tokens <= ``limit`` positions."""
    require(n_prompt > 0, "the prompt is empty; give at least one token")
    require(max_tokens >= 1, f"max_tokens must be >= 1, got {max_tokens}")
    if n_prompt + max_tokens > limit:
        raise SpecLedgerError(
            f"{who}prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) exceeds {limit_name} ({limit}); "
            "shorten the prompt or lower --max-tokens"
        )


def cut_at_stop(new: list[int], n_out: int, max_tokens: int, eos: frozenset[int]) -> tuple[list[int], str]:
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


def check_tree_budget(budget: int, room: int, who: str = "") -> None:
    """A tree budget is 0 (chains) or 1..room, room = the cache positions a request leaves free."""
    require(isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0,
            f"{who}tree budget must be an integer >= 1 (0 for chains), got {budget!r}")
    if budget > room:
        raise SpecLedgerError(
            f"{who}tree budget {budget} exceeds the cache's room ({room} positions past prompt + max_tokens); "
            "lower --tree-budget or --max-tokens"
        )


def gamma_label(policy: GammaPolicy) -> int | str:
    """What a RequestRecord calls its gamma: the integer of a static policy, else the policy's name."""
    return policy.gamma if isinstance(policy, StaticGamma) else policy.name


def _first_stop(text: str, stops: Sequence[str], start: int) -> int:
    """Index of the earliest occurrence of any stop string in ``text`` at or after ``start``; -1 if none."""
    best = -1
    for s in stops:
        j = text.find(s, start)
        if j != -1 and (best == -1 or j < best):
            best = j
    return best


class IncrementalText:
    """``decode(out)`` kept current as ``out`` grows, decoding only the tokens since the last settled point.

    Invariant: ``text == decode(out[:settled])`` and ``settled`` is a character boundary. :meth:`update` decodes the
    window ``out[start:]`` and ``out[start:settled]`` (``start``: the settled point before the last one, so the
    window never starts empty and a tokenizer that strips a first token's leading space strips it from both), and
    appends their difference -- unless the window's text ends in U+FFFD, a character whose bytes are not all in
    yet, which waits for the next tokens (so a stream never sends a replacement character that the full decode
    would not have). O(window) per call instead of O(output): at 1,000 tokens a whole-output decode costs ~0.7 ms,
    a quarter of a decode step. A shrunken ``out`` (cut by the caller) is decoded again in full."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.text = ""
        self.start = 0
        self.settled = 0

    def update(self, out: list[int], final: bool = False) -> str:
        """The text of ``out`` as far as it is settled; when ``final``, ``decode(out)`` itself (one whole decode
        per request, so a record's text is exactly the tokenizer's)."""
        if final or len(out) < self.settled:  # the end, or the output was cut: a whole decode
            self.text, self.start, self.settled = self.decode(out), len(out), len(out)
            return self.text
        window = self.decode(out[self.start :])
        known = self.decode(out[self.start : self.settled])
        if len(window) >= len(known) and not window.endswith("\ufffd"):
            self.text += window[len(known) :]
            self.start, self.settled = self.settled, len(out)
        return self.text


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
        self.incremental = IncrementalText(decode) if decode is not None and not self.stops else None

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
        elif self.incremental is not None:  # no stops: the text grows by a window's decode, not the whole output's
            text = self.incremental.update(out, final=bool(stop_reason))
            release_chars = len(text)
        self.text = text
        if release_to <= self.tok_sent:
            return [], "", dropped, stop_reason
        released = out[self.tok_sent : release_to]
        delta = text[self.text_sent : release_chars] if decode is not None else ""
        self.text_sent = max(self.text_sent, release_chars)
        self.tok_sent = release_to
        return released, delta, dropped, stop_reason


class Request:
    """One request in flight: its committed context, drafter, gamma policy, RNG, stops and ledger.

    Invariants: ``context == prompt + out`` until a stop string cuts ``out`` (then the request is
    done); ``out`` holds every committed token not cut by a stop
    (released or still held back by the releaser); ``rounds`` holds one RoundRecord per verify
    pass; ``stop_reason`` is non-empty exactly when the request is done.
    """

    def __init__(
        self,
        prompt: Sequence[int],
        drafter: Drafter,
        policy: GammaPolicy,
        params: SamplingParams,
        max_tokens: int,
        eos: frozenset[int],
        releaser: StopReleaser,
        t_arrival: float,
        request_id: str = "",
        category: str = "",
        prompt_id: str = "",
        tree_budget: int = 0,
        device: Any = "cpu",
    ) -> None:
        self.prompt = [int(t) for t in prompt]
        self.tree_budget = int(tree_budget)  # nodes per round (0: chains)
        self.drafter, self.policy, self.params = drafter, policy, params
        self.max_tokens, self.eos, self.releaser = max_tokens, eos, releaser
        self.t_arrival = t_arrival  # absolute perf_counter time; token times count from here
        self.request_id, self.category, self.prompt_id = request_id, category, prompt_id
        # on the device the logits live on (multinomial / rand need a generator there)
        self.rng = torch.Generator(device=device).manual_seed(params.seed if params.seed is not None else 0)
        self.context: list[int] = []
        self.out: list[int] = []
        self.rounds: list[RoundRecord] = []
        self.token_times: list[float] = []
        self.chunks: list[int] = []
        self.t_prefill = 0.0
        self.stop_reason = ""

    # -- the first token ----------------------------------------------------------------------
    def start(self, logits: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        """Commit the first token from the prefill's last-position logits; the drafter begins.
        ``hidden``: the prefill's final hidden states [len(prompt), dim] for a ``wants_hidden`` drafter."""
        p = self.params
        first = int(argmax_rows(logits.reshape(-1))) if p.greedy else int(
            torch.multinomial(probs_from_logits(logits, p), 1, generator=self.rng))
        if hidden is not None:
            self.drafter.observe_hidden(0, hidden)
        self.drafter.begin(self.prompt, p)
        self.out, self.stop_reason = cut_at_stop([first], 0, self.max_tokens, self.eos)
        self.context = self.prompt + self.out

    # -- a round -------------------------------------------------------------------------------
    def plan(self, batch_size: int, capacity: int) -> int:
        """gamma for this round: the policy's choice clamped to 0 <= g <= remaining - 1 (the round's
        bonus token is the last one max_tokens allows) and g <= capacity - len(context) (the
        verify pass writes positions len(context) - 1 .. len(context) - 1 + g)."""
        g = self.policy.choose(len(self.context), batch_size)
        return max(0, min(g, self.max_tokens - len(self.out) - 1, capacity - len(self.context)))

    def propose(self, g: int) -> tuple[list[int], Any]:
        """The drafter's candidates (at most ``g``) and their q rows (None: one-hot)."""
        if g <= 0:
            return [], None
        prop = self.drafter.propose(self.context, g, self.params, self.rng)
        cand = prop.tokens[:g]
        return cand, (prop.q[: len(cand)] if prop.q is not None else None)

    def plan_tree(self, budget: int, batch_size: int, capacity: int) -> tuple[int, int]:
        """(nodes, depth) for a tree round: the depth is :meth:`plan`'s gamma (the round's last token
        is the bonus), the nodes at most ``budget`` and the cache's room past the context."""
        g = self.plan(batch_size, capacity)
        return (max(0, min(budget, capacity - len(self.context))) if g > 0 else 0), g

    def propose_tree(self, nodes: int, depth: int) -> DraftTree:
        """The drafter's tree, cut to ``nodes`` nodes and ``depth`` levels: the DP's static shape for them
        when the drafter has one (``drafter.tree_shape``, :mod:`specledger.engine.tree_shape`), else its
        dynamic tree."""
        if nodes <= 0 or depth <= 0:
            return DraftTree()
        shaper = self.drafter.tree_shape
        if shaper is not None:
            tree = self.drafter.propose_shaped(self.context, shaper.shape_for(nodes, depth), self.params, self.rng)
        else:
            tree = self.drafter.propose_tree(self.context, nodes, depth, self.params, self.rng)
        return tree.trimmed(nodes, depth)

    def accept_tree(self, logits: torch.Tensor, tree: DraftTree, g: int, t_draft: float, t_verify: float,
                    batch_size: int = 1, budget: int = 0, hidden: torch.Tensor | None = None,
                    ) -> tuple[RoundRecord, list[int]]:
        """:meth:`accept` for a tree: ``logits`` [len(tree) + 1, V] for rows ``[context[-1]] + tree.tokens``.
        Returns the round's record (proposed = nodes verified, accepted = the accepted path's length,
        plus the tree's parents and the path) and the accepted path (node indices) whose k/v the
        driver commits. ``hidden``: the same rows' final hidden states, for a ``wants_hidden`` drafter: the
        root's and the accepted path's rows, compacted like their k/v, reach it before the commit."""
        p = self.params
        if p.greedy:
            path, new = verify_tree_greedy(logits, tree)
        else:
            path, new = verify_tree_sampling(probs_from_logits(logits, p), tree, self.rng)
        kept, self.stop_reason = cut_at_stop(new, len(self.out), self.max_tokens, self.eos)
        ctx_len = len(self.context)
        if hidden is not None:
            rows = torch.tensor([0] + [i + 1 for i in path], dtype=torch.long, device=hidden.device)
            self.drafter.observe_hidden(ctx_len - 1, hidden.index_select(0, rows))
        self.out.extend(kept)
        self.context.extend(kept)
        self.drafter.commit(self.context)
        rd = RoundRecord(self.drafter.name, g, len(tree), len(path), len(kept), len(kept) < len(new),
                         t_draft, t_verify, 0.0, ctx_len, batch_size, tree_budget=budget,
                         tree_parents=list(tree.parents), tree_path=list(path))
        self.rounds.append(rd)
        return rd, path

    def accept(self, logits: torch.Tensor, cand: list[int], q: Any, g: int, t_draft: float, t_verify: float,
               batch_size: int = 1, hidden: torch.Tensor | None = None) -> RoundRecord:
        """Verify ``cand`` against the target's ``len(cand) + 1`` logit rows (for ``[context[-1]] + cand``),
        cut at EOS / max_tokens, commit, tell the drafter; returns the round's record (t_other 0
        until :meth:`close_round`). ``hidden``: the same rows' final hidden states, for a
        ``wants_hidden`` drafter (handed over before the commit)."""
        p = self.params
        if p.greedy:
            k, new = verify_greedy(logits, cand)
        else:
            k, new = verify_sampling(probs_from_logits(logits, p), cand, q, self.rng)
        kept, self.stop_reason = cut_at_stop(new, len(self.out), self.max_tokens, self.eos)
        ctx_len = len(self.context)
        if hidden is not None:
            self.drafter.observe_hidden(ctx_len - 1, hidden)
        self.out.extend(kept)
        self.context.extend(kept)
        self.drafter.commit(self.context)
        rd = RoundRecord(self.drafter.name, g, len(cand), k, len(kept), len(kept) < len(new),
                         t_draft, t_verify, 0.0, ctx_len, batch_size)
        self.rounds.append(rd)
        return rd

    def release(self) -> Emitted | None:
        """The chunk that may leave now (unstamped), if any; a stop string may cut the output and
        mark the last round truncated (its committed count shrinks by the tokens dropped)."""
        released, delta, dropped, self.stop_reason = self.releaser.advance(self.out, self.stop_reason)
        if dropped and self.rounds:  # the request ends here; ``context`` keeps its last round as verified
            self.rounds[-1].truncated = True
            self.rounds[-1].committed -= dropped
        return Emitted(released, delta, 0.0) if released else None

    def close_round(self, t_other: float) -> None:
        """Set the last round's t_other and let the policy observe the round."""
        rd = self.rounds[-1]
        rd.t_other = t_other
        self.policy.observe(rd.proposed, rd.accepted, rd.t_round, t_draft=rd.t_draft)

    def stamp(self, chunk: Emitted, now: float) -> Emitted:
        """Stamp ``chunk`` as emitted at absolute time ``now``; record its tokens' times."""
        chunk.t = now - self.t_arrival
        self.token_times.extend([chunk.t] * len(chunk.token_ids))
        self.chunks.append(len(chunk.token_ids))
        return chunk

    # -- the end ---------------------------------------------------------------------------------
    def finish(self, now: float, decode_text: Callable[[list[int]], str], model: str = "", dtype: str = "",
               extra: dict[str, Any] | None = None) -> RequestRecord:
        """The drafter ends; the request's record (``decode_text`` gives the text when no chunk text
        was streamed; ``now`` is the end time when nothing was emitted)."""
        self.drafter.end(self.prompt, self.out)
        text = self.releaser.text if self.releaser.decode is not None else decode_text(self.out)
        p = self.params
        last = self.token_times[-1] if self.token_times else now - self.t_arrival
        return RequestRecord(
            request_id=self.request_id, drafter=self.drafter.name, gamma=gamma_label(self.policy),
            temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=p.seed,
            prompt_tokens=len(self.prompt), output_tokens=len(self.out), text=text, token_ids=self.out,
            stop_reason=self.stop_reason, t_prefill=self.t_prefill,
            ttft=self.token_times[0] if self.token_times else last, total_time=last,
            token_times=self.token_times, chunks=self.chunks, rounds=self.rounds,
            category=self.category, prompt_id=self.prompt_id, model=model, dtype=dtype, extra=extra or {},
            tree_budget=self.tree_budget,
        )
