"""What Ctrl-C says, per verb: one ``interrupted; ...`` line naming what was kept and how to continue.

The entry point (:func:`specledger.cli.main`) turns a KeyboardInterrupt -- raised by the verb, or turned into
``typer.Exit(130)`` by typer -- into exit code 130 and :func:`interrupt_line`. A verb that learns where its
work goes only once it runs (``run`` picks ``runs/<timestamp>``) tells this module with :func:`note_resume`;
everything else is read from the command line itself, so the line never depends on how far the verb got.
"""

from __future__ import annotations

from collections.abc import Sequence

EXIT_INTERRUPTED = 130

_resume: list[str] = []  # the continue-with command a running verb noted (last wins)


def note_resume(command: str) -> None:
    """Record the command that continues the running verb (e.g. ``specledger run --resume runs/X``)."""
    _resume.append(command)


def clear_resume() -> None:
    """Forget any noted command (a fresh invocation starts with none)."""
    _resume.clear()


def _option(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``argv`` (the last one), else None."""
    found = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(name + "="):
            found = arg[len(name) + 1:]
    return found


def _verb(argv: Sequence[str]) -> str:
    """The first argument that is not an option (the verb), or ''."""
    return next((a for a in argv if not a.startswith("-")), "")


def interrupt_line(argv: Sequence[str]) -> str:
    """The one line Ctrl-C prints for the command ``argv`` (without the program name). Invariant: it starts
    with ``interrupted;``, says what was kept, and, where the verb can continue, the command that does."""
    verb = _verb(argv)
    noted = _resume[-1] if _resume else None
    if verb == "run":
        where = _option(argv, "--resume") or _option(argv, "--out")
        command = noted or (f"specledger run --resume {where}" if where else None)
        if command:
            return f"interrupted; every finished request is kept; continue with: {command}"
        return "interrupted; every finished request is kept in the run folder printed above; continue with: " \
               "specledger run --resume <that folder>"
    if verb == "probe":
        out = _option(argv, "--out")
        if _option(argv, "--launch") and out:
            return f"interrupted; finished configurations are kept in {out}; continue with the same command"
        return "interrupted; the probe writes its results when it ends, so nothing was kept; run the same " \
               "command again"
    if verb == "serve":
        return "interrupted; the server stopped (requests in flight were ended); start it again to serve"
    if verb == "sweep":
        out = _option(argv, "--out")
        where = f" in {out}" if out else " in the sweep folder"
        return f"interrupted; traces written so far are kept{where}; sweep does not resume: run the same command " \
               "again to measure it all"
    return "interrupted; work finished so far is kept; run the same command again to continue"
