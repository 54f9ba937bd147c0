"""One descriptor per drafter, the one home of what the rest of specledger knows about it (torch-free).

A :class:`DrafterSpec` holds a drafter's name, whether it runs a network, its memory rank for the verdict's tie
rule, its method in each serving engine whose config specledger writes (or why that engine has none), its one-line
help and where its class lives (imported only when a drafter is built, so the gates, the probe and the CLI read
this module without torch). Each drafter class points back at its entry (``spec = catalog.NGRAM``).

Adding a drafter: its own module with a :class:`~specledger.engine.drafters.base.Drafter` subclass (its
``from_engine`` builds it from an engine and :class:`~specledger.engine.drafters.base.DrafterOptions`) and one
entry here, in :data:`CATALOG`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from typing import TYPE_CHECKING

from specledger.errors import SpecLedgerError
from specledger.records import PLAIN_DRAFTER

if TYPE_CHECKING:
    from specledger.engine.drafters.base import Drafter


@dataclass(frozen=True)
class EngineMethod:
    """How one serving engine runs a drafter: its own name for the method, or what the engine lacks. Neither
    set: the engine has nothing for it and no reason to state (the plain baseline; an unknown label)."""

    #: vLLM ``method``, SGLang ``--speculative-algorithm``, llama.cpp ``--spec-type``, TensorRT-LLM ``decoding_type``
    method: str | None = None
    #: the name for an EAGLE-3 checkpoint where it differs from ``method`` (the head); None: ``method``
    eagle3_method: str | None = None
    #: what the drafter is, as a config's note names what the engine lacks ("" where it has it)
    lacking: str = ""

    def name_for(self, eagle3: bool = False) -> str | None:
        """The method's name for this checkpoint (``eagle3``: an EAGLE-3 one); None where the engine lacks it."""
        return self.eagle3_method if eagle3 and self.eagle3_method else self.method


@dataclass(frozen=True)
class ServingMethods:
    """A drafter's method in each engine :mod:`specledger.gates.engine_configs` writes a config for (its keys)."""

    vllm: EngineMethod = field(default_factory=EngineMethod)
    sglang: EngineMethod = field(default_factory=EngineMethod)
    llama_cpp: EngineMethod = field(default_factory=EngineMethod)
    trtllm: EngineMethod = field(default_factory=EngineMethod)

    def of(self, engine: str) -> EngineMethod:
        """The method for an engine key (``vllm``, ``sglang``, ``llama_cpp``, ``trtllm``)."""
        return getattr(self, engine)


