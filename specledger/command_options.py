"""The options the measuring commands share, declared once: each command's options dataclass
(:class:`specledger.mainjob.options.RunOptions`, :class:`specledger.bench.sweep_run.SweepOptions`,
:class:`specledger.simulate.run_command.SimulateOptions`) extends one of these with its own. Keyword-only, so a
command's own fields (a required one included) keep their order in front of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(kw_only=True)
class CommandOptions:
    """What every measuring command takes: where it writes and its seed."""

    out: Path | None = None  # the directory (or file) written; None: the command's default
    seed: int = 0  # the sampling (and arrival) seed


@dataclass(kw_only=True)
class TargetOptions(CommandOptions):
    """What a command that loads a target model and reads prompts takes (``run``, ``sweep``)."""

    workload: Path | None = None  # a JSONL of the user's prompts; None: the built-in categories
    target: str | None = None  # the target model (name or path); None: the bundled one
    dtype: str = "auto"
    layers: str | None = None  # the layerskip drafter's layers, as given; None: calibrated
    draft: str | None = None  # the draft model's path (the draft-model drafter)
