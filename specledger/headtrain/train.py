"""``specledger train-head``: train the ``head`` drafter on the target's own outputs (self-distillation).

Data: only the bundled workloads' ``train`` split (:func:`specledger.workloads.training_items`),
optionally with extra train-split chat questions and a category weighting
(:mod:`specledger.headtrain.data`), never a prompt a run measures. Three phases inside one time budget
(``minutes``):

1. generate -- the target answers training prompts greedily (packed batches of up to
   ``max_batch``, up to ``max_new_tokens`` each) for ``gen_share`` of the budget; the passes that
   generate also give every position's final hidden state ``f_j`` (kept in bf16) and the
   target's argmax next token ``y_j`` (prompt rows from the prefill, answer rows one per step),
   so the head learns the target's own continuations, the text it drafts at run time;
2. prefill -- for ``prefill_share`` of the budget, one teacher-forced pass per further training
   prompt (cut to ``prefill_max_tokens``) gives ``f_j`` and ``y_j`` for every position at once
   (~30x the tokens per second of generating): the bulk of the corpus, on the same self-distillation
   pairs (``y_j`` is the target's argmax, not the prompt's next token);
3. train -- AdamW on windows of the concatenated sequences until the budget ends: input
   ``(embed(c_j), f_{j-1} + noise)``, loss = cross-entropy of the head's draft-vocabulary logits
   against ``y_j`` + smooth-L1 between the predicted and the true feature (scaled by the
   features' std), EAGLE's two losses; a prompt position's CE weighs ``prompt_loss_weight``
   (a generated answer's weighs 1: the head only drafts answers at run time). The noise (uniform, +-0.1 std as
   in EAGLE) stands in for the head's own errors when it later feeds on predicted features. A held-out 5 % of the
   training sequences measures teacher-forced top-1 agreement with the target, over all positions
   (``val_top1``) and over the generated answers' positions only (``val_top1_answer``: the text
   the head drafts at run time, where a chain round's first token is accepted at about this rate).
   With ``check_every`` the held-out set is scored every N steps and the checkpoint with the best
   ``val_top1_answer`` is kept (early stopping against over-fitting a small corpus; the figures
   are then those of the kept checkpoint, chosen on that same held-out set).

The draft vocabulary is the ``draft_vocab`` most frequent ``y_j`` plus the target's stop tokens
(filled up from the training prompts' token counts when the corpus has fewer distinct ones).
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from specledger.engine.drafters.head import HeadConfig, HeadNet, save_head, target_fingerprint
from specledger.errors import require
from specledger.headtrain.data import encode_items, training_prompt_items

if TYPE_CHECKING:
    from specledger.engine.model import Transformer


@dataclass
class TrainSettings:
    minutes: float = 8.0
    gen_share: float = 0.5  # of the budget spent generating the target's answers
    max_new_tokens: int = 160
    max_prompt_tokens: int = 256
    hidden_dim: int = 768  # the head layer's MLP width (the target's is 1536 for SmolLM2-135M)
    draft_vocab: int = 8192  # 0 = the full vocabulary
    lr: float = 1e-3
    window: int = 256
    batch: int = 4
    noise: float = 0.1
    seed: int = 0
    categories: list[str] | None = None
    max_prompts: int | None = None  # stop generating after this many prompts (tests: a fixed corpus)
    max_steps: int | None = None  # stop training after this many steps (tests: a fixed amount of work)
    max_batch: int = 16  # generation concurrency (the linears of 16 rows cost ~2.8x one row: bench_gemv_ceiling.py)
    prefill_share: float = 0.25  # of the budget spent on teacher-forced passes over further prompts (0 = none)
    prefill_max_tokens: int = 512  # longest prompt prefix one such pass reads
    max_prefill_prompts: int | None = None  # at most this many prefill passes (tests: a fixed corpus)
    extra_chat: int = 0  # add up to this many train-split open questions (workloads.chat_questions) as dialogue
    category_weights: dict[str, float] | None = None  # prompt order by category share (None: one shuffle)
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    prompt_loss_weight: float = 1.0  # CE weight of prompt positions (answer positions weigh 1; EAGLE uses 0)
    check_every: int = 0  # score the held-out sequences every N steps and keep the best checkpoint (0 = last)

    def validate(self) -> None:
        require(self.minutes > 0, f"--minutes must be > 0, got {self.minutes}")
        require(0 < self.gen_share < 1, f"gen share must be in (0, 1), got {self.gen_share}")
        require(0 <= self.prefill_share and self.gen_share + self.prefill_share < 1,
                f"prefill share must be >= 0 and leave time to train (gen share + prefill share < 1), "
                f"got {self.prefill_share}")
        require(self.prefill_max_tokens >= 2, "--prefill-max-tokens must be >= 2")
        require(self.max_new_tokens >= 1, "--max-new-tokens must be >= 1")
        require(self.hidden_dim >= 8, "--head-hidden must be >= 8")
        require(self.draft_vocab >= 0, "--draft-vocab must be >= 0 (0 = the full vocabulary)")
        require(self.window >= 8 and self.batch >= 1, "window >= 8 and batch >= 1")
        require(self.max_batch >= 1, f"--max-batch must be >= 1, got {self.max_batch}")
        require(self.extra_chat >= 0, f"--extra-chat must be >= 0, got {self.extra_chat}")
        require(self.prompt_loss_weight >= 0, f"--prompt-loss-weight must be >= 0, got {self.prompt_loss_weight}")
        require(self.check_every >= 0, f"--check-every must be >= 0, got {self.check_every}")
        require(self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}")
        weights = self.category_weights or {}
        require(all(w >= 0 for w in weights.values()) and (not weights or any(w > 0 for w in weights.values())),
                f"--category-weights must be >= 0 and not all 0, got {weights}")


@dataclass
class Corpus:
    tokens: list[torch.Tensor] = field(default_factory=list)  # int64 [T]
    feats: list[torch.Tensor] = field(default_factory=list)  # bf16 [T, dim]
    labels: list[torch.Tensor] = field(default_factory=list)  # int64 [T] target argmax next token
    answer: list[torch.Tensor] = field(default_factory=list)  # bool [T]: label is a generated answer token
    prompt_tokens: int = 0
    answer_tokens: int = 0
    prefill_tokens: int = 0  # tokens from teacher-forced prompt passes (phase 2)
    prompts_started: int = 0  # prompts the generate phase took (the prefill phase reads the rest)

    @property
    def n_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


Progress = Callable[[str, float, str], None]  # (phase, fraction done, note)


def _noop(phase: str, frac: float, note: str) -> None:
    pass


@torch.inference_mode()
def generate_corpus(model: Transformer, eos: Sequence[int], prompts: Sequence[list[int]], max_new_tokens: int,
                    deadline: float, max_batch: int = 16, progress: Progress = _noop) -> Corpus:
    """The target answers ``prompts`` greedily (up to ``max_batch`` at once, one packed pass per
    step) until ``deadline``; the hidden states and argmax labels of every position are kept from
    the very passes that generate (the prefill's rows for the prompt, one row per step for the
    answer), so no second pass is needed. A sequence's last token (no feature yet) is dropped."""
    stop = frozenset(int(t) for t in eos)
    capacity = max(len(p) for p in prompts) + max_new_tokens + 1
    cache = model.new_cache(capacity, batch_size=max_batch)
    corpus = Corpus()
    free = list(range(max_batch))
    running: list[dict] = []
    pending = list(prompts)
    start = time.perf_counter()
    total = max(1e-9, deadline - start)

    def finish(r: dict) -> None:
        corpus.tokens.append(torch.tensor(r["tokens"][:-1], dtype=torch.long))
        corpus.feats.append(torch.cat(r["feats"]).to(torch.bfloat16))
        corpus.labels.append(torch.cat(r["labels"]))
        rows = len(r["tokens"]) - 1
        corpus.answer.append(torch.arange(rows) >= r["n_prompt"] - 1)
        corpus.prompt_tokens += r["n_prompt"]
        corpus.answer_tokens += len(r["tokens"]) - r["n_prompt"]
        free.append(r["slot"])

    while (pending or running) and time.perf_counter() < deadline:
        while pending and free and time.perf_counter() < deadline:
            prompt = pending.pop(0)
            corpus.prompts_started += 1
            slot = free.pop()
            logits, hidden = model(torch.tensor([prompt]), 0, cache.slot(slot), return_hidden=True)
            labels = logits[0].argmax(-1)
            running.append({"slot": slot, "tokens": list(prompt) + [int(labels[-1])], "n_prompt": len(prompt),
                            "feats": [hidden[0]], "labels": [labels]})
        if not running:
            break
        tokens = [r["tokens"][-1] for r in running]
        positions = [len(r["tokens"]) - 1 for r in running]
        logits, hidden = model.forward_packed(tokens, [r["slot"] for r in running], positions, cache,
                                              return_hidden=True)
        nxt = logits.argmax(-1)
        still = []
        for i, r in enumerate(running):
            r["feats"].append(hidden[i : i + 1])
            r["labels"].append(nxt[i : i + 1])
            r["tokens"].append(int(nxt[i]))
            if int(nxt[i]) in stop or len(r["tokens"]) - r["n_prompt"] >= max_new_tokens:
                finish(r)
            else:
                still.append(r)
        running = still
        progress("generate", min(1.0, (time.perf_counter() - start) / total),
                 f"{len(corpus.tokens)} answers, {corpus.n_tokens} tokens")
    for r in running:  # the budget ran out mid-answer: keep what was computed
        finish(r)
    return corpus


