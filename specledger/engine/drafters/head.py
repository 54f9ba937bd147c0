"""``head``: a learned draft head on the target's own features (EAGLE-style): chains and token trees.

Design and why
--------------
EAGLE, not Medusa. A Medusa head ``k`` predicts token ``t+k`` from the feature at ``t`` alone,
blind to the tokens drafted in between, so its acceptance falls fast with depth; an EAGLE head
is autoregressive over features and sees each drafted token, which is why deployed engines
(vLLM, SGLang, TensorRT-LLM) ship EAGLE/EAGLE-3 and MTP rather than Medusa. The head here is:

- input at position ``j``: ``fc([embed(c_j); f_{j-1}])`` -- the target's own embedding of the
  token at ``j`` and the target's final hidden state (after its final norm, i.e. what its LM
  head reads) at ``j-1`` (zeros at ``j = 0``); ``fc`` is ``Linear(2*dim, dim)``;
- one decoder layer of the target's shape (same heads, head_dim and RoPE; the MLP width is a
  training option, 768 by default: half the target's 1536, which halves the file and the MLP's
  draft time), with its own one-layer static KV cache;
- output: a predicted feature ``f^_j`` (trained to regress ``f_j``), read by the *target's* LM
  head, optionally restricted to a reduced draft vocabulary (below). No weights are copied
  from the target into the file: only ``fc``, the layer, and the draft-vocabulary id list.

Drafting a round from committed context ``c_0..c_{n-1}``: the target features ``f_0..f_{n-2}``
are known (the last verify pass computed every accepted position's feature; the bonus token
``c_{n-1}`` has none yet). The head first catches up on the positions its cache lacks --
``[m, n)`` with true features, typically the ``K + 1`` tokens the last round committed -- in
one pass whose last row gives ``f^_{n-1}`` and the first draft token; every further draft step
feeds ``(drafted token, f^)`` at the next position (gamma - 1 one-row steps). Cache entries
written with predicted features are never kept: after the round they are recomputed from the
true features the verify pass produced, so the head's cache always rests on the target's
features (as in EAGLE). Rejected candidates cost nothing to roll back (a smaller position).

Reduced draft vocabulary: on this CPU the LM head (49152 x 576, tied) is ~21 % of the target's
weights, so a full-vocabulary head step costs ~24 % of a target step -- the LM head dominates
the head's own time (one layer is ~3 %). With the ``N`` most frequent target tokens of the
training data (N = 8192 by default, plus the stop tokens; 99 % of the training labels, 92 % of
held-out dialogue output), a draft step reads ~17 % of that lm_head (benchmarks/bench_head.py:
one lm_head row 5.9 ms full vs 0.47 ms reduced, a whole head step 6.5 vs 1.0 ms, against a
36.5 ms target step). Tokens outside the set are never proposed (acceptance pays for the share
they cover) and sampled drafting gives them q = 0 (verification stays exact: q is the
distribution actually sampled from, a full-vocabulary row with zeros outside the set).

Exactness: the verifier decides everything; greedy output equals plain greedy whatever the
head proposes, and sampled drafting hands the verifier its true q (``probs_from_logits`` of
the draft-vocabulary logits scattered into a full row of ``-inf``, same params as the target).

Trees: :meth:`HeadDrafter.propose_tree` grows an EAGLE-2 top-k tree from the head's distribution (the
nodes of highest path probability), :meth:`HeadDrafter.propose_shaped` fills the DP's static shape; both
run the head over tree nodes with a tree mask in its own cache (:mod:`specledger.engine.drafters.head_tree`).
:meth:`HeadDrafter.catch_up` and :meth:`HeadDrafter.step` expose one head step at a time, and every chain
``propose`` leaves the per-step top-k (ids, probabilities) of the draft distribution in ``step_topk``.

Files: safetensors with ``fc.*``, ``block.*`` (bf16), ``draft_vocab`` (int32 ids) and metadata
(format, target hidden size, vocabulary, target fingerprint, head config, training figures).
The fingerprint (:func:`target_fingerprint`) is a hash of the target's config and a slice of
its embedding rounded to bf16, so fp32/bf16/int8 copies of one target share it (the int8
re-check of seed section 6.1 uses the same head) and a different target is refused.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from specledger.engine.drafters import catalog
from specledger.engine.drafters.base import Drafter, DrafterOptions, Proposal
from specledger.engine.drafters.neural import common_prefix_len
from specledger.engine.layers import Linear, rope_cos_sin
from specledger.engine.model import Block
from specledger.engine.model_config import KVCache, ModelConfig
from specledger.engine.sampling import SamplingParams, probs_from_logits
from specledger.engine.tree import DraftTree
from specledger.errors import SpecLedgerError

if TYPE_CHECKING:
    from specledger.engine.model import Transformer
    from specledger.engine.protocol import TargetEngine

HEAD_FORMAT = "specledger-head/1"
HEAD_SUFFIX = ".safetensors"
#: the head files shipped with the package (one per bundled target fingerprint)
PACKAGED_HEADS = Path(__file__).resolve().parent.parent / "data" / "heads"
TRAIN_COMMAND = "specledger train-head"


@dataclass
class HeadConfig:
    dim: int
    vocab_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    rope_theta: float
    norm_eps: float
    max_seq_len: int
    draft_vocab: int  # 0 = the full vocabulary

    def block_config(self) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab_size, dim=self.dim, n_layers=1, n_heads=self.n_heads,
                           n_kv_heads=self.n_kv_heads, hidden_dim=self.hidden_dim, rope_theta=self.rope_theta,
                           norm_eps=self.norm_eps, max_seq_len=self.max_seq_len, head_dim=self.head_dim)

    @classmethod
    def for_target(cls, cfg: ModelConfig, hidden_dim: int | None = None, draft_vocab: int = 0) -> HeadConfig:
        return cls(dim=cfg.dim, vocab_size=cfg.vocab_size, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                   head_dim=int(cfg.head_dim), hidden_dim=int(hidden_dim or cfg.hidden_dim),
                   rope_theta=cfg.rope_theta, norm_eps=cfg.norm_eps, max_seq_len=cfg.max_seq_len,
                   draft_vocab=draft_vocab)


def target_fingerprint(model: Transformer) -> str:
    """16 hex digits identifying a target: its config and its first 256 embedding rows in bf16
    (shared by fp32, bf16 and int8 copies of one model: quantization keeps the embedding)."""
    cfg = model.config
    digest = hashlib.sha256()
    fields = (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim,
              int(cfg.head_dim), float(cfg.rope_theta))
    digest.update(json.dumps(fields).encode())
    rows = model.embed.weight.detach()[:256].to(torch.bfloat16).contiguous()
    digest.update(rows.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()[:16]


class HeadNet(nn.Module):
    """fc([embed; feature]) -> one decoder layer -> predicted feature (see the module docstring)."""

    def __init__(self, hc: HeadConfig):
        super().__init__()
        self.hc = hc
        self.fc = Linear(2 * hc.dim, hc.dim, bias=True)
        self.block = Block(hc.block_config())
        self.rope_cos, self.rope_sin = rope_cos_sin(hc.block_config(), hc.max_seq_len)

    def rope(self, start: int, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions [start, end) laid out as Block expects (v heads pass through)."""
        hc = self.hc
        seq, rotated = end - start, hc.n_heads + hc.n_kv_heads
        cos = self.rope_cos[start:end, None].to(dtype).expand(seq, rotated, -1)
        sin = self.rope_sin[start:end, None].to(dtype).expand(seq, rotated, -1)
        ones = cos.new_ones(seq, hc.n_kv_heads, cos.shape[-1])
        return torch.cat((cos, ones), dim=1), torch.cat((sin, torch.zeros_like(ones)), dim=1)

    def forward(self, emb: torch.Tensor, feat: torch.Tensor, kv: torch.Tensor, start: int) -> torch.Tensor:
        """``emb``, ``feat``: [B, T, dim] for positions ``start..start+T-1``; ``kv``: the head's
        one-layer cache [2, B, nkv, capacity, hd]. Returns the predicted features [B, T, dim]."""
        bsz, seq, _ = emb.shape
        x = self.fc(torch.cat((emb, feat), dim=-1))
        cos, sin = self.rope(start, start + seq, x.dtype)
        mask = None
        if seq > 1:
            group = self.hc.n_heads // self.hc.n_kv_heads
            query = torch.arange(start, start + seq).repeat(group)
            mask = torch.arange(start + seq)[None, :] <= query[:, None]
        return self.block(x, kv, start, cos, sin, mask)


