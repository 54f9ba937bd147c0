"""Import a ``vllm bench serve --save-result`` JSON file, or a JSON Lines file of several runs.

Field names follow vLLM's ``vllm/benchmarks/serve.py`` (``benchmark()`` builds the result
dict; ``process_one_metric`` adds ``mean_/median_/std_/p{P}_{ttft,tpot,itl,e2el}_ms``):

* ``spec_decode_acceptance_rate`` is a **percentage** (100 * accepted / draft_tokens),
* ``spec_decode_acceptance_length`` = 1 + accepted / drafts (bonus token counted),
* ``spec_decode_per_position_acceptance_rates[i]`` = accepted_per_pos[i] / drafts
  (unconditional Pr(K >= i+1)); all computed from /metrics deltas, hence server-wide,
* vLLM's ITL is per streamed chunk (chunk-level), TPOT = (latency - ttft) / (output_len - 1).

Older scripts (``benchmarks/benchmark_serving.py``, vLLM <= 0.9) write goodput under the key
``"request_goodput:"`` (with a colon); it is read as ``request_goodput``. With ``--append-result``
(or several runs saved to one file) the file is JSON Lines, one result per line
(:func:`parse_vllm_bench_records`). Unknown fields are kept (``model_extra``); every known field is
optional; a wrong type raises SpecLedgerError naming the field (and the line of a JSON Lines file). A file
(or a line) must hold at least one of :data:`RESULT_KEYS`: any other JSON object -- a ``traces.jsonl``
record, a config -- is refused as "not a vllm bench result", not shown as a table of dashes.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from specledger.errors import SpecLedgerError
from specledger.ledger.acceptance import conditional_ratios
from specledger.ledger.server_acceptance import per_position_mismatch
from specledger.probe.documents import EndpointSummary, LatencyFigures, SpecDecodeDoc
from specledger.probe.spec_figures import SERVER_WIDE_WARNING

OLD_GOODPUT_KEY = "request_goodput:"
#: every ``vllm bench serve`` result has these (vLLM's ``benchmark()`` writes both); a file with neither is not one
RESULT_KEYS = ("completed", "request_throughput")
NO_SPEC_NOTE = (
    "not in this file: no spec_decode_* fields (the server ran without speculative decoding, or vLLM "
    "could not read its /metrics)"
)
MAX_COUNT = 2**63
_PERCENTILE_KEY = re.compile(r"^p(\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
_INT_FIELDS = (
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "num_prompts",
    "max_concurrency",
    "max_concurrent_requests",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
)


class VllmBenchResult(BaseModel):
    """A ``vllm bench serve`` result; times in ms unless named ``duration`` (s)."""

    model_config = ConfigDict(strict=True, extra="allow")

    date: str | None = None
    backend: str | None = None
    label: str | None = None
    model_id: str | None = None
    tokenizer_id: str | None = None
    num_prompts: int | None = None
    request_rate: float | str | None = None  # vLLM writes "inf" for an unbounded rate
    burstiness: float | None = None
    max_concurrency: int | None = None

    duration: float | None = None
    completed: int | None = None
    failed: int | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: float | None = None
    request_goodput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    max_output_tokens_per_s: float | None = None
    max_concurrent_requests: int | None = None

    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    std_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None

    spec_decode_acceptance_rate: float | None = None  # percent
    spec_decode_acceptance_length: float | None = None
    spec_decode_num_drafts: int | None = None
    spec_decode_draft_tokens: int | None = None
    spec_decode_accepted_tokens: int | None = None
    spec_decode_per_position_acceptance_rates: list[float] | None = None

    input_lens: list[int] | None = None
    output_lens: list[int] | None = None
    ttfts: list[float | None] | None = None
    itls: list[list[float]] | None = None
    errors: list[str | None] | None = None

    @field_validator(*_INT_FIELDS, mode="before")
    @classmethod
    def _integral_floats_are_ints(cls, value: Any) -> Any:
        """2.0 -> 2 (Python's json writes some counts as floats); a count past ±2**63 is refused (no
        benchmark counts that many, and it would overflow every float figure built from it)."""
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_COUNT:
            raise ValueError(f"a count past ±2**63 ({value.bit_length()}-bit integer)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _old_goodput_key(cls, data: Any) -> Any:
        """benchmark_serving.py wrote ``"request_goodput:"``; the declared field wins when both are set."""
        if isinstance(data, dict) and OLD_GOODPUT_KEY in data:
            data = dict(data)
            old = data.pop(OLD_GOODPUT_KEY)
            if data.get("request_goodput") is None:
                data["request_goodput"] = old
        return data

    @model_validator(mode="after")
    def _extra_latency_fields_are_numbers(self) -> VllmBenchResult:
        for key, value in (self.model_extra or {}).items():
            if _PERCENTILE_KEY.match(key) and (
                value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)))
            ):
                raise ValueError(f"field '{key}' must be a number of milliseconds, got {_describe(value)}")
        return self

    def percentiles(self, metric: str) -> dict[float, float]:
        """All ``p{P}_{metric}_ms`` values in the file (declared or extra), keyed by P."""
        values = {**self.__dict__, **(self.model_extra or {})}
        out: dict[float, float] = {}
        for key, value in values.items():
            match = _PERCENTILE_KEY.match(key)
            if match and match.group(2) == metric and isinstance(value, (int, float)):
                out[float(match.group(1))] = float(value)
        return dict(sorted(out.items()))

    def summary(self) -> EndpointSummary:
        """The same keys as a probe summary where vLLM measured the same thing (ms, tok/s)."""

        def latency(metric: str) -> LatencyFigures:
            pct = self.percentiles(metric)
            return {
                "mean": getattr(self, f"mean_{metric}_ms"),
                "p50": getattr(self, f"median_{metric}_ms"),
                "p95": pct.get(95.0),
                "p99": pct.get(99.0),
            }

        rates = self.spec_decode_per_position_acceptance_rates or []
        spec: SpecDecodeDoc | None = None
        if self.spec_decode_acceptance_length is not None or self.spec_decode_num_drafts is not None:
            rate = self.spec_decode_acceptance_rate
            drafts = self.spec_decode_num_drafts
            mismatch = per_position_mismatch(
                self.spec_decode_acceptance_length, rates, 0.5 / drafts if drafts else 1e-3
            )
            spec = {
                "source": "vllm bench serve",
                "num_drafts": self.spec_decode_num_drafts,
                "num_draft_tokens": self.spec_decode_draft_tokens,
                "num_accepted_tokens": self.spec_decode_accepted_tokens,
                "mean_acceptance_length": self.spec_decode_acceptance_length,
                "draft_acceptance_rate": None if rate is None else rate / 100.0,
                "per_position_rates": rates,
                "conditional_rates": conditional_ratios(rates),
                "warnings": [
                    SERVER_WIDE_WARNING,
                    "vLLM's acceptance rate is stored in percent; shown as a fraction",
                    *([mismatch] if mismatch else []),
                ],
            }
        return {
            "source": "vllm bench serve",
            "requests_ok": self.completed,
            "requests_failed": self.failed,
            "wall_time_s": self.duration,
            "output_throughput_tok_s": self.output_throughput,
            "request_throughput_req_s": self.request_throughput,
            "request_goodput_req_s": self.request_goodput,
            "total_output_tokens": self.total_output_tokens,
            "ttft_ms": latency("ttft"),
            "tpot_ms": latency("tpot"),
            "chunk_itl_ms": latency("itl"),
            "e2el_ms": latency("e2el"),
            "spec_decode": spec,
            "spec_decode_note": None if spec else NO_SPEC_NOTE,
        }


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def parse_vllm_bench(obj: Any, source: str = "vllm bench result") -> VllmBenchResult:
    """Validate a decoded JSON object; SpecLedgerError names the first bad field."""
    if not isinstance(obj, dict):
        raise SpecLedgerError(f"{source}: top level must be a JSON object, got {type(obj).__name__}")
    try:
        return VllmBenchResult.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "<root>"
        if not first["loc"] and "field '" in first["msg"]:
            raise SpecLedgerError(f"{source}: {first['msg'].removeprefix('Value error, ')}") from None
        raise SpecLedgerError(
            f"{source}: field '{field}' is invalid ({first['msg']}; got {_describe(first.get('input'))}); "
            "pass the file written by `vllm bench serve --save-result`"
        ) from None


def load_vllm_bench_records(path: str | Path) -> list[VllmBenchResult]:
    """Every result of a file (one for JSON, one per line for JSON Lines); unreadable -> SpecLedgerError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecLedgerError(f"cannot read vllm bench result {path}: {exc}") from None
    return parse_vllm_bench_records(text, source=str(path))


