"""The ``head`` drafter's token trees: EAGLE-2 top-k expansion from the head's own distribution.

A tree round from committed context c_0..c_{n-1} (n tokens): the head catches up on the committed
positions with the target's true features (:meth:`HeadDrafter.catch_up`, exactly as a chain round
starts), which gives the predicted feature f^_{n-1} and the root's draft distribution. Tree node i (its
token t_i at position n - 1 + depth(i)) is then one head step on (embed(t_i), f^ of its parent) -- the
root's children take f^_{n-1} -- whose output is node i's predicted feature and the distribution its
children are drawn from. Every wave of new nodes is one head pass: the nodes' k/v go to the head cache's
slots n + i, each row attending over the committed context [0, n) and its own ancestors (a tree mask),
at its own RoPE position. Those slots are speculative, as a chain's head steps are: the next round's
catch-up rewrites positions n.. from the target's true features of what was accepted (the verify pass
hands the accepted path's hidden states over, compacted like its k/v).

Which nodes: :func:`specledger.engine.tree.grow_tree` (the ``budget`` nodes of highest path probability,
top-k per node, one head pass per wave) or, with a static shape, :func:`specledger.engine.tree_shape.fill_shape`.
Both work in the draft vocabulary (the reduced one when the head has it): the proposal's tokens are mapped
to target ids and its q rows (under sampling, the distributions the children were drawn from) scattered
into full-vocabulary rows with zeros outside the draft vocabulary -- the q the verifier's recursive
rejection needs, so sampled trees stay exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from specledger.engine.tree import DraftTree, draft_rows

if TYPE_CHECKING:
    from specledger.engine.model import Transformer


class TreeHead(Protocol):
    """What a tree pass needs of a head drafter (:class:`specledger.engine.drafters.head.HeadDrafter`
    satisfies it): its net (``hc``, ``fc``, ``block``, RoPE tables), the target (``embed``), the head's
    k/v cache, the draft-vocabulary map and lm head, and the capacity / catch-up / id-mapping calls."""

    net: Any
    target: Transformer
    cache: Any
    vocab_ids: torch.Tensor | None
    lm_head: Any

    def reserve(self, needed: int) -> None: ...

    def catch_up(self, context: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None: ...

    def token_id(self, index: int) -> int: ...


def head_forward_tree(drafter: TreeHead, tokens: list[int], feats: torch.Tensor, positions: list[int],
                      write_start: int, mask: torch.Tensor) -> torch.Tensor:
    """One head pass over tree rows: ``tokens`` (target ids) with their input features ``feats`` [T, dim]
    at RoPE ``positions``, k/v written at slots ``write_start ..``, attending where ``mask`` [T, write_start
    + T] allows. Returns the rows' predicted features [T, dim]."""
    net = drafter.net
    hc = net.hc
    emb = drafter.target.embed(torch.tensor([tokens]))
    x = net.fc(torch.cat((emb, feats[None].to(emb.dtype)), dim=-1))
    pos = torch.tensor(positions, dtype=torch.long)
    seq, rotated = len(positions), hc.n_heads + hc.n_kv_heads
    cos = net.rope_cos[pos][:, None].to(x.dtype).expand(seq, rotated, -1)
    sin = net.rope_sin[pos][:, None].to(x.dtype).expand(seq, rotated, -1)
    ones = cos.new_ones(seq, hc.n_kv_heads, cos.shape[-1])
    cos, sin = torch.cat((cos, ones), dim=1), torch.cat((sin, torch.zeros_like(ones)), dim=1)
    group = hc.n_heads // hc.n_kv_heads
    out = net.block.forward_masked(x, drafter.cache.kv[0], write_start, write_start + seq, cos, sin,
                                   mask.repeat(group, 1))
    return out[0]


def head_tree_pass(drafter: TreeHead, context: list[int], budget: int) -> tuple[torch.Tensor, Any] | None:
    """Catch up on ``context``; (the root's draft-vocabulary logits, an ``expand`` over tree nodes whose
    tokens are draft-vocabulary indices), or None without the target's features for the context."""
    n = len(context)
    drafter.reserve(n + budget + 2)
    first = drafter.catch_up(context)
    if first is None:
        return None
    root_feature, root_logits = first
    feats: list[torch.Tensor] = []  # predicted feature of every written node
    depth: list[int] = []
    written = 0

    def expand(nodes: list[int], tokens: list[int], parents: list[int]) -> torch.Tensor:
        nonlocal written
        hi = max(nodes) + 1
        rows, mask = draft_rows(parents, depth, written, hi, n)
        inputs = torch.stack([root_feature if parents[i] < 0 else feats[parents[i]] for i in rows])
        out = head_forward_tree(drafter, [drafter.token_id(tokens[i]) for i in rows], inputs,
                                [n - 1 + depth[i] for i in rows], n + written, mask)
        feats.extend(out)
        written = hi
        return drafter.lm_head(out[None])[0].float()[[i - rows[0] for i in nodes]]

    return root_logits, expand


def to_target_ids(drafter: TreeHead, tree: DraftTree) -> DraftTree:
    """A tree grown over draft-vocabulary indices, in target ids (q rows scattered to the full vocabulary)."""
    if drafter.vocab_ids is None or not len(tree):
        return tree
    q = None
    if tree.q is not None:
        q = tree.q.new_zeros(tree.q.shape[0], drafter.net.hc.vocab_size)
        q[:, drafter.vocab_ids] = tree.q
    return DraftTree([drafter.token_id(t) for t in tree.tokens], list(tree.parents), q)