# -- files ------------------------------------------------------------------------------------

def _corrupt(path: Path, why: str) -> SpecLedgerError:
    return SpecLedgerError(f"head file {path} is corrupt or not a specledger head ({why}); "
                           f"rebuild it with: {TRAIN_COMMAND} --out {path}")


def save_head(path: str | os.PathLike, net: HeadNet, draft_vocab: torch.Tensor | None, fingerprint: str,
              figures: dict | None = None) -> Path:
    """Write ``net`` (bf16), the draft-vocabulary ids and metadata atomically to ``path``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in net.state_dict().items()}
    tensors["draft_vocab"] = (draft_vocab if draft_vocab is not None else torch.zeros(0)).to(torch.int32).contiguous()
    hc = net.hc
    meta = {"format": HEAD_FORMAT, "target_dim": str(hc.dim), "target_vocab": str(hc.vocab_size),
            "target_fingerprint": fingerprint, "config": json.dumps(asdict(hc)),
            "figures": json.dumps(figures or {})}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)
    return path


@dataclass
class HeadFile:
    net: HeadNet
    draft_vocab: torch.Tensor | None  # int64 ids, or None for the full vocabulary
    fingerprint: str
    figures: dict
    path: Path


def load_head(path: str | os.PathLike, target: Transformer | None = None) -> HeadFile:
    """Read a head file; with ``target``, refuse one trained for another target (one-line errors)."""
    from safetensors import safe_open

    path = Path(path).expanduser()
    if not path.is_file():
        raise SpecLedgerError(f"head file {path} not found; build it with: {TRAIN_COMMAND} --out {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for a bad header or truncation
        raise _corrupt(path, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    if meta.get("format") != HEAD_FORMAT:
        raise _corrupt(path, f"format {meta.get('format')!r}, expected {HEAD_FORMAT!r}")
    try:
        hc = HeadConfig(**json.loads(meta["config"]))
        figures = json.loads(meta.get("figures") or "{}")
    except (KeyError, TypeError, ValueError) as exc:
        raise _corrupt(path, f"bad metadata: {exc}") from None
    if target is not None:
        cfg = target.config
        if hc.dim != cfg.dim or hc.vocab_size != cfg.vocab_size:
            raise SpecLedgerError(
                f"head file {path} was trained for a target with hidden size {hc.dim} and vocabulary "
                f"{hc.vocab_size}, but this target has hidden size {cfg.dim} and vocabulary {cfg.vocab_size}; "
                f"train a head for it with: {TRAIN_COMMAND}"
            )
        if (hc.n_heads, hc.n_kv_heads, hc.head_dim) != (cfg.n_heads, cfg.n_kv_heads, int(cfg.head_dim)):
            raise SpecLedgerError(f"head file {path} has attention heads of another target; "
                                  f"train a head for this one with: {TRAIN_COMMAND}")
        fp = target_fingerprint(target)
        if meta.get("target_fingerprint") != fp:
            raise SpecLedgerError(
                f"head file {path} was trained for another target (fingerprint {meta.get('target_fingerprint')}, "
                f"this target's is {fp}); train a head for it with: {TRAIN_COMMAND}"
            )
    vocab_ids = tensors.pop("draft_vocab", None)
    if vocab_ids is None:
        raise _corrupt(path, "no draft_vocab tensor")
    with torch.device("meta"):
        net = HeadNet(hc)
    net = net.to_empty(device="cpu")
    net.rope_cos, net.rope_sin = rope_cos_sin(hc.block_config(), hc.max_seq_len)
    try:
        net.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True, assign=True)
    except (RuntimeError, KeyError) as exc:
        raise _corrupt(path, str(exc).splitlines()[0]) from None
    ids = vocab_ids.long()
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= hc.vocab_size or len(ids) != hc.draft_vocab):
        raise _corrupt(path, "draft vocabulary ids out of range")
    net.eval().requires_grad_(False)
    return HeadFile(net, ids if len(ids) else None, str(meta.get("target_fingerprint")), figures, path)


def head_cache_path(fingerprint: str, cache_dir: str | None = None) -> Path:
    """Where ``train-head`` writes a target's head by default: ``<cache root>/heads/<fingerprint>.safetensors``."""
    from specledger.engine.loader import cache_root

    return cache_root(cache_dir) / "heads" / f"{fingerprint}{HEAD_SUFFIX}"