def _lacked_by_all(why: str) -> ServingMethods:
    """Serving methods of a drafter no engine runs; ``why`` says what it is."""
    lack = EngineMethod(lacking=why)
    return ServingMethods(vllm=lack, sglang=lack, llama_cpp=lack, trtllm=lack)


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter as specledger knows it, without building it."""

    #: the name ``--drafter`` takes and records carry
    name: str
    #: one line for ``--help`` and the docs
    help: str
    #: it runs a network (its q is a real distribution; it costs weights and a KV cache)
    needs_network: bool
    #: the verdict's tie rule, "cheaper in memory, then smaller γ": lower ranks hold less state; None: plain
    memory_rank: int | None
    #: where its class lives, ``"module:ClassName"`` (imported by :meth:`drafter_class` only)
    class_path: str
    #: its method in each serving engine, or why that engine has none
    serving: ServingMethods = field(default_factory=ServingMethods)

    def drafter_class(self) -> type[Drafter]:
        """The drafter's class, imported now (a network drafter's module imports torch)."""
        module, _, attr = self.class_path.partition(":")
        return getattr(import_module(module), attr)

    @property
    def is_plain(self) -> bool:
        """Plain decoding: the baseline every drafter is compared with, not a drafter."""
        return self.name == PLAIN_DRAFTER


_PKG = "specledger.engine.drafters"
_LAYERSKIP_WHY = "layer-skip (early-exit) self-drafting"
_QUANT_SELF_WHY = "the target's own int8 copy as the draft (specledger's in-process quantisation)"
_SUFFIX_TREE_WHY = "suffix-tree drafting"

PLAIN = DrafterSpec(
    PLAIN_DRAFTER, "plain decoding: no drafter, every round commits the target's one token",
    needs_network=False, memory_rank=None, class_path=f"{_PKG}.base:NoDrafter")
NGRAM = DrafterSpec(
    "ngram", "prompt lookup: propose what followed the last earlier occurrence of the context's tail",
    needs_network=False, memory_rank=0, class_path=f"{_PKG}.ngram:NgramDrafter",
    serving=ServingMethods(vllm=EngineMethod("ngram"), sglang=EngineMethod("NGRAM"),
                           llama_cpp=EngineMethod("ngram-simple"), trtllm=EngineMethod("NGram")))
SUFFIX = DrafterSpec(
    "suffix", "SuffixDecoding: suffix tries over this request and earlier outputs",
    needs_network=False, memory_rank=1, class_path=f"{_PKG}.suffix:SuffixDrafter",
    serving=ServingMethods(vllm=EngineMethod("suffix"), sglang=EngineMethod(lacking=_SUFFIX_TREE_WHY),
                           llama_cpp=EngineMethod(lacking=_SUFFIX_TREE_WHY),
                           trtllm=EngineMethod(lacking="Arctic-style suffix trees")))
LAYERSKIP = DrafterSpec(
    "layerskip", "self-speculation through a subset of the target's own layers (early exit)",
    needs_network=True, memory_rank=2, class_path=f"{_PKG}.layerskip:LayerSkipDrafter",
    serving=_lacked_by_all(_LAYERSKIP_WHY))
HEAD = DrafterSpec(
    "head", "a learned EAGLE-style draft head on the target's own features",
    needs_network=True, memory_rank=3, class_path=f"{_PKG}.head:HeadDrafter",
    serving=ServingMethods(vllm=EngineMethod("eagle", "eagle3"), sglang=EngineMethod("EAGLE", "EAGLE3"),
                           llama_cpp=EngineMethod("draft-eagle3"), trtllm=EngineMethod("Eagle3")))
QUANT_SELF = DrafterSpec(
    "quant-self", "the target itself with weight-only int8 weights as the draft",
    needs_network=True, memory_rank=4, class_path=f"{_PKG}.quant_self:QuantSelfDrafter",
    serving=_lacked_by_all(_QUANT_SELF_WHY))
MODEL = DrafterSpec(
    "model", "a separate, smaller draft model with the target's tokenizer (--draft PATH)",
    needs_network=True, memory_rank=5, class_path=f"{_PKG}.draft_model:DraftModelDrafter",
    serving=ServingMethods(vllm=EngineMethod("draft_model"), sglang=EngineMethod("STANDALONE"),
                           llama_cpp=EngineMethod("draft-simple"), trtllm=EngineMethod("DraftTarget")))

#: every entry, plain first, in the order ``--help`` lists them
CATALOG: tuple[DrafterSpec, ...] = (PLAIN, NGRAM, SUFFIX, LAYERSKIP, QUANT_SELF, MODEL, HEAD)
_BY_NAME = {spec.name: spec for spec in CATALOG}


def names() -> tuple[str, ...]:
    """Every name ``--drafter`` takes, plain (``none``) first."""
    return tuple(_BY_NAME)


def drafter_names() -> tuple[str, ...]:
    """The drafters proper: every name but plain's."""
    return tuple(spec.name for spec in CATALOG if not spec.is_plain)


def model_free_names() -> tuple[str, ...]:
    """The drafters that run no network (cheap to build, no engine needed), in catalog order."""
    return tuple(spec.name for spec in CATALOG if not spec.is_plain and not spec.needs_network)


def find(name: str | None) -> DrafterSpec | None:
    """The entry named ``name``, or None (a probe label, an unknown name)."""
    return _BY_NAME.get(name) if name is not None else None


def by_name(name: str) -> DrafterSpec:
    """The entry named ``name``; an unknown name is a one-line error listing the choices."""
    spec = find(name)
    if spec is None:
        raise SpecLedgerError(f"unknown drafter {name!r}; choose one of: {', '.join(names())}")
    return spec


def check_drafter(name: str, where: str = "") -> DrafterSpec:
    """The drafter proper named ``name`` (not plain); else a one-line error naming the option (``where``)."""
    spec = find(name)
    if spec is None or spec.is_plain:
        raise SpecLedgerError(f"unknown drafter {name!r}{where}; choose from {', '.join(drafter_names())}")
    return spec


def is_plain(name: str | None) -> bool:
    """``name`` is plain decoding's (an empty or missing drafter is plain too)."""
    return (name or PLAIN.name) == PLAIN.name


def choices_help(sep: str = " | ", plain: bool = True) -> str:
    """The names for a ``--help`` string: ``none | ngram | ...`` (``plain`` False: the drafters only)."""
    return sep.join(names() if plain else drafter_names())


def memory_ranks() -> dict[str, int]:
    """``{drafter: memory rank}``, cheapest first (the verdict's tie rule; plain has none)."""
    ranks = {spec.name: spec.memory_rank for spec in CATALOG if spec.memory_rank is not None}
    return dict(sorted(ranks.items(), key=lambda item: item[1]))