@torch.inference_mode()
def prefill_corpus(model: Transformer, prompts: Sequence[list[int]], max_tokens: int, deadline: float,
                   corpus: Corpus | None = None, progress: Progress = _noop) -> Corpus:
    """Teacher-forced passes until ``deadline``: one forward per prompt (its first ``max_tokens``
    tokens) gives every position ``j`` its feature ``f_j`` and label ``y_j`` = the target's argmax
    after ``c_0..c_j`` -- the same pairs :func:`generate_corpus` keeps, for all positions of the
    prompt at the price of one prefill. Appends to ``corpus`` (a new one if None)."""
    corpus = corpus if corpus is not None else Corpus()
    start = time.perf_counter()
    total = max(1e-9, deadline - start)
    cache = model.new_cache(max_tokens)
    for prompt in prompts:
        if time.perf_counter() >= deadline:
            break
        ids = list(prompt)[:max_tokens]
        if len(ids) < 2:
            continue
        logits, hidden = model(torch.tensor([ids]), 0, cache, return_hidden=True)
        corpus.tokens.append(torch.tensor(ids, dtype=torch.long))
        corpus.feats.append(hidden[0].to(torch.bfloat16))
        corpus.labels.append(logits[0].argmax(-1))
        corpus.answer.append(torch.zeros(len(ids), dtype=torch.bool))
        corpus.prefill_tokens += len(ids)
        progress("prefill", min(1.0, (time.perf_counter() - start) / total),
                 f"{len(corpus.tokens)} sequences, {corpus.n_tokens} tokens")
    return corpus


