"""The run directory: its file names, the one JSON writer, and the trace reader / appender.

Every verb that writes or reads a run directory (``run``, ``sweep``, ``probe``,
``import-vllm-bench``, ``generate --trace``, ``report``) goes through this module, so the files
have one name each and one format:

* ``traces.jsonl`` -- one :class:`~specledger.records.RequestRecord` per line, appended and
  fsync'ed per request (:func:`append_records`), so an interruption loses at most the request in
  flight. A torn last line (the write the interruption cut) is skipped with a warning by
  :func:`read_records` and removed by :func:`repair_tail` before anything is appended again.
* every ``*.json`` -- strict JSON (NaN/inf -> null, numpy scalars -> Python numbers,
  :func:`json_safe`), written to a temp file in the same folder, fsync'ed and ``os.replace``'d
  (:func:`write_json_atomic`), so a reader sees the old file or the new one, never half of one.

Warnings (a skipped or removed line) are :class:`specledger.errors.SpecLedgerWarning`; the CLI prints
each as one ``warning: ...`` line.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from specledger.errors import SpecLedgerError, SpecLedgerWarning
from specledger.records import RequestRecord

TRACE_NAME = "traces.jsonl"
META_NAME = "run.json"
SURFACE_KEY = "cost_surface"  # run.json: the verify cost surface measured at the run's start (specledger.cost)
SUMMARY_NAME = "summary.json"
HTML_NAME = "report.html"
QUANT_JSON = "quantization.json"
POLICIES_JSON = "policies.json"
SERVING_JSON = "serving.json"
SIMULATE_JSON = "simulate.json"
PROBE_JSON = "probe.json"
VLLM_BENCH_JSON = "vllm_bench.json"
GUIDELLM_JSON = "guidellm.json"
#: side-experiment result files, by the key the summary files them under
EXPERIMENT_FILES = {"quantization": QUANT_JSON, "policies": POLICIES_JSON, "serving": SERVING_JSON,
                    "simulate": SIMULATE_JSON}
#: endpoint figures (``specledger probe`` / ``import-vllm-bench``): a folder with one of these is a run
ENDPOINT_FILES = (PROBE_JSON, VLLM_BENCH_JSON, GUIDELLM_JSON)
#: ``RequestRecord.extra`` key naming the side experiment (``specledger sweep``) a record belongs to;
#: the main analysis leaves such records out
EXPERIMENT_KEY = "experiment"

_RECORD_ERRORS = (json.JSONDecodeError, UnicodeDecodeError, TypeError, KeyError, AttributeError, ValueError)


# ----------------------------------------------------------------------------- JSON files


def json_safe(obj: object) -> object:
    """``obj`` as strict-JSON data: NaN/inf -> None, numpy scalars -> Python numbers, tuples -> lists,
    dict keys -> str (recursively). Anything else is returned as it is."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else None
    return obj


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` via a temp file in the same folder, fsync and ``os.replace``;
    the folder is created if needed. The file is world-readable (0644): a report is meant to be shared."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """``obj`` as strict JSON (:func:`json_safe`; an object JSON has no type for is written as its
    ``str``), indented, UTF-8, newline-terminated, written atomically (:func:`write_text_atomic`)."""
    text = json.dumps(json_safe(obj), indent=2, ensure_ascii=False, allow_nan=False, default=str)
    write_text_atomic(path, text + "\n")


def read_json(path: str | os.PathLike, fix: str = "fix or delete it") -> Any:
    """The JSON value in ``path``; a file that is not UTF-8 JSON is a one-line SpecLedgerError ending in ``fix``."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecLedgerError(f"{path} is not UTF-8 text; {fix}") from None
    except json.JSONDecodeError as exc:
        raise SpecLedgerError(f"{path} is not valid JSON ({exc}); {fix}") from None


# ----------------------------------------------------------------------------- traces


def _parse_line(raw: bytes) -> RequestRecord:
    return RequestRecord.from_dict(json.loads(raw.decode("utf-8")))


def _why(exc: Exception) -> str:
    return "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else f"{type(exc).__name__}: {exc}"


def read_records(path: str | os.PathLike) -> Iterator[RequestRecord]:
    """The records of a trace file, in order; blank lines are passed over.

    A malformed *last* line is the write an interruption cut: it is skipped with a
    :class:`SpecLedgerWarning` naming the line (``run --resume`` removes it, :func:`repair_tail`).
    A malformed line anywhere else (bad JSON, not UTF-8, not a record) is a one-line
    SpecLedgerError naming the file, the line and the fix.
    """
    p = Path(path)
    if not p.is_file():
        raise SpecLedgerError(f"trace file not found: {p}")
    with open(p, "rb") as f:
        lines = iter(f)
        current = next(lines, None)
        number = 1
        while current is not None:
            following = next(lines, None)
            if current.strip():
                try:
                    record = _parse_line(current)
                except _RECORD_ERRORS as exc:
                    if following is None:
                        warnings.warn(
                            f"{p}:{number}: skipped the torn last line ({len(current)} bytes, {_why(exc)}): an "
                            "interrupted write; `specledger run --resume` removes it and re-runs that request",
                            SpecLedgerWarning, stacklevel=2,
                        )
                        return
                    raise SpecLedgerError(
                        f"{p}:{number}: malformed trace record ({_why(exc)}); delete that line or re-run"
                    ) from None
                yield record
            current, number = following, number + 1


def repair_tail(path: str | os.PathLike) -> int:
    """Truncate ``path`` after its last complete record; returns the bytes removed (0: nothing to do).

    Removed: an unterminated last line (a write an interruption cut) and any malformed lines after
    the last line that parses as a record, so the next :func:`append_records` starts on a fresh line.
    The caller says so when the result is not 0. A missing file is left missing.
    """
    p = Path(path)
    if not p.is_file():
        return 0
    data = p.read_bytes()
    end = len(data)
    keep = end
    while keep > 0:
        start = data.rfind(b"\n", 0, keep - 1) + 1  # start of the line that ends at ``keep``
        line = data[start:keep]
        if line.endswith(b"\n") and (not line.strip() or _is_record(line)):
            if line.strip():
                break  # the last complete record: keep through it
            keep = start  # a blank line after the last record: drop it with the rest
            continue
        keep = start
    if keep < end:
        os.truncate(p, keep)
    return end - keep


def _is_record(line: bytes) -> bool:
    try:
        _parse_line(line)
    except _RECORD_ERRORS:
        return False
    return True


def append_records(path: str | os.PathLike, records: Iterable[RequestRecord]) -> None:
    """Append one JSON line per record and flush+fsync, so a crash loses at most the request in flight.

    Never appends onto an unterminated line: a torn tail is removed first (:func:`repair_tail`) and a
    :class:`SpecLedgerWarning` says how many bytes went.
    """
    p = Path(path)
    if p.is_file() and p.stat().st_size:
        with open(p, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
        if torn and (removed := repair_tail(p)):
            warnings.warn(f"{p}: removed a torn last line ({removed} bytes) before appending", SpecLedgerWarning,
                          stacklevel=2)
    with open(p, "a", encoding="utf-8") as f:
        for r in records:
            f.write(r.to_json() + "\n")
        f.flush()
        os.fsync(f.fileno())


__all__ = [
    "EXPERIMENT_FILES", "EXPERIMENT_KEY", "ENDPOINT_FILES", "GUIDELLM_JSON", "HTML_NAME", "META_NAME", "POLICIES_JSON", "PROBE_JSON",
    "QUANT_JSON", "SERVING_JSON", "SIMULATE_JSON", "SUMMARY_NAME", "TRACE_NAME", "VLLM_BENCH_JSON",
    "append_records", "json_safe", "read_json", "read_records", "repair_tail", "write_json_atomic",
    "write_text_atomic",
]
