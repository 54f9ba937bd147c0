"""``model``: a separate, smaller draft model that shares the target's tokenizer.

A draft whose vocabulary differs from the target's would propose ids that mean other
strings; it is refused with a one-line error. Its KV cache rolls back with the target's
(see :class:`NeuralDrafter`), and the bonus token is fed to it at the next round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specledger.engine.drafters.neural import NeuralDrafter
from specledger.errors import SpecLedgerError

if TYPE_CHECKING:
    from specledger.engine.model import Transformer


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
    def __init__(self, draft_model: Transformer, target_tokenizer: Any = None, draft_tokenizer: Any = None,
                 target_vocab: int | None = None) -> None:
        check_same_vocabulary(
            target_tokenizer, draft_tokenizer, target_vocab or draft_model.config.vocab_size,
            draft_model.config.vocab_size,
        )
        super().__init__(draft_model, layers=None, name="model")
