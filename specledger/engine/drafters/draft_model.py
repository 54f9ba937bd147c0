"""``model``: a separate, smaller draft model that shares the target's tokenizer.

A draft whose vocabulary differs from the target's would propose ids that mean other
strings; it is refused with a one-line error. Its KV cache rolls back with the target's
(see :class:`NeuralDrafter`), and the bonus token is fed to it at the next round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specledger.engine.drafters import catalog
from specledger.engine.drafters.neural import NeuralDrafter
from specledger.errors import SpecLedgerError

if TYPE_CHECKING:
    from specledger.engine.drafters.base import DrafterOptions
    from specledger.engine.model import Transformer
    from specledger.engine.protocol import TargetEngine


def check_same_vocabulary(target_tokenizer: Any, draft_tokenizer: Any, target_vocab: int, draft_vocab: int) -> None:
    """Raise unless both tokenizers map the same strings to the same ids (and the logits cover them)."""
    if target_tokenizer is not None and draft_tokenizer is not None:
        if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise SpecLedgerError(
                "the draft model's tokenizer differs from the target's; pick a draft from the same model family"
            )
    elif target_vocab != draft_vocab:
        raise SpecLedgerError(
            f"the draft model's vocabulary ({draft_vocab}) differs from the target's ({target_vocab}); "
            "pick a draft from the same model family"
        )


class DraftModelDrafter(NeuralDrafter):
    spec = catalog.MODEL

    def __init__(self, draft_model: Transformer, target_tokenizer: Any = None, draft_tokenizer: Any = None,
                 target_vocab: int | None = None) -> None:
        check_same_vocabulary(
            target_tokenizer, draft_tokenizer, target_vocab or draft_model.config.vocab_size,
            draft_model.config.vocab_size,
        )
        super().__init__(draft_model, layers=None, name=self.spec.name)

    @classmethod
    def from_engine(cls, engine: TargetEngine, options: DrafterOptions) -> DraftModelDrafter:
        """The draft model at ``options.draft_path``, loaded on ``engine``'s device (a one-line error without one)."""
        if not options.draft_path:
            raise SpecLedgerError(f"the {cls.spec.name!r} drafter needs --draft PATH "
                                  "(a GGUF file or Hugging Face directory)")
        from specledger.engine.loader import load_model

        device = getattr(engine, "device", None)
        draft = load_model(options.draft_path, device=device if device is not None and device.type != "cpu" else None)
        return cls(draft.model, engine.tokenizer, draft.tokenizer, engine.model.config.vocab_size)