def load_vllm_bench(path: str | Path) -> VllmBenchResult:
    """The single result of a file; a JSON Lines file of several runs -> SpecLedgerError naming --record."""
    records = load_vllm_bench_records(path)
    if len(records) > 1:
        raise SpecLedgerError(
            f"{path} holds {len(records)} results (JSON Lines); choose one with --record N (1-based)"
        )
    return records[0]


def check_result_keys(obj: Any, source: str) -> None:
    """Refuse a JSON object that has none of :data:`RESULT_KEYS` (one line, naming what it looks like)."""
    if isinstance(obj, dict) and not any(key in obj for key in RESULT_KEYS):
        looks = (" (it is a specledger trace record: `specledger report` reads the run folder)"
                 if {"request_id", "token_times"} <= obj.keys() else "")
        raise SpecLedgerError(f"{source}: not a vllm bench result: no `completed` or `request_throughput` key"
                              f"{looks}")


def parse_vllm_bench_text(text: str, source: str = "vllm bench result") -> VllmBenchResult:
    """Decode JSON text (NaN/Infinity allowed, as Python's json writes them), check it is a result
    (:func:`check_result_keys`) and validate it."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise SpecLedgerError(
            f"{source} is not JSON ({reason}); pass a `vllm bench serve --save-result` file (JSON, or JSON Lines "
            "with one result per line)"
        ) from None
    check_result_keys(obj, source)
    return parse_vllm_bench(obj, source=source)


def parse_vllm_bench_records(text: str, source: str = "vllm bench result") -> list[VllmBenchResult]:
    """One result (a JSON document) or several (JSON Lines: one object per non-blank line, as
    ``--append-result`` writes); the error of a bad line names it."""
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        if len(lines) < 2 or not _is_json_object(lines[0][1]):
            return [parse_vllm_bench_text(text, source)]  # not JSON Lines either: the document's error
        return [parse_vllm_bench_text(line, f"{source} line {n}") for n, line in lines]
    check_result_keys(obj, source)
    return [parse_vllm_bench(obj, source=source)]


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def records_of(results: list[VllmBenchResult], record: int | None) -> list[tuple[int, VllmBenchResult]]:
    """(1-based index, result) of every result, or of result ``record`` only."""
    if record is None:
        return list(enumerate(results, start=1))
    if not 1 <= record <= len(results):
        raise SpecLedgerError(f"--record {record} is out of range: the file holds {len(results)} result(s)")
    return [(record, results[record - 1])]
