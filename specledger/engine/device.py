"""Where the engine runs: ``--device cpu | cuda[:N]``, the dtype each device defaults to, the round clock.

- :func:`resolve_device` turns the option into a ``torch.device``; on a machine where torch sees no
  CUDA device, ``cuda`` is a one-line :class:`SpecLedgerError` naming the fix.
- :func:`default_dtype`: ``auto`` is float32 on the CPU (the exact correctness baseline, see
  ``engine/loader.py``) and bfloat16 on a GPU (what GPU serving runs).
- :class:`RoundClock` times a round's phases. On the CPU a mark is ``perf_counter()``. On CUDA a mark
  is a CUDA event recorded on the current stream and nothing waits for it: the host synchronises
  once, on the round's last mark, when the round is split into draft / verify / other. Kernels run
  asynchronously, so host timestamps would charge the verify pass's GPU time to whichever phase
  first waits for a result (the commit); events put each phase's time where its work ran.
"""

from __future__ import annotations

import os
import platform
import time
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from specledger.errors import SpecLedgerError

if TYPE_CHECKING:
    from specledger.engine.kernels import KernelsInfoDict
    from specledger.engine.model import Transformer

CUDA_FIX = ("use --device cpu, or run on a machine with an NVIDIA GPU and a CUDA build of torch "
            "(pip install torch==2.13.0 from PyTorch's CUDA wheel index)")


class MachineInfoDict(TypedDict):
    """The host a run measured on (``run.json`` ``machine``)."""

    platform: str
    processor: str
    cpus: int | None
    torch: str  # torch's version
    torch_threads: int
    kernels: KernelsInfoDict


def machine_info() -> MachineInfoDict:
    """The host a run measured on, for its ``run.json``: platform, processor, CPUs, torch and its threads, and
    whether the native CPU kernels or the torch fallback ran (:func:`specledger.engine.kernels.describe`)."""
    from specledger.engine import kernels

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "kernels": kernels.describe(),
    }


def resolve_device(device: str | torch.device | None = "cpu") -> torch.device:
    """``cpu`` or ``cuda[:N]`` as a torch.device; anything else, or CUDA where torch sees none, is a one-line error."""
    name = "cpu" if device is None else str(device)
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        try:
            dev = torch.device(name)
        except RuntimeError:
            raise SpecLedgerError(f"--device {name!r} is not a device name; use cpu, cuda or cuda:N") from None
        if not torch.cuda.is_available():
            raise SpecLedgerError(f"--device {name}: torch {torch.__version__} sees no CUDA device here; {CUDA_FIX}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise SpecLedgerError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here; "
                                  "use cuda:0 .. cuda:N-1")
        return dev
    raise SpecLedgerError(f"unknown --device {name!r}; use cpu, or cuda[:N] on a machine with an NVIDIA GPU")


def default_dtype(device: str | torch.device | None) -> str:
    """What ``--dtype auto`` means on ``device``: float32 on the CPU, bfloat16 on a GPU."""
    return "float32" if torch.device(device or "cpu").type == "cpu" else "bfloat16"


def model_device(model: Transformer) -> torch.device:
    """The device a model's weights live on (CPU for objects without parameters)."""
    dev = getattr(model, "device", None)
    if isinstance(dev, torch.device):
        return dev
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")


class RoundClock:
    """Marks inside a round, turned into seconds once the round ends (see the module doc)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def mark(self) -> Any:
        """A point in the round: a host time (CPU) or a recorded CUDA event (never waited on here)."""
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def split(self, *marks: Any) -> list[float]:
        """Seconds between consecutive marks; on CUDA this is the round's one wait (on its last mark)."""
        if not self.cuda:
            return [b - a for a, b in zip(marks, marks[1:])]
        marks[-1].synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])]

    def sync(self) -> None:
        """Wait for the device (CUDA) -- e.g. before a host timestamp that must include queued work."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
