"""The ``specledger`` command line: one app, one verb per concern.

Every command lives in this package, one module per verb (``cli/run.py``, ``cli/probe.py`` ...), and is thin:
parse the options, call the library, print. Heavy imports (torch) stay inside the function bodies, so
``specledger --help`` and the analysis verbs start fast and run without the ``engine`` extra.
"""

from __future__ import annotations

import os
import sys
import warnings

# OpenMP threads that wait at a barrier spin for a while before they sleep (GNU libgomp: GOMP_SPINCOUNT, 300,000
# by default). The native kernels meet at a few barriers per layer; when another process or the server's own event
# loop takes one of the two cores, the spinning thread holds the core its partner needs, and a decode step went from
# 8 ms to 24-34 ms beside a one-core busy loop (17 ms at 1,000; 12 ms on one thread), while on a quiet machine
# 1,000 spins cost nothing measurable (8.2 vs 8.4 ms; docs/measurements.md). libgomp reads it once, when torch
# loads it, which no verb has done yet here; a value the user set is kept.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
from typing import NoReturn

import typer

from specledger.cli.interrupt import EXIT_INTERRUPTED, clear_resume, interrupt_line
from specledger.errors import SpecLedgerError, SpecLedgerWarning

app = typer.Typer(
    name="specledger",
    help="Does speculative decoding pay on this workload, why, and with which settings?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Does speculative decoding pay on this workload, why, and with which settings?"""


def _register() -> None:
    from specledger.cli.cost import cost
    from specledger.cli.generate import generate
    from specledger.cli.ledger import ledger
    from specledger.cli.predict import calibrate, predict
    from specledger.cli.probe import import_file, import_vllm_bench, inspect, probe
    from specledger.cli.report import report
    from specledger.cli.run import run
    from specledger.cli.serve import serve
    from specledger.cli.simulate import simulate
    from specledger.cli.sweep import sweep
    from specledger.cli.train_head import train_head

    app.command("run")(run)
    app.command("sweep")(sweep)
    app.command("ledger")(ledger)
    app.command("generate")(generate)
    app.command("probe")(probe)
    app.command("import-vllm-bench")(import_vllm_bench)
    app.command("import")(import_file)
    app.command("inspect")(inspect)
    app.command("report")(report)
    app.command("calibrate")(calibrate)
    app.command("cost")(cost)
    app.command("predict")(predict)
    app.command("serve")(serve)
    app.command("simulate")(simulate)
    app.command("train-head")(train_head)


_register()


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """``warnings.showwarning`` for the CLI: a SpecLedgerWarning is one ``warning: ...`` line on stderr."""
    if issubclass(category, SpecLedgerWarning):
        print(f"warning: {message}", file=sys.stderr if file is None else file)
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


_default_show_warning = warnings.showwarning

#: what the ``engine`` extra installs: a command that needs one of them without it is a one-line error
ENGINE_MODULES = ("torch", "transformers", "tokenizers", "safetensors")


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; user errors become one line on stderr and exit code 2, warnings
    (:class:`SpecLedgerWarning`) one ``warning: ...`` line each, Ctrl-C (however typer reports it) the verb's
    ``interrupted; ...`` line and exit code 130 (:mod:`specledger.cli.interrupt`); a verb's non-zero exit code
    is the process's."""
    warnings.showwarning = _show_warning
    args = list(sys.argv[1:] if argv is None else argv)
    clear_resume()
    try:
        code = app(args=args, standalone_mode=False)
    except SpecLedgerError as exc:
        from specledger.probe.safe_text import visible  # messages may quote a file or a server: no raw ESC

        print(f"error: {visible(exc)}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ENGINE_MODULES:
            raise
        print(f"error: this command runs the local engine, which needs {exc.name}: pip install 'specledger[engine]' "
              "(scripts/setup.sh installs it)", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        _interrupted(args)
    except typer.Exit as exc:
        if exc.exit_code == EXIT_INTERRUPTED:
            _interrupted(args)
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        raise SystemExit(1) from None
    except SystemExit:
        raise
    except typer.TyperException as exc:  # usage errors (typer ships its own click)
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(getattr(exc, "exit_code", 2)) from None
    if code == EXIT_INTERRUPTED:  # typer turns a KeyboardInterrupt into Exit(130) and, not standalone, returns it
        _interrupted(args)
    if isinstance(code, int) and code != 0:
        raise SystemExit(code)


def _interrupted(args: list[str]) -> NoReturn:
    """Ctrl-C on any verb: the verb's own ``interrupted; ...`` line on stderr, exit code 130."""
    print(interrupt_line(args), file=sys.stderr)
    raise SystemExit(EXIT_INTERRUPTED) from None


if __name__ == "__main__":
    main()
