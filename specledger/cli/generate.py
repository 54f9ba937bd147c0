"""``specledger generate``: one prompt, streamed, then its round ledger vs plain decoding
(:func:`specledger.mainjob.generate.run_generate`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from specledger.engine.choices import DTYPE_HELP
from specledger.engine.drafters.catalog import HEAD, MODEL, NGRAM, choices_help

_TARGET_HELP = "GGUF file or HF model dir (default: bundled SmolLM2-135M)."
_DRAFT_HELP = f"Draft model path for --drafter {MODEL.name}; a .safetensors head file for {HEAD.name}."
_DEVICE_HELP = "cpu, or cuda[:N] on a machine with an NVIDIA GPU (dtype auto = bfloat16 there)."


def _print_ledger(led: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from specledger.mainjob.generate import ledger_rows

    t = Table(title=f"round ledger: drafter={led['drafter']} gamma={led['gamma']}", show_header=False)
    for k, v in ledger_rows(led):
        t.add_row(k, v)
    Console(stderr=False).print(t)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def generate(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="The user message (or raw text with --raw).")],
    drafter: Annotated[str, typer.Option(
        help=choices_help())] = NGRAM.name,
    gamma: Annotated[int, typer.Option(help="Candidates per round (0 = plain decoding); a tree's depth limit.")] = 4,
    tree_budget: Annotated[int, typer.Option(help="Token-tree nodes per round (0 = a chain of gamma).")] = 0,
    tree_shape: Annotated[str, typer.Option(help="Tree rounds propose: dynamic (EAGLE-2 best-first) | dp (the DP's "
                                                 "static shape) | dp:0.6,0.2 | dp:RUN_DIR (measured acceptance).")]
    = "dynamic",
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (1 = off).")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Top-k filter (0 = off).")] = 0,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    stop: Annotated[list[str] | None, typer.Option(help="Stop string (repeatable).")] = None,
    target: Annotated[str | None, typer.Option(help=_TARGET_HELP)] = None,
    draft: Annotated[str | None, typer.Option(help=_DRAFT_HELP)] = None,
    layers: Annotated[str | None, typer.Option(
        help="layerskip layers, e.g. 12 or 0-7,26-29 (default: calibrate).")] = None,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "auto",
    device: Annotated[str, typer.Option(help=_DEVICE_HELP)] = "cpu",
    raw: Annotated[bool, typer.Option("--raw", help="Encode the prompt as raw text, no chat template.")] = False,
    compare: Annotated[bool, typer.Option(help="Also decode plainly to measure the speed-up.")] = True,
    repeats: Annotated[int, typer.Option(help="Warm, interleaved plain/speculative pairs for the speed-up.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming.")] = False,
    trace: Annotated[Path | None, typer.Option(help="Append the request records to this JSONL file.")] = None,
) -> None:
    """Generate for one prompt with speculative decoding, stream the text, then print the round ledger."""
    from specledger.mainjob.generate import GenerateOptions, run_generate

    options = GenerateOptions(prompt=prompt, drafter=drafter, gamma=gamma, tree_budget=tree_budget,
                              tree_shape=tree_shape, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                              top_k=top_k, seed=seed, stop=stop, target=target, draft=draft, layers=layers,
                              dtype=dtype, device=device, raw=raw, compare=compare, repeats=repeats, trace=trace)
    options.check()  # before the (slow) model load
    record, led = run_generate(options, on_text=None if as_json else _write)
    if as_json:
        from dataclasses import asdict

        print(json.dumps({"text": record.text, "tokens": record.token_ids,
                          "rounds": [asdict(r) for r in record.rounds], "ledger": led}, default=str))
    else:
        _print_ledger(led)