def find_head(target: Transformer, cache_dir: str | None = None) -> Path:
    """The head file for ``target``: the one ``train-head`` cached (a retrain wins), else the one shipped
    with the package; else a one-line error naming the command that builds it."""
    fp = target_fingerprint(target)
    for candidate in (head_cache_path(fp, cache_dir), PACKAGED_HEADS / f"{fp}{HEAD_SUFFIX}"):
        if candidate.is_file():
            return candidate
    raise SpecLedgerError(
        f"no trained head for this target (fingerprint {fp}); build one with: {TRAIN_COMMAND} "
        f"(writes {head_cache_path(fp, cache_dir)}), or pass a head file with --draft FILE{HEAD_SUFFIX}"
    )


def _lm_head_rows(target: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of the target's LM head as a float tensor (dequantized if the head is int8)."""
    head = target.lm_head
    weight = head.weight
    if weight.dtype == torch.int8:  # engine/int8.py: weight * per-row scale
        return weight[ids].float() * head.scales[ids].float()[:, None]
    return weight.detach()[ids].clone()


# -- the drafter --------------------------------------------------------------------------------

class HeadDrafter(Drafter):
    """EAGLE-style chain drafter; see the module docstring. Per-request state: target features
    for committed positions, the head's one-layer cache and the tokens it holds."""

    spec = catalog.HEAD
    name = spec.name
    uses_model = spec.needs_network
    wants_hidden = True

    def __init__(self, target: Transformer, head: HeadFile, topk: int = 4, full_vocab: bool = False) -> None:
        """``full_vocab``: draft over the target's whole vocabulary (its full LM head) even when the file
        carries a reduced draft vocabulary -- the same trained layer, every token proposable, a head step
        as dear as the target's LM head (what the reduced vocabulary buys, measured both ways)."""
        self.target = target
        self.head = head
        dtype = target.dtype
        self.net = head.net.to(dtype) if head.net.fc.weight.dtype != dtype else head.net
        self.vocab_ids = None if full_vocab else head.draft_vocab
        if self.vocab_ids is None:
            self.lm_head = target.lm_head
        else:
            self.lm_head = Linear(target.config.dim, len(self.vocab_ids), bias=False)
            self.lm_head.weight = nn.Parameter(_lm_head_rows(target, self.vocab_ids).to(dtype), requires_grad=False)
        self.topk = topk
        self.step_topk: list[tuple[list[int], list[float]]] = []
        self._reset()

    @classmethod
    def from_engine(cls, engine: TargetEngine, options: DrafterOptions) -> HeadDrafter:
        """``options.draft_path`` if it is a head file (ends in :data:`HEAD_SUFFIX`), else :func:`find_head`'s."""
        path = options.draft_path if options.draft_path and str(options.draft_path).endswith(HEAD_SUFFIX) else None
        return make_head_drafter(engine.model, path)

    # -- per-request state ----------------------------------------------------------------------
    def _reset(self) -> None:
        self.cache: KVCache | None = None
        self.feats: torch.Tensor | None = None  # [capacity, dim] target features by position
        self.n_feat = 0  # features valid for positions [0, n_feat)
        self._observed = 0  # end of the rows the last observe_hidden wrote
        self.cached: list[int] = []  # tokens whose head-cache entries rest on true features

    def reserve(self, needed: int) -> None:
        """Grow the feature buffer and head cache to hold at least ``needed`` positions (capacity
        doubles, at least 256, capped at the head's ``max_seq_len`` unless ``needed`` is larger); a
        regrown cache empties ``cached``, so the next catch-up rebuilds it from the features."""
        cap = self.cache.capacity if self.cache is not None else 0
        if needed <= cap:
            return
        new_cap = min(max(needed, 2 * cap, 256), max(needed, self.net.hc.max_seq_len))
        dim, dtype = self.net.hc.dim, self.target.dtype
        feats = torch.zeros(new_cap, dim, dtype=dtype)
        if self.feats is not None:
            feats[: self.n_feat] = self.feats[: self.n_feat]
        self.feats = feats
        self.cache = KVCache(self.net.hc.block_config(), new_cap, 1, dtype)
        self.cached = []  # the head cache is rebuilt from the features on the next propose

    def fork(self) -> HeadDrafter:
        clone = copy.copy(self)
        clone.step_topk = []
        clone._reset()
        return clone

    def kv_bytes(self) -> int:
        """The head's cache and the stored target features, as allocated."""
        if self.cache is None:
            return 0
        return self.cache.nbytes() + self.feats.numel() * self.feats.element_size()

    # -- hooks --------------------------------------------------------------------------------
    @torch.inference_mode()
    def observe_hidden(self, start_pos: int, hidden: Any) -> None:
        end = start_pos + len(hidden)
        if start_pos > self.n_feat:  # a gap: positions [n_feat, start_pos) were never observed
            self._observed = self.n_feat
            return
        self.reserve(end + 1)
        self.feats[start_pos:end] = hidden.to(self.feats.dtype)
        self._observed = end
        self.n_feat = start_pos  # rows from here on are new; commit (or begin) says which stand

    def begin(self, prompt: list[int], params: SamplingParams) -> None:
        """Features of the prompt arrived with observe_hidden (the prefill); the head cache is
        filled lazily by the first propose."""
        self.cached = []
        self.n_feat = min(self._observed, len(prompt))
        self.step_topk = []

    def commit(self, context: list[int]) -> None:
        """Features stand for committed inputs only: positions [0, len(context) - 1)."""
        self.n_feat = min(self._observed, len(context) - 1)
        n = common_prefix_len(self.cached, context)
        del self.cached[n:]

    def end(self, prompt: list[int], output: list[int]) -> None:
        """Forget the request (the next one starts with its own prefill's features)."""
        self.n_feat = self._observed = 0
        self.cached = []

    # -- one head step at a time (for chains here, and for a tree proposer) --------------------
    def _logits(self, feature: torch.Tensor) -> torch.Tensor:
        """Float32 logits over the draft vocabulary (``vocab_ids``; the full one if None) for one feature."""
        return self.lm_head(feature[None, None])[0, 0].float()

    def token_id(self, index: int) -> int:
        """The target token id of draft-vocabulary entry ``index``."""
        return index if self.vocab_ids is None else int(self.vocab_ids[index])

    def full_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits scattered into a full-vocabulary row (-inf outside the draft vocabulary)."""
        if self.vocab_ids is None:
            return draft_logits
        full = torch.full((self.net.hc.vocab_size,), float("-inf"))
        full[self.vocab_ids] = draft_logits
        return full

    def _run(self, tokens: list[int], feats: torch.Tensor, start: int) -> torch.Tensor:
        emb = self.target.embed(torch.tensor([tokens]))
        return self.net(emb, feats[None].to(emb.dtype), self.cache.kv[0], start)[0]

    def catch_up(self, context: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Feed the head every committed position its cache lacks (true features); returns the
        predicted feature for the next position and its draft-vocabulary logits, or None when the
        target's features for the context are missing (e.g. a replay without a target)."""
        n = len(context)
        if self.feats is None or self.n_feat < n - 1:
            return None
        self.reserve(n + 1)
        m = common_prefix_len(self.cached, context)
        m = min(m, n - 1)  # feed at least the last token to get its output
        prev = torch.zeros(n - m, self.net.hc.dim, dtype=self.feats.dtype)
        lo = max(m - 1, 0)
        prev[(1 if m == 0 else 0):] = self.feats[lo : n - 1]
        out = self._run(context[m:], prev, m)
        self.cached[m:] = context[m:]
        return out[-1], self._logits(out[-1])

    def step(self, token: int, feature: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One speculative head step: ``token`` at ``position`` with the predicted ``feature`` of
        ``position - 1``; returns (feature, draft-vocabulary logits) for ``position + 1``. Writes a
        speculative cache entry that the next catch_up overwrites."""
        self.reserve(position + 2)
        out = self._run([token], feature[None], position)
        return out[-1], self._logits(out[-1])

    def _record_topk(self, logits: torch.Tensor) -> None:
        """Top-k of the head's (untempered) draft distribution at this step, as target ids."""
        probs = torch.softmax(logits, dim=-1)
        top = torch.topk(probs, min(self.topk, probs.shape[-1]))
        ids = top.indices if self.vocab_ids is None else self.vocab_ids[top.indices]
        self.step_topk.append((ids.tolist(), top.values.tolist()))

    @torch.inference_mode()
    def propose(self, context: list[int], gamma: int, params: SamplingParams, rng: Any) -> Proposal:
        self.step_topk = []
        if gamma <= 0:
            return Proposal()
        first = self.catch_up(context)
        if first is None:
            return Proposal()
        feature, logits = first
        tokens: list[int] = []
        qs = []
        for i in range(gamma):
            if self.topk:
                self._record_topk(logits)
            if params.greedy:
                tok = self.token_id(int(logits.argmax()))
            else:
                q = probs_from_logits(self.full_logits(logits), params)
                tok = int(torch.multinomial(q, 1, generator=rng))
                qs.append(q)
            tokens.append(tok)
            if i < gamma - 1:
                feature, logits = self.step(tok, feature, len(context) + i)
        return Proposal(tokens, torch.stack(qs) if qs else None)

    #: tree proposals: children per node, and (under sampling) draw them without replacement from q (True)
    #: or take the top-k deterministically (False, one-hot q), as :class:`NeuralDrafter`'s
    tree_topk: int = 4
    tree_draws: bool = True

    @torch.inference_mode()
    def propose_tree(self, context: list[int], budget: int, max_depth: int, params: SamplingParams,
                     rng: Any) -> DraftTree:
        """EAGLE-2 top-k tree from the head's distribution (:mod:`specledger.engine.drafters.head_tree`)."""
        from specledger.engine.drafters.head_tree import head_tree_pass, to_target_ids
        from specledger.engine.tree import grow_tree

        self.step_topk = []
        start = head_tree_pass(self, context, budget) if budget > 0 and max_depth > 0 else None
        if start is None:
            return DraftTree()
        return to_target_ids(self, grow_tree(start[0], start[1], budget, max_depth, params, rng,
                                             topk=self.tree_topk, draws=self.tree_draws))

    @torch.inference_mode()
    def propose_shaped(self, context: list[int], shape: Any, params: SamplingParams, rng: Any) -> DraftTree:
        """The DP's static ``shape`` filled with the head's top-k per node (one head pass per level)."""
        from specledger.engine.drafters.head_tree import head_tree_pass, to_target_ids
        from specledger.engine.tree_shape import fill_shape
        from specledger.ledger.trees import count_nodes

        self.step_topk = []
        start = head_tree_pass(self, context, count_nodes(shape)) if shape else None
        if start is None:
            return DraftTree()
        return to_target_ids(self, fill_shape(start[0], start[1], shape, params, rng, draws=self.tree_draws))


def make_head_drafter(target: Transformer, path: str | os.PathLike | None = None, cache_dir: str | None = None,
                      full_vocab: bool = False) -> HeadDrafter:
    """The ``head`` drafter for ``target`` from ``path`` (default: :func:`find_head`); ``full_vocab`` as
    :class:`HeadDrafter`."""
    head = load_head(path if path is not None else find_head(target, cache_dir), target)
    return HeadDrafter(target, head, full_vocab=full_vocab)
