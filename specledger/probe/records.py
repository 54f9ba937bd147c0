"""Probe results as run-directory records, so ``specledger report`` reads a probe like a run.

A probe of an endpoint (and of a ``--baseline`` endpoint) becomes one
:class:`~specledger.records.RequestRecord` per successful request in ``traces.jsonl``, with a
``run.json`` next to it (``"kind": "probe"``). The report then groups them like any run:

* the baseline endpoint's records have drafter :data:`BASELINE_DRAFTER` (plain decoding, gamma 0), the probed
  endpoint's records the user's label (default ``"endpoint"``) and a gamma label (the number of
  speculative positions the server's /metrics shows, else ``"server"``);
* ``prompt_id`` is the workload item's id, so both endpoints pair prompt by prompt;
* ``token_times`` repeat each chunk's arrival time (seconds since the request was sent) once per
  token in the chunk, ``chunks`` are the tokens per chunk, ``ttft`` is the first chunk's time and
  ``total_time`` the last chunk's;
* ``rounds`` is empty: outside the engine there is no round ledger (E[L] per request, round times
  and the reconciliation show n/a; the server-wide spec-decode counters live in ``run.json``);
* ``text`` is everything generated: the reasoning (``reasoning_content``) then the answer, as the token
  times count both (``extra["reasoning_chars"]`` says where the answer starts); quality scores the answer;
* ``token_ids`` are the tokenizer's ids of the streamed text when a tokenizer is given; otherwise
  they are empty, ``extra["text_only"]`` is true and the greedy correctness gate compares texts;
* ``extra["engine_spec"]`` is what the engine said of this request's speculation, ``{"drafts",
  "draft_tokens", "accepted", "source"}`` (None where it does not say: llama.cpp's last ``timings`` has no
  rounds), from :func:`specledger.probe.counters.request_counts`; absent when the engine returned nothing.
  :func:`specledger.probe.counters.engine_counters` sums these against the server's counters.

What the probe writes around these records: :mod:`specledger.probe.outputs`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from specledger.engine.drafters.catalog import PLAIN
from specledger.errors import SpecLedgerError
from specledger.probe.counters import request_counts
from specledger.probe.loadgen import RequestResult, Tokenizer
from specledger.records import GammaSpec, RequestRecord

PROBE_KIND = "probe"
BASELINE_DRAFTER = PLAIN.name
ENDPOINT_DRAFTER = "endpoint"
SERVER_GAMMA = "server"


# ----------------------------------------------------------------------------- records


def emission_times(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> tuple[list[float], list[int]]:
    """(token_times, chunks): chunk i's time repeated ``chunk_tokens[i]`` times; empty chunks dropped.

    Invariant: ``sum(chunks) == len(token_times) == sum(chunk_tokens)`` (over positive counts).
    """
    times: list[float] = []
    chunks: list[int] = []
    for t, n in zip(chunk_times, chunk_tokens):
        if n > 0:
            times.extend([float(t)] * int(n))
            chunks.append(int(n))
    return times, chunks


def generated_text(result: RequestResult) -> str:
    """Every generated character of a request: its reasoning (``delta.reasoning_content``), then its answer.
    Invariant: the text the record holds is the text its ``token_times`` count (reasoning chunks are timed
    and counted like the answer, so they are kept like it too)."""
    return result.reasoning_text + result.output_text


def _token_ids(tokenizer: Tokenizer | None, text: str) -> list[int] | None:
    if tokenizer is None:
        return None
    encoded = tokenizer(text)
    if isinstance(encoded, int):
        return None
    return [int(t) for t in encoded]


def _stop_reason(finish_reason: str | None) -> str:
    return {"length": "length", "stop": "stop", "eos": "eos"}.get(finish_reason or "", finish_reason or "unknown")


def record_from_result(
    result: RequestResult,
    *,
    drafter: str,
    gamma: GammaSpec,
    temperature: float,
    model: str,
    endpoint: str,
    category: str,
    top_p: float = 1.0,
    seed: int | None = None,
    tokenizer: Tokenizer | None = None,
    quality: tuple[float | None, str | None] = (None, None),
) -> RequestRecord:
    """One successful probe request as a RequestRecord (see the module docstring for the mapping)."""
    token_times, chunks = emission_times(result.chunk_times, result.chunk_tokens)
    text = generated_text(result)
    ids = _token_ids(tokenizer, text)
    score, score_error = quality
    extra: dict[str, Any] = {
        "source": PROBE_KIND,
        "endpoint": endpoint,
        "request_index": result.index,
        "start_s": result.start_s,
        "token_count_source": result.token_count_source,
        "text_only": ids is None,
    }
    if result.reasoning_text:
        extra["reasoning_chars"] = len(result.reasoning_text)  # text[:reasoning_chars] is the reasoning
    spec = request_counts(result)
    if spec is not None:
        extra["engine_spec"] = spec.to_dict()
    if score is not None:
        extra["quality"] = score
    if score_error:
        extra["quality_error"] = score_error
    pid = result.prompt_id or ""
    return RequestRecord(
        request_id=f"{drafter}|{gamma}|{pid or 'request'}|{result.index}",
        drafter=drafter,
        gamma=gamma,
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=0,
        seed=seed,
        prompt_tokens=0,
        output_tokens=len(token_times),
        text=text,
        token_ids=ids if ids is not None else [],
        stop_reason=_stop_reason(result.finish_reason),
        t_prefill=0.0,
        ttft=token_times[0] if token_times else 0.0,
        total_time=token_times[-1] if token_times else 0.0,
        token_times=token_times,
        chunks=chunks,
        rounds=[],
        category=category,
        prompt_id=pid,
        model=model,
        extra=extra,
    )


def records_from_probe(
    results: Iterable[RequestResult],
    *,
    drafter: str,
    gamma: GammaSpec,
    temperature: float,
    model: str,
    endpoint: str,
    category_of: Callable[[str | None], str],
    score_of: Callable[[str | None, str], tuple[float | None, str | None]] | None = None,
    tokenizer: Tokenizer | None = None,
    top_p: float = 1.0,
    seed: int | None = None,
) -> list[RequestRecord]:
    """One RequestRecord per successful request that streamed at least one token, in request order.

    ``drafter`` :data:`BASELINE_DRAFTER` marks the baseline endpoint (its gamma is recorded as 0).
    """
    out = []
    for r in sorted(results, key=lambda r: r.index):
        if not r.ok or not any(n > 0 for n in r.chunk_tokens):
            continue
        out.append(
            record_from_result(
                r,
                drafter=drafter,
                gamma=0 if drafter == BASELINE_DRAFTER else gamma,
                temperature=temperature,
                model=model,
                endpoint=endpoint,
                category=category_of(r.prompt_id),
                top_p=top_p,
                seed=seed,
                tokenizer=tokenizer,
                quality=score_of(r.prompt_id, r.output_text) if score_of else (None, None),
            )
        )
    return out


def check_label(label: str) -> str:
    """The probed endpoint's drafter label: non-empty, no ``|``, and not the baseline's ``none``."""
    label = label.strip()
    if not label or "|" in label or label == BASELINE_DRAFTER:
        raise SpecLedgerError(f"--label {label!r} is not usable; give a name such as eagle3 "
                              f"(not {BASELINE_DRAFTER!r}, no '|')")
    return label


def gamma_label(spec_decode: Mapping[str, Any] | None, given: str | None = None) -> int | str:
    """The probed endpoint's gamma: ``given`` (an integer string becomes an int), else the number of
    speculative positions its /metrics counted, else ``"server"``."""
    if given:
        return int(given) if given.strip().isdigit() else given.strip()
    rates = (spec_decode or {}).get("per_position_rates") or []
    return len(rates) if rates else SERVER_GAMMA


__all__ = [
    "BASELINE_DRAFTER",
    "ENDPOINT_DRAFTER",
    "check_label",
    "emission_times",
    "gamma_label",
    "record_from_result",
    "records_from_probe",
]
