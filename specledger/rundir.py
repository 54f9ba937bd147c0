"""The run directory: its file names, :class:`RunDir` (the one loader and writer of a run's files),
the one JSON writer, and the trace reader / appender.

Every verb that writes or reads a run directory (``run``, ``sweep``, ``probe``,
``import-vllm-bench``, ``generate --trace``, ``report``, ``simulate --from``, ``predict``) goes through
this module, so the files have one name each and one format:

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
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specledger.errors import SpecLedgerError, SpecLedgerWarning
from specledger.records import RequestRecord

TRACE_NAME = "traces.jsonl"
META_NAME = "run.json"
SURFACE_KEY = "cost_surface"  # run.json: the verify cost surface measured at the run's start (specledger.cost)
SUMMARY_NAME = "summary.json"
COST_MODEL_JSON = "cost_model.json"  # the run's cost model, fitted by the report (specledger.cost.costmodel)
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

_RECORD_ERRORS = (json.JSONDecodeError, UnicodeDecodeError, TypeError, KeyError, AttributeError, ValueError,
                  RecursionError)
#: :func:`json_safe` keeps this many levels of nesting; deeper values (a hostile server's 10,000-level object)
#: are replaced by :data:`TOO_DEEP`, so writing never exhausts the stack
MAX_JSON_DEPTH = 64
TOO_DEEP = f"<nested deeper than {MAX_JSON_DEPTH} levels: not kept>"


# ----------------------------------------------------------------------------- JSON files


def json_safe(obj: object, depth: int = MAX_JSON_DEPTH) -> object:
    """``obj`` as strict-JSON data: NaN/inf -> None, numpy scalars -> Python numbers, tuples -> lists,
    dict keys -> str (recursively), a container nested deeper than ``depth`` levels -> :data:`TOO_DEEP`.
    Anything else is returned as it is. Invariant: the result nests at most ``depth`` + 1 levels, so
    ``json.dumps`` of it cannot hit the recursion limit."""
    if isinstance(obj, (dict, list, tuple)):
        if depth <= 0:
            return TOO_DEEP
        if isinstance(obj, dict):
            return {str(k): json_safe(v, depth - 1) for k, v in obj.items()}
        return [json_safe(v, depth - 1) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else None
    return obj


#: :func:`write_text_atomic`'s temp file beside NAME is ``.NAME.<random>`` + this suffix
TEMP_SUFFIX = ".tmp"


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` via a temp file in the same folder, fsync and ``os.replace``;
    the folder is created if needed. The file is world-readable (0644): a report is meant to be shared."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
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


#: files whose containers at this nesting level or deeper are written on one line each: summary.json's
#: rows (each verdict, scenario, schedule; each ``meta`` entry) one per line, a fraction of the indented size
ONE_LINE_BELOW = {SUMMARY_NAME: 2}


def dumps_json(obj: Any, indent: int = 2, one_line_below: int | None = None, _level: int = 0) -> str:
    """Strict JSON text of ``obj`` (already :func:`json_safe`; an object JSON has no type for is written as
    its ``str``), indented by ``indent``, except that an array of scalars, an empty container and (with
    ``one_line_below``) every container at that nesting level or deeper is written on one line. Only the
    whitespace differs from ``json.dumps(obj, indent=indent)``: ``json.loads`` of either is the same value."""
    flat = one_line_below is not None and _level >= one_line_below
    pad, end = " " * indent * (_level + 1), " " * indent * _level
    if isinstance(obj, dict) and obj and not flat:
        body = ",\n".join(f"{pad}{json.dumps(str(k), ensure_ascii=False)}: "
                          f"{dumps_json(v, indent, one_line_below, _level + 1)}" for k, v in obj.items())
        return "{\n" + body + "\n" + end + "}"
    if isinstance(obj, (list, tuple)) and not flat and any(isinstance(v, (dict, list, tuple)) for v in obj):
        body = ",\n".join(pad + dumps_json(v, indent, one_line_below, _level + 1) for v in obj)
        return "[\n" + body + "\n" + end + "]"
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, default=str,
                      separators=(",", ":") if flat else (", ", ": "))


def write_json_atomic(path: str | os.PathLike, obj: Any, one_line_below: int | None = None) -> None:
    """``obj`` as strict JSON (:func:`json_safe`; an object JSON has no type for is written as its
    ``str``), indented with arrays of scalars on one line (:func:`dumps_json`; ``one_line_below``: as
    there), UTF-8, newline-terminated, written atomically (:func:`write_text_atomic`)."""
    write_text_atomic(path, dumps_json(json_safe(obj), one_line_below=one_line_below) + "\n")


def summary_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """``run.json`` as ``summary.json`` repeats it: every key, but each prompt without its ``token_ids`` (it
    keeps its category and ``prompt_tokens``); the ids stay in ``run.json``, where the forecasts read them."""
    out = dict(meta)
    if isinstance(prompts := meta.get("prompts"), Mapping):
        out["prompts"] = {pid: ({k: v for k, v in p.items() if k != "token_ids"} if isinstance(p, Mapping) else p)
                          for pid, p in prompts.items()}
    return out


def read_json(path: str | os.PathLike, fix: str = "fix or delete it") -> Any:
    """The JSON value in ``path``; a file that is not UTF-8 JSON (bad syntax, an integer over Python's
    4300-digit limit, nesting past the recursion limit) is a one-line SpecLedgerError ending in ``fix``."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecLedgerError(f"{path} is not UTF-8 text; {fix}") from None
    except json.JSONDecodeError as exc:
        raise SpecLedgerError(f"{path} is not valid JSON ({exc}); {fix}") from None
    except RecursionError:
        raise SpecLedgerError(f"{path} is not readable JSON (nested too deeply); {fix}") from None
    except ValueError as exc:  # int(str) past sys.get_int_max_str_digits()
        raise SpecLedgerError(f"{path} is not readable JSON ({str(exc).split(';')[0]}); {fix}") from None


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


