"""The ``specledger`` command line: one app, one verb per concern.

Each verb's implementation lives in its own package (``ledger/cli.py``, ``mainjob/cli.py`` ...; ``generate.py``)
and keeps heavy imports (torch) inside the function body, so ``specledger --help`` and
``specledger ledger`` start fast.
"""

from __future__ import annotations

import sys
import warnings

import typer

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
    from specledger.bench.sweep_cli import sweep
    from specledger.cost.cli import cost
    from specledger.engine.head_cli import train_head
    from specledger.generate import generate
    from specledger.ledger.cli import ledger
    from specledger.mainjob.cli import run
    from specledger.predict.cli import calibrate, predict
    from specledger.probe.cli import import_file, import_vllm_bench, inspect, probe
    from specledger.report.cli import report
    from specledger.serve.cli import serve
    from specledger.simulate.cli import simulate

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


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; user errors become one line on stderr and exit code 2, warnings
    (:class:`SpecLedgerWarning`) one ``warning: ...`` line each."""
    warnings.showwarning = _show_warning
    try:
        app(args=argv, standalone_mode=False)
    except SpecLedgerError as exc:
        from specledger.probe.safe_text import visible  # messages may quote a file or a server: no raw ESC

        print(f"error: {visible(exc)}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except KeyboardInterrupt:
        print("interrupted: traces written so far are kept", file=sys.stderr)
        raise SystemExit(130) from None
    except typer.Exit as exc:
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


if __name__ == "__main__":
    main()
