"""The engine as every layer above sees it: a typed protocol in place of ``engine: TargetEngine``.

:class:`specledger.engine.decode.Engine` is the implementation (tests stand in tiny models behind the
same class): one target model, its tokenizer and chat template, a reusable KV cache, decoding one
request at a time with or without a drafter. The verbs, sweeps, the server and the drafter registry
ask no more of it than this; the continuous-batching engine is built over its ``model``
(:class:`specledger.engine.batch.BatchEngine`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from specledger.records import GammaSpec

if TYPE_CHECKING:
    import torch

    from specledger.engine.drafters.base import Drafter
    from specledger.engine.loader import LoadedModel
    from specledger.engine.model import Transformer
    from specledger.engine.policy import GammaPolicy
    from specledger.engine.protocol import TargetEngine
    from specledger.engine.request import Emitted
    from specledger.engine.sampling import SamplingParams
    from specledger.records import RequestRecord, RoundRecord


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
        params: SamplingParams = ...,
        max_tokens: int = 128,
        stop: Sequence[str] = (),
        request_id: str | None = None,
        ignore_eos: bool = False,
        tree_budget: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> Iterator[Emitted | RoundRecord | RequestRecord]:
        """``Emitted`` chunks and ``RoundRecord`` s as they happen, then the final ``RequestRecord``."""
        ...

    def generate(self, prompt_ids: Sequence[int], **kwargs: Any) -> RequestRecord:
        """:meth:`stream` to the end: the request record."""
        ...


__all__ = ["TargetEngine"]