# ----------------------------------------------------------------------------- the folder


#: endpoint figures by the key the summary files them under
ENDPOINT_KEYS = {PROBE_JSON: "probe", VLLM_BENCH_JSON: "vllm_bench", GUIDELLM_JSON: "guidellm"}


class RunDir:
    """One run directory, the only API to its files: the records, ``run.json``, the side experiments'
    and endpoints' JSON files; every write atomic (JSON) or appended and fsync'ed (traces).

    Readers that a verb needs in order to go on (:meth:`records`, :meth:`meta`) raise one-line
    :class:`SpecLedgerError` s naming the folder and the fix; the others (:meth:`records_so_far`,
    :meth:`experiments`) take a missing file as nothing measured yet.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def trace_path(self) -> Path:
        return self.path / TRACE_NAME

    @property
    def meta_path(self) -> Path:
        return self.path / META_NAME

    def file(self, name: str) -> Path:
        """The path of ``name`` (one of this module's file names) in the folder."""
        return self.path / name

    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    def endpoint_only(self) -> bool:
        """Endpoint figures (``probe.json``, ``vllm_bench.json``, ``guidellm.json``) make a folder a run
        even without request traces."""
        return any(self.has(name) for name in ENDPOINT_FILES)

    # -- reading ------------------------------------------------------------------------------
    def records(self) -> list[RequestRecord]:
        """Every record of ``traces.jsonl``, in order (:func:`read_records`): the one run loader of the
        report, the forecasts and the simulator. One-line errors: no such folder; no trace (unless the
        folder holds endpoint figures); a trace with no complete request (same exception)."""
        if not self.path.is_dir():
            raise SpecLedgerError(f"run directory not found: {self.path}; pass the folder that holds {TRACE_NAME}")
        endpoint_only = self.endpoint_only()
        if not self.trace_path.is_file():
            if endpoint_only:
                return []
            raise SpecLedgerError(
                f"no {TRACE_NAME} in {self.path}; run `specledger run` first or point at a run folder"
            )
        records = list(read_records(self.trace_path))
        if not records and not endpoint_only:
            raise SpecLedgerError(f"{self.trace_path} holds no complete request; run more requests before reporting")
        return records

    def records_so_far(self) -> list[RequestRecord]:
        """The records written so far ([] without a trace): what a resumed or extended run skips."""
        return list(read_records(self.trace_path)) if self.trace_path.is_file() else []

    def meta(self, fix: str = "fix or delete it") -> dict[str, Any]:
        """``run.json`` ({} when absent); a file that is not a JSON object is a one-line error ending in ``fix``."""
        if not self.meta_path.is_file():
            return {}
        loaded = read_json(self.meta_path, fix)
        if not isinstance(loaded, dict):
            raise SpecLedgerError(f"{self.meta_path} must hold a JSON object")
        return loaded

    def read(self, name: str, fix: str = "fix or delete it") -> Any:
        """The JSON value of the folder's file ``name`` (:func:`read_json`)."""
        return read_json(self.path / name, fix)

    def read_object(self, name: str, fix: str = "fix or delete it") -> dict[str, Any] | None:
        """The JSON object in ``name``; None when the file is absent or holds something else."""
        if not self.has(name):
            return None
        loaded = self.read(name, fix)
        return loaded if isinstance(loaded, dict) else None

    def experiments(self) -> dict[str, Any]:
        """The side experiments' results present (``quantization.json``, ``policies.json``, ``serving.json``,
        ``simulate.json``) by :data:`EXPERIMENT_FILES` key, and the endpoint documents present
        (``probe.json``, ``vllm_bench.json``, ``guidellm.json``) by :data:`ENDPOINT_KEYS` key, as written."""
        out: dict[str, Any] = {}
        for key, name in EXPERIMENT_FILES.items():
            loaded = self.read_object(name, "re-run `specledger sweep` or delete it")
            if loaded is not None:
                out[key] = loaded
        for name, key in ENDPOINT_KEYS.items():
            loaded = self.read_object(name, "re-run the probe/import or delete it")
            if loaded is not None:
                out[key] = loaded
        return out

    # -- writing ------------------------------------------------------------------------------
    def write_meta(self, meta: Mapping[str, Any], keep_existing: bool = False) -> bool:
        """Write ``run.json`` (atomically; the folder is created): the only writer of that file. With
        ``keep_existing`` a folder that already has one (a main run's, say) keeps it. True if written."""
        if keep_existing and self.meta_path.exists():
            return False
        write_json_atomic(self.meta_path, dict(meta))
        return True

    def write(self, name: str, obj: Any) -> Path:
        """``obj`` as the folder's strict-JSON file ``name`` (:func:`write_json_atomic`); returns its path."""
        path = self.path / name
        write_json_atomic(path, obj, ONE_LINE_BELOW.get(name))
        return path

    def write_experiment(self, name: str, result: Any) -> Any:
        """A side experiment's result as the folder's file ``name``, returned as read back: what the report
        will see (strict JSON: NaN -> null, tuples -> lists)."""
        self.write(name, result)
        return self.read(name)

    def write_text(self, name: str, text: str) -> Path:
        path = self.path / name
        write_text_atomic(path, text)
        return path

    def append(self, records: Iterable[RequestRecord]) -> None:
        """Append records to ``traces.jsonl``, fsync'ed (:func:`append_records`)."""
        append_records(self.trace_path, records)

    def repair_tail(self) -> int:
        """Remove a torn last line of the trace (:func:`repair_tail`); the bytes removed."""
        return repair_tail(self.trace_path)

    def remove_stale_temp_files(self) -> list[str]:
        """Delete the temp files that interrupted atomic writes of the folder's own files left behind
        (``.NAME.<random>.tmp`` for a NAME of this module, :func:`write_text_atomic`: a kill between
        writing the temp file and its ``os.replace``; a 5 MB ``report.html`` each); returns their names.
        For the one writer of a run being continued (``run --resume``): a concurrent writer's temp file
        would go too."""
        names = {META_NAME, SUMMARY_NAME, COST_MODEL_JSON, HTML_NAME, *EXPERIMENT_FILES.values(), *ENDPOINT_FILES}
        stale = [p for p in self.path.glob(f".*{TEMP_SUFFIX}")
                 if p.is_file() and p.name[1:].rsplit(".", 2)[0] in names]
        for p in stale:
            p.unlink(missing_ok=True)
        return sorted(p.name for p in stale)


__all__ = [
    "COST_MODEL_JSON", "ENDPOINT_FILES", "ENDPOINT_KEYS", "EXPERIMENT_FILES", "GUIDELLM_JSON", "HTML_NAME",
    "META_NAME", "ONE_LINE_BELOW", "POLICIES_JSON", "PROBE_JSON", "QUANT_JSON", "RunDir", "SERVING_JSON",
    "SIMULATE_JSON", "SUMMARY_NAME", "TEMP_SUFFIX", "TRACE_NAME", "VLLM_BENCH_JSON", "append_records",
    "dumps_json", "json_safe", "read_json", "read_records", "repair_tail", "summary_meta", "write_json_atomic",
    "write_text_atomic",
]
