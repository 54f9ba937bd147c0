"""The one interface between proposers (drafters) and the decode loop.

A round, as the decode loop runs it::

    proposal = drafter.propose(context, gamma, params, rng)   # timed as t_draft
    ... target verifies context[-1:] + proposal.tokens in one pass ...
    drafter.commit(context_after_round)                       # after acceptance

Invariants every drafter keeps:
- ``propose`` returns at most ``gamma`` tokens (it may return fewer, even none: a model-free
  drafter with no match proposes nothing and the round degenerates to a plain step).
- Under sampling (``params.greedy`` false) ``proposal.q`` is either ``None`` -- the tokens
  are deterministic given the context, i.e. q is one-hot -- or a float tensor
  ``[len(tokens), V]`` holding the distribution each token was *actually sampled from*,
  produced by :func:`specledger.engine.sampling.probs_from_logits` with the same params
  as the target. Under greedy, q is ignored.
- A drafter never changes what the target outputs; it only changes how fast. Any state it
  keeps (KV caches, suffix trees) must be consistent with the *committed* context, which
  ``commit`` hands it after every round (rejected candidates are gone from it).
- ``fork`` gives the drafter of another request decoded *concurrently* (continuous batching):
  same settings, shared read-only parts (weights) and cross-request state, its own
  per-request state, so interleaved rounds of different requests never see each other's context.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specledger.engine.drafters import catalog
from specledger.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from specledger.engine.protocol import TargetEngine
    from specledger.engine.tree import DraftTree


@dataclass(frozen=True)
class DrafterOptions:
    """What building a drafter may take beyond its target engine (each drafter reads the fields it needs)."""

    #: layerskip: the layers to run, e.g. ``"12"`` or ``"0-7,26-29"``; None: calibrate
    layers: str | None = None
    #: model: a GGUF file or Hugging Face directory; head: a head file when it ends in ``.safetensors``
    draft_path: str | None = None
    #: layerskip: the token ids to calibrate on; None: a built-in text
    calibration_tokens: list[int] | None = None


@dataclass(slots=True)
class Proposal:
    tokens: list[int] = field(default_factory=list)
    q: Any = None  # torch.Tensor [len(tokens), V] or None (one-hot / deterministic)


class Drafter:
    """Base class; subclasses override ``propose`` and any of the hooks they need."""

    name: str = "base"
    #: its catalog entry (:mod:`specledger.engine.drafters.catalog`); every drafter of the catalog sets its own
    spec: catalog.DrafterSpec | None = None
    #: True if the drafter runs a neural network (its q is a real distribution).
    uses_model: bool = False
    #: True if the drafter reads the target's final hidden states (a learned head): the decode
    #: loops then ask the target for them and hand them over with :meth:`observe_hidden`.
    wants_hidden: bool = False

    @classmethod
    def from_engine(cls, engine: TargetEngine, options: DrafterOptions) -> Drafter:
        """The drafter for ``engine``'s target (:func:`specledger.engine.drafters.registry.make_drafter`).
        Default: a drafter that needs nothing but itself."""
        return cls()

    def begin(self, prompt: list[int], params: SamplingParams) -> None:
        """A new request starts with ``prompt`` (token ids). Reset per-request state."""

    def propose(self, context: list[int], gamma: int, params: SamplingParams, rng: Any) -> Proposal:
        """Propose up to ``gamma`` tokens to follow ``context`` (prompt + committed output).

        ``rng`` is a ``torch.Generator`` for drafters that sample.
        """
        raise NotImplementedError

    def propose_tree(self, context: list[int], budget: int, max_depth: int, params: SamplingParams,
                     rng: Any) -> DraftTree:
        """Propose a token tree of at most ``budget`` nodes and ``max_depth`` levels (see
        :mod:`specledger.engine.tree`). Default: the chain :meth:`propose` gives (one branch).
        Model drafters expand top-k per node (:func:`specledger.engine.tree.grow_tree`, given an
        ``expand`` that runs the drafter on a wave of tree nodes); model-free ones return several
        continuations with ``q=None``."""
        from specledger.engine.tree import DraftTree

        prop = self.propose(context, min(budget, max_depth), params, rng)
        return DraftTree.chain(prop.tokens, prop.q)

    #: a :class:`specledger.engine.tree_shape.StaticTreeShape` makes tree rounds use the DP's static shape
    #: (:meth:`propose_shaped`) instead of :meth:`propose_tree`'s dynamic one; None: dynamic
    tree_shape: Any = None

    def propose_shaped(self, context: list[int], shape: Any, params: SamplingParams, rng: Any) -> DraftTree:
        """A tree in the fixed ``shape`` (:mod:`specledger.engine.tree_shape`). Default, for model-free
        drafters: :meth:`propose_tree` with room to spare, cut to the shape (its own ranks decide which
        continuations fill each node's places). Model drafters fill the shape with their top-k per node."""
        from specledger.engine.tree_shape import restrict_to_shape, shape_budget_hint
        from specledger.ledger.trees import tree_depth

        tree = self.propose_tree(context, shape_budget_hint(shape), tree_depth(shape), params, rng)
        return restrict_to_shape(tree, shape)

    def commit(self, context: list[int]) -> None:
        """The round is over; ``context`` is prompt + everything committed so far."""

    def observe_hidden(self, start_pos: int, hidden: Any) -> None:
        """Only for ``wants_hidden`` drafters: the target's final hidden states [T, dim] for positions
        ``start_pos .. start_pos+T-1`` of the sequence, from the pass that just ran (the prefill,
        before ``begin``; a verify pass, before ``commit``). Rows past the committed context belong
        to rejected candidates; ``commit`` tells which rows stand."""

    def kv_bytes(self) -> int:
        """Bytes of KV cache this drafter holds for its request now (0 for model-free drafters)."""
        return 0

    def end(self, prompt: list[int], output: list[int]) -> None:
        """The request finished with ``output``. Cross-request state may learn from it."""

    def checkpoint(self) -> Any:
        """The cross-request state as it stands, for :meth:`rewind` (None: this drafter keeps none)."""
        return None

    def rewind(self, checkpoint: Any) -> None:
        """Back to a :meth:`checkpoint`'s cross-request state: a prompt measured again (a disturbed machine,
        :mod:`specledger.mainjob.disturbance`) must not meet its own first answer."""

    def fork(self) -> Drafter:
        """A drafter for another request running at the same time as this one's (see the module
        invariants). Default: a deep copy, right for drafters whose state is all per-request;
        drafters holding weights or cross-request state override it to share them."""
        return copy.deepcopy(self)


class NoDrafter(Drafter):
    """Plain decoding: proposes nothing, so every round commits exactly the target's token."""

    spec = catalog.PLAIN
    name = spec.name

    def propose(self, context: list[int], gamma: int, params: SamplingParams, rng: Any) -> Proposal:
        return Proposal()

    def fork(self) -> Drafter:
        return self  # stateless