def choose_draft_vocab(corpus: Corpus, size: int, always: Sequence[int], vocab_size: int,
                       fill: Counter | None = None) -> torch.Tensor | None:
    """The ``size`` most frequent target next tokens plus ``always`` (stop tokens); when the corpus
    has fewer distinct ones, the most frequent tokens of ``fill`` (e.g. every training prompt's
    tokens: text the corpus had no time to generate over), then the lowest unseen ids. None = full
    vocabulary."""
    if size <= 0 or size >= vocab_size:
        return None
    counts = Counter(torch.cat(corpus.labels).tolist())
    chosen = [t for t in always if 0 <= t < vocab_size]
    taken = set(chosen)
    for source in (counts, fill or Counter()):
        for tok, _ in source.most_common():
            if len(chosen) >= size:
                break
            if tok not in taken and 0 <= tok < vocab_size:
                chosen.append(tok)
                taken.add(tok)
    for tok in range(vocab_size):  # fill up with unseen ids so the size is what was asked
        if len(chosen) >= size:
            break
        if tok not in taken:
            chosen.append(tok)
            taken.add(tok)
    return torch.tensor(sorted(chosen), dtype=torch.long)


def _stream(corpus: Corpus, idx: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """Concatenate sequences ``idx``: tokens, previous features (zero at each sequence start),
    target features, labels and the answer mask."""
    toks = torch.cat([corpus.tokens[i] for i in idx])
    feats = torch.cat([corpus.feats[i] for i in idx])
    labels = torch.cat([corpus.labels[i] for i in idx])
    prev = torch.zeros_like(feats)
    offset = 0
    for i in idx:
        n = len(corpus.tokens[i])
        prev[offset + 1 : offset + n] = corpus.feats[i][: n - 1]
        offset += n
    return toks, prev, feats, labels, torch.cat([corpus.answer[i] for i in idx])


def _set_prepack(net: HeadNet, on: bool) -> None:
    for module in net.modules():
        if hasattr(module, "prepack"):
            module.prepack = on


def _draft_targets(target: Transformer, vocab_ids: torch.Tensor | None, vocab_size: int,
                   labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, float]:
    """The head's output matrix (the target's lm_head rows of the draft vocabulary, float32), the map from target
    ids to draft ids (-100: not in it; None: the full vocabulary) and the share of ``labels`` the draft vocabulary
    covers."""
    w_lm = target.lm_head.weight
    if w_lm.dtype == torch.int8:
        w_lm = w_lm.float() * target.lm_head.scales.float()[:, None]
    w_draft = (w_lm if vocab_ids is None else w_lm[vocab_ids]).detach().float()
    remap = None
    if vocab_ids is not None:
        remap = torch.full((vocab_size,), -100, dtype=torch.long)
        remap[vocab_ids] = torch.arange(len(vocab_ids))
    coverage = 1.0 if remap is None else float((remap[labels] >= 0).float().mean())
    return w_draft, remap, coverage


def _train_figures(steps: int, seen: int, ema: tuple[float, ...], coverage: float) -> dict[str, Any]:
    """The training loop's figures: steps, token visits, the smoothed losses and top-1, the vocabulary coverage."""
    return {"train_steps": steps, "train_token_visits": seen, "train_ce": round(ema[0], 4),
            "train_reg": round(ema[1], 4), "train_top1": round(ema[2], 4), "draft_vocab_coverage": round(coverage, 4)}


def train_head_net(target: Transformer, corpus: Corpus, vocab_ids: torch.Tensor | None, s: TrainSettings,
                   deadline: float, progress: Progress = _noop) -> tuple[HeadNet, dict]:
    torch.manual_seed(s.seed)
    rnd = random.Random(s.seed)
    hc = HeadConfig.for_target(target.config, s.hidden_dim, 0 if vocab_ids is None else len(vocab_ids))
    net = HeadNet(hc).float()
    _set_prepack(net, False)
    order = list(range(len(corpus.tokens)))
    rnd.shuffle(order)
    n_val = max(1, len(order) // 20) if len(order) >= 4 else 0
    val_idx, train_idx = order[:n_val], order[n_val:] or order
    toks, prev, feats, labels, answer = _stream(corpus, train_idx)
    sigma = float(feats[: 200_000].float().std()) or 1.0
    w_draft, remap, coverage = _draft_targets(target, vocab_ids, hc.vocab_size, labels)
    embed = target.embed.weight.detach().float()
    val = None
    if val_idx:
        val = _stream(corpus, val_idx)
    opt = torch.optim.AdamW(net.parameters(), lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.95))
    L = min(s.window, len(toks))
    start_t = time.perf_counter()
    total = max(1e-9, deadline - start_t)
    steps, seen, ema = 0, 0, None

    def batch_at(starts: Sequence[int], noise: float):
        tok_b = torch.stack([toks[a : a + L] for a in starts])
        prev_b = torch.stack([prev[a : a + L] for a in starts]).float()
        if noise:
            prev_b = prev_b + (torch.rand_like(prev_b) * 2 - 1) * (noise * sigma)
        return (tok_b, prev_b, torch.stack([feats[a : a + L] for a in starts]).float(),
                torch.stack([labels[a : a + L] for a in starts]), torch.stack([answer[a : a + L] for a in starts]))

    def loss_of(tok_b, prev_b, feat_b, lab_b, ans_b):
        """CE (answer positions weigh 1, prompt positions ``prompt_loss_weight``) + feature regression."""
        kv = torch.zeros(2, tok_b.shape[0], hc.n_kv_heads, tok_b.shape[1], hc.head_dim)
        pred = net(F.embedding(tok_b, embed), prev_b, kv, 0)
        logits = pred @ w_draft.T
        target_ids = lab_b if remap is None else remap[lab_b]
        ce_each = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_ids.reshape(-1), ignore_index=-100,
                                  reduction="none")
        weight = torch.where(ans_b.reshape(-1), 1.0, s.prompt_loss_weight) * (target_ids.reshape(-1) != -100)
        ce = (ce_each * weight).sum() / weight.sum().clamp_min(1e-9)
        reg = F.smooth_l1_loss(pred / sigma, feat_b / sigma)
        return ce, reg, logits.argmax(-1) == target_ids

    def val_score() -> dict[str, Any]:
        """Teacher-forced figures on the held-out sequences (no noise), in windows of L."""
        vt, vp, vf, vl, va = val
        Lv = min(L, len(vt))
        ce_sum = n = 0.0
        hit_all = hit_ans = n_ans = 0
        with torch.no_grad():
            for a in range(0, len(vt) - Lv + 1, Lv):
                w = slice(a, a + Lv)
                ce, _, hits = loss_of(vt[None, w], vp[None, w].float(), vf[None, w].float(), vl[None, w], va[None, w])
                ce_sum, n = ce_sum + float(ce), n + 1
                hit_all += int(hits.sum())
                hit_ans += int(hits[0][va[w]].sum())
                n_ans += int(va[w].sum())
        if not n:
            return {}
        return {"val_ce": round(ce_sum / n, 4), "val_top1": round(hit_all / (n * Lv), 4), "val_tokens": int(n * Lv),
                "val_answer_tokens": n_ans, "val_top1_answer": round(hit_ans / n_ans, 4) if n_ans else None}

    best: tuple[int, dict, float, dict] | None = None  # (step, state, key, figures) of the best checkpoint so far
    checks: list[list[float]] = []  # [step, val_top1, val_top1_answer] per check

    def check() -> None:
        nonlocal best
        net.eval()
        score = val_score()
        net.train()
        if not score:
            return
        key = score["val_top1_answer"] if score["val_top1_answer"] is not None else score["val_top1"]
        checks.append([steps, score["val_top1"], score["val_top1_answer"]])
        if best is None or key > best[2]:
            best = (steps, {k: v.detach().clone() for k, v in net.state_dict().items()}, key, score)

    while True:
        now = time.perf_counter()
        if (now >= deadline and steps > 0) or (s.max_steps is not None and steps >= s.max_steps):
            if val is not None and s.check_every:
                check()
            break
        if val is not None and s.check_every and steps and steps % s.check_every == 0:
            check()
        frac = min(1.0, (now - start_t) / total)
        for group in opt.param_groups:  # linear warm-up over 20 steps, cosine decay to the deadline
            group["lr"] = s.lr * min(1.0, (steps + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        starts = [rnd.randrange(0, len(toks) - L + 1) for _ in range(s.batch)]
        ce, reg, hits = loss_of(*batch_at(starts, s.noise))
        acc = hits.float().mean()
        loss = ce + reg
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        steps += 1
        seen += s.batch * L
        cur = (float(ce.detach()), float(reg.detach()), float(acc))
        ema = cur if ema is None else tuple(0.9 * e + 0.1 * c for e, c in zip(ema, cur))
        progress("train", frac, f"step {steps} ce {ema[0]:.3f} reg {ema[1]:.3f} top1 {ema[2]:.3f}")

    figures = _train_figures(steps, seen, ema, coverage)
    net.eval()
    if best is not None:  # keep the checkpoint that drafted the held-out answers best (its figures as scored)
        net.load_state_dict(best[1])
        figures.update({"best_step": best[0], "checkpoints": checks, **best[3]})
    elif val is not None:
        figures.update(val_score())
    net.requires_grad_(False)
    _set_prepack(net, True)
    return net, figures


def train_head(loaded: Any, s: TrainSettings, out_path: Any, progress: Progress = _noop,
               command: str = "") -> dict:
    """All three phases for the loaded target; writes the head file; returns the training figures."""
    from pathlib import Path

    s.validate()
    t0 = time.perf_counter()
    deadline = t0 + 60.0 * s.minutes
    model = loaded.model
    encoded = encode_items(loaded, training_prompt_items(s.categories, s.extra_chat, s.category_weights, s.seed),
                           None)
    short = [p for p in encoded if len(p[1]) <= s.max_prompt_tokens]
    prompts = short[: s.max_prompts]
    longer = [p for p in encoded if len(p[1]) > s.max_prompt_tokens]  # read by the prefill phase only
    require(prompts, "no training prompts: the training split is empty for these categories")
    gen_deadline = t0 + 60.0 * s.minutes * s.gen_share
    corpus = generate_corpus(model, loaded.eos_token_ids, [p for _, p in prompts], s.max_new_tokens, gen_deadline,
                             s.max_batch, progress)
    require(corpus.tokens, "no answers were generated in the time given; raise --minutes")
    n_answers = len(corpus.tokens)
    t_gen = time.perf_counter() - t0
    rest = (short[corpus.prompts_started :] + longer)[: s.max_prefill_prompts]
    if s.prefill_share > 0:
        prefill_deadline = gen_deadline + 60.0 * s.minutes * s.prefill_share
        prefill_corpus(model, [p for _, p in rest], s.prefill_max_tokens, prefill_deadline, corpus, progress)
    t_prefill = time.perf_counter() - t0 - t_gen
    fill = Counter(t for _, p in encoded for t in p)
    vocab_ids = choose_draft_vocab(corpus, s.draft_vocab, loaded.eos_token_ids, model.config.vocab_size, fill)
    net, figures = train_head_net(model, corpus, vocab_ids, s, deadline, progress)
    t_train = time.perf_counter() - t0 - t_gen - t_prefill
    figures = {
        "command": command, "settings": asdict(s), "target": loaded.name,
        "target_fingerprint": target_fingerprint(model), "train_prompts_available": len(prompts),
        "sequences": len(corpus.tokens), "tokens": corpus.n_tokens, "prompt_tokens": corpus.prompt_tokens,
        "answer_tokens": corpus.answer_tokens, "prefill_tokens": corpus.prefill_tokens,
        "answers_by_category": dict(Counter(c for c, _ in prompts[: corpus.prompts_started])),
        "prefill_by_category": dict(Counter(c for c, p in rest[: len(corpus.tokens) - n_answers])),
        "seconds_generate": round(t_gen, 1), "seconds_prefill": round(t_prefill, 1),
        "seconds_train": round(t_train, 1),
        "seconds_total": round(time.perf_counter() - t0, 1), **figures,
    }
    path = save_head(out_path, net, vocab_ids, target_fingerprint(model), figures)
    figures["file"] = str(path)
    figures["file_bytes"] = Path(path).stat().st_size
    return figures
