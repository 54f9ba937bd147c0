"""``specledger generate``: one prompt, streamed, then its round ledger vs plain decoding.

A verb above the engine: it decodes with :mod:`specledger.engine`, then reads the request's ledger
(:mod:`specledger.analysis.request_ledger`) and the warm, interleaved comparison with plain decoding
(:mod:`specledger.predict.compare`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from specledger.engine.choices import DTYPE_HELP
from specledger.errors import SpecLedgerError


def _print_ledger(led: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False)
    t = Table(title=f"round ledger: drafter={led['drafter']} gamma={led['gamma']}", show_header=False)
    fmt = {
        "E[L]": "{:.3f}", "t_draft_ms": "{:.2f}", "t_verify_ms": "{:.2f}", "t_other_ms": "{:.2f}",
        "t_round_ms": "{:.2f}", "ttft_ms": "{:.1f}", "tokens_per_s": "{:.1f}", "plain_tokens_per_s": "{:.1f}",
        "T0_ms": "{:.2f}", "predicted_speedup": "{:.3f}", "speedup": "{:.3f}",
        "decode_speedup": "{:.3f}", "end_to_end_speedup": "{:.3f}", "spec_tokens_per_s": "{:.1f}",
        "plain_decode_tokens_per_s": "{:.1f}", "plain_decode_GB_per_s": "{:.2f}", "machine_read_GB_per_s": "{:.1f}",
    }
    for k, v in led.items():
        if k in ("drafter", "gamma"):
            continue
        if isinstance(v, float) and k in fmt:
            v = fmt[k].format(v)
        elif k in ("decode_speedups", "end_to_end_speedups"):
            v = ", ".join(f"{x:.3f}" for x in v) or "-"
        elif k == "conditional_acceptance":
            v = ", ".join("-" if a is None else f"{a:.2f}" for a in v) or "-"
        t.add_row(k, str(v))
    console.print(t)


def _bandwidth(engine, plain) -> dict:
    """Plain decode's bandwidth beside this machine's read bandwidth measured now
    (:func:`specledger.engine.bandwidth.plain_decode_bandwidth`); ``plain`` is a plain-decoding record (or, with
    --drafter none, the run itself)."""
    from specledger.engine.bandwidth import plain_decode_bandwidth

    figures = plain_decode_bandwidth(engine.model, [plain], device=engine.device)
    figures.pop("bytes_per_token", None)
    return figures


def _layers_of(d) -> str | None:
    """The layer option that rebuilds a layerskip drafter without calibrating again."""
    layers = getattr(d, "layers", None)
    return ",".join(map(str, layers)) if layers else None


def generate(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="The user message (or raw text with --raw).")],
    drafter: Annotated[str, typer.Option(help="none | ngram | suffix | layerskip | quant-self | model | head")] = "ngram",
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
    target: Annotated[str | None, typer.Option(help="GGUF file or HF model dir (default: bundled SmolLM2-135M).")] = None,
    draft: Annotated[str | None, typer.Option(help="Draft model path for --drafter model; a .safetensors head file for head.")] = None,
    layers: Annotated[str | None, typer.Option(help="layerskip layers, e.g. 12 or 0-7,26-29 (default: calibrate).")] = None,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "auto",
    device: Annotated[str, typer.Option(help="cpu, or cuda[:N] on a machine with an NVIDIA GPU (dtype auto = bfloat16 there).")] = "cpu",
    raw: Annotated[bool, typer.Option("--raw", help="Encode the prompt as raw text, no chat template.")] = False,
    compare: Annotated[bool, typer.Option(help="Also decode plainly to measure the speed-up.")] = True,
    repeats: Annotated[int, typer.Option(help="Warm, interleaved plain/speculative pairs for the speed-up.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming.")] = False,
    trace: Annotated[Path | None, typer.Option(help="Append the request records to this JSONL file.")] = None,
) -> None:
    """Generate for one prompt with speculative decoding, stream the text, then print the round ledger."""
    from specledger.analysis.request_ledger import request_ledger
    from specledger.engine.build import build_engine
    from specledger.engine.decode import Emitted
    from specledger.engine.drafters.registry import make_drafter
    from specledger.engine.sampling import SamplingParams
    from specledger.records import RequestRecord
    from specledger.rundir import append_records

    if gamma < 0:
        raise SpecLedgerError(f"--gamma must be >= 0, got {gamma}")
    if tree_budget < 0:
        raise SpecLedgerError(f"--tree-budget must be >= 1 (0 for chains), got {tree_budget}")
    from specledger.predict.tree_shape_spec import check_tree_shape, tree_shape_from_spec

    check_tree_shape(tree_shape)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    engine = build_engine(target, dtype) if device == "cpu" else build_engine(target, dtype, device)
    ids = engine.loaded.encode_prompt(prompt, chat=not raw)
    tb = tree_budget if drafter != "none" else 0
    shape = tree_shape_from_spec(tree_shape, drafter) if tb else None

    def build(chosen: str | None = layers) -> Any:
        made = make_drafter(drafter, engine, layers=chosen, draft_path=draft)
        made.tree_shape = shape
        return made

    d = build()
    kwargs = dict(max_tokens=max_tokens, params=params, stop=stop or [])
    record = None
    for ev in engine.stream(ids, drafter=d, gamma=gamma if drafter != "none" else 0, tree_budget=tb, **kwargs):
        if isinstance(ev, Emitted) and not as_json:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, RequestRecord):
            record = ev
    if not as_json:
        sys.stdout.write("\n")
    plain, comparison = None, None
    if compare and drafter != "none":  # warm both sides up, then interleave (specledger.predict.compare)
        from specledger.predict.compare import compare_plain_spec

        again = lambda: build(layers or _layers_of(d))  # noqa: E731
        comparison = compare_plain_spec(engine, ids, again, drafter, gamma, kwargs, repeats=repeats, tree_budget=tb)
        record, plain = comparison.spec[-1], comparison.plain[-1]
    if trace is not None:
        append_records(trace, [r for r in (record, plain) if r is not None])
    led = request_ledger(record, plain)
    if shape is not None:
        led["tree_shape"] = shape.describe(tb, gamma)
    if comparison is not None:
        for key in ("speedup", "predicted_speedup"):  # one warm pair's figure; the medians below replace it
            led.pop(key, None)
        led.update(comparison.summary())
    led.update(_bandwidth(engine, plain if plain is not None else record))
    if as_json:
        from dataclasses import asdict

        print(json.dumps({"text": record.text, "tokens": record.token_ids,
                          "rounds": [asdict(r) for r in record.rounds], "ledger": led}, default=str))
    else:
        _print_ledger(led)
