"""The progress bar of the measuring verbs (``specledger run``, ``specledger sweep``): one rich bar of
requests whose description is the job in flight, driven through a ``progress(done, total, label)`` callback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def live_progress(console: Any, width: int, remaining: bool = False) -> Iterator[Callable[[int, int, str], None]]:
    """A bar on ``console`` for the block's duration; yields the callback (labels cut and padded to ``width``
    characters). ``remaining``: a time-remaining column too."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               *((TimeRemainingColumn(),) if remaining else ()))
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("requests", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label[:width].ljust(width))

        yield progress
