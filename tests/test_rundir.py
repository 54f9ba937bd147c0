"""The run directory's I/O: strict atomic JSON, the trace reader's torn-tail and bad-line handling,
repairing a torn tail before appending, and one-line errors for files that are not UTF-8 JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from synthetic import plain_rounds, request_from_rounds

from specledger.errors import SpecLedgerError, SpecLedgerWarning
from specledger.rundir import (
    RunDir,
    append_records,
    json_safe,
    read_json,
    read_records,
    repair_tail,
    write_json_atomic,
)


def _records(n: int) -> list:
    return [request_from_rounds(f"r{i}", f"p{i}", plain_rounds(3, 0.01)) for i in range(n)]


def _trace(tmp_path, n: int = 3):
    path = tmp_path / "traces.jsonl"
    append_records(path, _records(n))
    return path


def test_json_safe_and_atomic_writer(tmp_path):
    obj = {1: [math.nan, math.inf, np.float32(0.5), np.int64(3), np.bool_(True), (1, 2)], "s": "γ", "p": tmp_path}
    assert json_safe(obj)["1"] == [None, None, 0.5, 3, True, [1, 2]]
    out = tmp_path / "sub" / "x.json"
    write_json_atomic(out, obj)
    text = out.read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text and "γ" in text and text.endswith("\n")
    assert json.loads(text)["p"] == str(tmp_path)  # objects JSON has no type for: their str
    assert [p.name for p in out.parent.iterdir()] == ["x.json"]  # no temp file left behind
    assert oct(out.stat().st_mode & 0o777) == oct(0o644)


def test_read_json_errors_are_one_line(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(SpecLedgerError, match="not UTF-8 text; fix it") as info:
        read_json(bad, "fix it")
    assert "\n" not in str(info.value)
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(SpecLedgerError, match="not valid JSON"):
        read_json(bad)


def test_torn_last_line_is_skipped_with_a_warning(tmp_path):
    path = _trace(tmp_path)
    whole = path.read_bytes()
    path.write_bytes(whole + whole.splitlines(keepends=True)[0][:40])  # an interrupted fourth write
    with pytest.warns(SpecLedgerWarning, match=r"traces.jsonl:4: skipped the torn last line \(40 bytes"):
        records = list(read_records(path))
    assert [r.request_id for r in records] == ["r0", "r1", "r2"]


def test_complete_trace_reads_without_warnings(tmp_path):
    path = _trace(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(read_records(path))) == 3


def test_bad_line_inside_the_file_is_an_error_naming_it(tmp_path):
    path = _trace(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b'{"request_id": 1\n' + b"".join(lines[1:]))
    with pytest.raises(SpecLedgerError, match=r"traces.jsonl:2: malformed trace record .*delete that line"):
        list(read_records(path))


def test_invalid_utf8_is_an_error_not_a_traceback(tmp_path):
    path = _trace(tmp_path)
    path.write_bytes(b"\xff\xfe\xfa not text\n" + path.read_bytes())
    with pytest.raises(SpecLedgerError, match=r"traces.jsonl:1: malformed trace record \(not UTF-8 text\)"):
        list(read_records(path))


def test_report_verb_on_invalid_utf8_prints_one_error_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trace = _trace(run_dir)
    trace.write_bytes(b"\x80\x81\n" + trace.read_bytes())
    proc = subprocess.run([sys.executable, "-m", "specledger.cli", "report", str(run_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not UTF-8" in lines[0]


def test_repair_tail_truncates_to_the_last_complete_record(tmp_path):
    path = _trace(tmp_path)
    whole = path.read_bytes()
    assert repair_tail(path) == 0 and path.read_bytes() == whole  # nothing to repair
    assert repair_tail(tmp_path / "absent.jsonl") == 0
    path.write_bytes(whole + b'{"request_id": "r3", "dra')
    assert repair_tail(path) == len(b'{"request_id": "r3", "dra')
    assert path.read_bytes() == whole
    # the old bug's damage: a torn line with a whole record glued on, then another record's torn start
    glued = b'{"request_id": "x' + whole.splitlines(keepends=True)[0] + b'{"req'
    path.write_bytes(whole + glued)
    assert repair_tail(path) == len(glued)
    assert [r.request_id for r in read_records(path)] == ["r0", "r1", "r2"]


def test_append_never_continues_a_torn_line(tmp_path):
    path = _trace(tmp_path)
    path.write_bytes(path.read_bytes() + b'{"request_id": "r3", "dra')
    with pytest.warns(SpecLedgerWarning, match=r"removed a torn last line \(25 bytes\) before appending"):
        append_records(path, _records(5)[3:])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.request_id for r in read_records(path)] == ["r0", "r1", "r2", "r3", "r4"]


def test_report_verb_on_a_non_utf8_slo_file_prints_one_error_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _trace(run_dir)
    slo = tmp_path / "slo.toml"
    slo.write_bytes(b"itl_p99_ms = \xff\n")
    proc = subprocess.run([sys.executable, "-m", "specledger.cli", "report", str(run_dir), "--slo", str(slo)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: SLO file {slo} is not UTF-8 text; save it as UTF-8 TOML or JSON"
    ]


def test_run_dir_is_the_one_loader_and_writer(tmp_path):
    run = RunDir(tmp_path / "run")
    with pytest.raises(SpecLedgerError, match="run directory not found"):
        run.records()
    assert run.records_so_far() == [] and run.meta() == {} and run.experiments() == {}
    assert run.write_meta({"name": "a"}) and not run.write_meta({"name": "b"}, keep_existing=True)
    assert run.meta() == {"name": "a"}
    with pytest.raises(SpecLedgerError, match="no traces.jsonl"):
        run.records()
    run.append(_records(2))
    assert [r.request_id for r in run.records()] == ["r0", "r1"] == [r.request_id for r in run.records_so_far()]
    assert run.write_experiment("policies.json", {"x": math.nan, "t": (1, 2)}) == {"x": None, "t": [1, 2]}
    run.write("probe.json", {"probe": {}})
    run.write("serving.json", [1, 2])  # not an object: not an experiment's result
    assert run.experiments() == {"policies": {"x": None, "t": [1, 2]}, "probe": {"probe": {}}}
    run.write("run.json", [1])
    with pytest.raises(SpecLedgerError, match="must hold a JSON object"):
        run.meta()


def test_endpoint_figures_alone_make_a_run(tmp_path):
    run = RunDir(tmp_path)
    run.write("vllm_bench.json", {"summary": {}})
    assert run.endpoint_only() and run.records() == []
