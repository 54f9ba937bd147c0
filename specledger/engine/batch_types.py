"""What the continuous-batching scheduler (:mod:`specledger.engine.batch`) takes and gives: a
:class:`BatchRequest` in; per request, :class:`~specledger.engine.request.Emitted` chunks,
:class:`~specledger.records.RoundRecord` s and one final :class:`~specledger.records.RequestRecord`
or :class:`RequestFailed` (:data:`BatchEvent`); per step, a :class:`StepRecord`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Union

from specledger.engine.request import Emitted
from specledger.engine.sampling import SamplingParams
from specledger.records import RequestRecord, RoundRecord


@dataclass
class BatchRequest:
    prompt: list[int]
    max_tokens: int = 128
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""
    arrival: float = 0.0  # seconds after the run starts (open loop); ignored in closed loop
    category: str = ""
    prompt_id: str = ""
    stop: Sequence[str] = ()  # stop strings (need the engine's tokenizer)
    ignore_eos: bool = False
    tree_budget: int = 0  # nodes per round of a token tree (0: chains); see engine/tree.py


@dataclass
class RequestFailed:
    """A request's last event when it failed: ``error`` says what raised (``Type: message``); the
    request's slot is already free. ``exception`` is the exception itself (for logs), if any."""

    error: str
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, exc: BaseException, where: str = "") -> RequestFailed:
        return cls(f"{where}{type(exc).__name__}: {exc}", exc)


@dataclass
class StepRecord:
    """One scheduler step. t_forward + t_draft + t_other = the step's wall time from drafting to
    the last release (admission and prefills excluded); t_draft and t_other are the sums of its
    round records' (see :mod:`specledger.records`)."""

    batch_size: int
    rows: int  # tokens in the packed forward = sum over requests of (candidates + 1)
    candidates: int
    t_forward: float
    t_draft: float
    t_other: float
    kv_reserved_tokens: int
    context_tokens: int


#: (ticket from :meth:`BatchScheduler.add`, one of that request's events)
BatchEvent = tuple[int, Union[Emitted, RoundRecord, RequestRecord, RequestFailed]]
