"""The engine as every layer above sees it: a typed protocol in place of ``engine: TargetEngine``.

:class:`specledger.engine.decode.Engine` is the implementation (tests stand in tiny models behind the
same class): one target model, its tokenizer and chat template, a reusable KV cache, decoding one
request at a time with or without a drafter. The verbs, sweeps, the server and the drafter registry
ask no more of it than this; the continuous-batching engine is built over its ``model``
(:class:`specledger.engine.batch.BatchEngine`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from specledger.engine.sampling import SamplingParams
from specledger.records import GammaSpec

if TYPE_CHECKING:
    import torch

    from specledger.engine.drafters.base import Drafter
    from specledger.engine.loader import LoadedModel
    from specledger.engine.model import Transformer
    from specledger.engine.policy import GammaPolicy
    from specledger.engine.request import Emitted, Prefilled, PrefillProgress
    from specledger.records import RequestRecord, RoundRecord


class StreamArgs(TypedDict, total=False):
    """The keyword arguments of :meth:`TargetEngine.stream` after the prompt; an absent key takes its default."""

    drafter: Drafter | None
    gamma: GammaSpec | GammaPolicy
    params: SamplingParams
    max_tokens: int
    stop: Sequence[str]
    request_id: str | None
    ignore_eos: bool
    tree_budget: int  # > 0: each round verifies a token tree of at most this many nodes
    clock: Callable[[], float] | None  # the request's time base, seconds
    prefill_chunk: int  # > 0: prompt positions per prefill pass
    prefilled: Prefilled | None
    chunk_text: bool


class TargetEngine(Protocol):
    """A target model that decodes one request at a time, speculatively or not, every round timed."""

    model: Transformer  # the target; ``model.config`` its shape, ``model.weight_bytes()`` its weights
    tokenizer: Any  # decodes ids to text (None: token ids only)
    loaded: LoadedModel | None  # the loaded checkpoint (chat template, ``encode_prompt``) when built from one
    eos_token_ids: frozenset[int]
    max_context: int  # positions one request may use (prompt + output + a tree's nodes)
    name: str
    dtype: str
    device: torch.device

    def decode_text(self, ids: Sequence[int]) -> str: ...

    def sibling(self) -> TargetEngine:
        """The same target with a KV cache of its own (requests whose streams are open at once)."""
        ...

    def check_prompt(self, prompt_ids: Sequence[int], max_tokens: int) -> None: ...

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
        """``Emitted`` chunks, ``PrefillProgress`` between prefill passes (``prefill_chunk`` > 0) and
        ``RoundRecord`` s as they happen, then the final ``RequestRecord``; ``prefilled``: this prompt's
        prefill, already run (:meth:`prefill`); ``chunk_text``: each chunk carries its text delta."""
        ...

    def prefill(self, prompt_ids: Sequence[int], max_tokens: int, want_hidden: bool = False) -> Prefilled:
        """Run the prompt's prefill once into this engine's cache, timed: what requests of this prompt share
        (``stream(prefilled=)``)."""
        ...

    def generate(self, prompt_ids: Sequence[int], **kwargs: Any) -> RequestRecord:
        """:meth:`stream` to the end: the request record."""
        ...


__all__ = ["StreamArgs", "TargetEngine"]
