"""Hostile files and servers for ``inspect``, ``import``, ``calibrate --import``, ``probe`` and the run-folder
readers (issue 34, the probe and reader half).

Every crafted file goes through the CLI's terminal output (``specledger.cli.main``, in process, stdout and
stderr captured) and must answer with exit 0 or 2, no traceback, no raw ESC byte on stdout, within 10 s.
The parsers are fuzzed over the full value ranges with hypothesis (positions to 2^63, floats with ±inf
and NaN, strings with Rich markup and control characters, nesting to 10,000).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from specledger.errors import SpecLedgerError

CLI_BUDGET_S = 10.0

VB_OK = {"date": "20250101", "backend": "vllm", "model_id": "m", "completed": 10, "failed": 0, "duration": 5.0,
         "request_throughput": 2.0, "output_throughput": 100.0, "mean_ttft_ms": 10.0, "median_ttft_ms": 9.0,
         "p99_ttft_ms": 20.0}
TRACE_LINE = {"request_id": "a|1|p|0", "drafter": "a", "gamma": 1, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
              "seed": 0, "prompt_tokens": 1, "output_tokens": 1, "text": "x", "token_ids": [1], "stop_reason": "eos",
              "t_prefill": 0.0, "ttft": 0.1, "total_time": 0.1, "token_times": [0.1], "chunks": [1], "rounds": [],
              "category": "", "prompt_id": "p", "model": "m", "dtype": "", "extra": {}}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
MARKUP = "[/bold][red]x[/red][link=file:///etc/passwd]y"
ESC = "\x1b[2J\x1b]0;pwned\x07\x9b31m"


def _nest(depth: int, leaf: object = 1) -> str:
    return '{"a":' * depth + json.dumps(leaf) + "}" * depth


def _metrics(*lines: str) -> str:
    head = ["vllm:spec_decode_num_drafts_total 10", "vllm:spec_decode_num_draft_tokens_total 30",
            "vllm:spec_decode_num_accepted_tokens_total 12"]
    return "\n".join(head + list(lines)) + "\n"


def _sse(*objs: object) -> str:
    body = "".join(f"data: {o if isinstance(o, str) else json.dumps(o)}\n\n" for o in objs)
    return body + "data: [DONE]\n\n"


def _chunk(**extra: object) -> dict:
    return {"choices": [{"text": "hi", "finish_reason": None}], **extra}


def _guidellm(bench: dict | None = None, **top: object) -> str:
    bench = bench if bench is not None else {"duration": 1.0, "metrics": {}}
    return json.dumps({"metadata": {"guidellm_version": "0.8.1", "version": 2}, "benchmarks": [bench], **top})


def _vb(**fields: object) -> str:
    return json.dumps({**VB_OK, **fields})


def _raw_vb(extra: str) -> str:
    """VB_OK with a raw JSON fragment (a huge int, a deep object) spliced in as the last field."""
    return json.dumps(VB_OK)[:-1] + ", " + extra + "}"


#: name -> file text; each runs through ``inspect`` and ``import``
CRAFTED: dict[str, Callable[[], str]] = {
    # /metrics dumps
    "metrics_position_1e9": lambda: _metrics(f'{PER_POS}{{position="1000000000"}} 3'),
    "metrics_position_2p63": lambda: _metrics(f'{PER_POS}{{position="{2**63}"}} 3', f'{PER_POS}{{position="0"}} 4'),
    "metrics_position_negative": lambda: _metrics(f'{PER_POS}{{position="-7"}} 3'),
    "metrics_position_markup": lambda: _metrics(f'{PER_POS}{{position="{MARKUP}"}} 3'),
    "metrics_position_escape": lambda: _metrics(f'{PER_POS}{{position="{ESC}"}} 3'),
    "metrics_counters_1e308": lambda: "\n".join(
        [f'vllm:spec_decode_num_drafts_total{{engine="{e}"}} 1e308' for e in "01"]
        + [f'vllm:spec_decode_num_accepted_tokens_total{{engine="{e}"}} 1.7e308' for e in "01"]
        + [f'{PER_POS}{{engine="{e}",position="{p}"}} 1.7e308' for e in "01" for p in "01"]) + "\n",
    "metrics_nan_inf": lambda: _metrics(f'{PER_POS}{{position="0"}} NaN', f'{PER_POS}{{position="1"}} +Inf',
                                        "vllm:spec_decode_num_drafts_total{engine=\"1\"} -Inf"),
    "metrics_le_markup": lambda: f'vllm:time_to_first_token_seconds_bucket{{le="{MARKUP}"}} 1\n',
    "metrics_sglang_gauge_inf": lambda: "sglang:spec_accept_length +Inf\nsglang:spec_accept_rate 1e308\n",
    # SSE captures
    "sse_model_markup": lambda: _sse(_chunk(model=MARKUP, system_fingerprint=MARKUP)),
    "sse_model_escape": lambda: _sse(_chunk(model=ESC, system_fingerprint=ESC)),
    "sse_error_markup": lambda: _sse({"error": {"message": MARKUP + ESC}}),
    "sse_bad_json_escape": lambda: _sse("{" + ESC + MARKUP),
    "sse_timings_nested_500": lambda: _sse(_chunk()) .replace("data: [DONE]", "data: " + json.dumps(_chunk())[:-1]
                                                               + ', "timings": ' + _nest(500) + "}\n\ndata: [DONE]"),
    "sse_nested_10000": lambda: _sse(_nest(10_000)),
    "sse_timings_bigint": lambda: _sse(_chunk(timings={"draft_n": 10**400, "draft_n_accepted": 10**399})),
    "sse_lf_only_long": lambda: "".join(f"data: {json.dumps(_chunk())}\n\n" for _ in range(20_000)),
    # vllm bench results
    "vb_traces_line": lambda: json.dumps(TRACE_LINE),
    "vb_traces_jsonl": lambda: json.dumps(TRACE_LINE) + "\n" + json.dumps(TRACE_LINE) + "\n",
    "vb_empty_object": lambda: "{}",
    "vb_model_markup": lambda: _vb(model_id=MARKUP, backend=MARKUP, label=ESC),
    "vb_model_escape": lambda: _vb(model_id=ESC, errors=[ESC, MARKUP]),
    "vb_nested_500": lambda: _raw_vb('"extra_field": ' + _nest(500)),
    "vb_nested_10000": lambda: _raw_vb('"extra_field": ' + _nest(10_000)),
    "vb_int_5000_digits": lambda: _raw_vb('"completed": ' + "9" * 5000),
    "vb_int_10p400": lambda: _vb(completed=10**400, duration=10**400, spec_decode_acceptance_length=10**400,
                                 spec_decode_num_drafts=10**400),
    "vb_counts_10p400": lambda: _vb(completed=10**400, spec_decode_num_drafts=10**400,
                                    spec_decode_accepted_tokens=-(10**400), total_output_tokens=10**300),
    "vb_rates_1e308": lambda: _vb(spec_decode_acceptance_length=2.0, spec_decode_num_drafts=10,
                                  spec_decode_per_position_acceptance_rates=[1.7e308, 1.7e308]),
    "vb_nan_inf": lambda: _vb(duration=float("nan"), request_throughput=float("inf"),
                              spec_decode_acceptance_length=float("-inf")),
    "vb_jsonl_second_is_trace": lambda: _vb() + "\n" + json.dumps(TRACE_LINE) + "\n",
    # guidellm reports
    "gl_timings_list": lambda: _guidellm({"duration": 1.0, "metrics": {}, "requests": {"successful": [
        {"output_tokens": 3, "info": {"timings": [1]}}]}}),
    "gl_version_markup": lambda: _guidellm(metadata={"guidellm_version": MARKUP + ESC, "version": 2},
                                           config={"model": MARKUP + ESC}),
    "gl_int_10p400": lambda: _guidellm({"duration": 10**400, "metrics": {"request_totals": {"successful": 10**400}},
                                        "requests": {"successful": [{"output_tokens": 10**400,
                                                                     "info": {"timings": {"token_iterations": 1}}}]}}),
    "gl_nested_900": lambda: json.dumps({"benchmarks": [{"duration": 1.0}]})[:-1] + ', "x": ' + _nest(900) + "}",
    "gl_int_5000_digits": lambda: json.dumps({"benchmarks": [{"duration": 1.0}]})[:-1] + ', "x": ' + "7" * 5000
    + "}",
    "gl_benchmarks_not_objects": lambda: json.dumps({"benchmarks": [1, "x", None, [2]]}),
}

#: name -> text of a ``calibrate --import`` file
CALIBRATE_CRAFTED: dict[str, Callable[[], str]] = {
    "cal_10p400": lambda: json.dumps({"batch": 1, "q": 1, "ctx": 0, "ms": 10**400}) + "\n",
    "cal_batch_10p400": lambda: json.dumps({"batch": 10**400, "q": 1, "ctx": 0, "ms": 1.0}) + "\n",
    "cal_int_5000_digits": lambda: '{"batch": 1, "q": 1, "ctx": ' + "9" * 5000 + ', "ms": 1.0}\n',
    "cal_nested_10000": lambda: _nest(10_000) + "\n",
    "cal_markup_path_value": lambda: json.dumps({"batch": MARKUP, "q": 1, "ctx": 0, "ms": 1.0}) + "\n",
}


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise :class:`_Hang` in the main thread after ``seconds`` (a hang fails the test, not the suite)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):  # noqa: ANN001
        raise _Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class _BuiltOnce:
    """``specledger.cli.app`` with its click command built once (typer rebuilds it per call: 0.13 s)."""

    def __init__(self, app) -> None:  # noqa: ANN001
        import typer

        self.command = typer.main.get_command(app)

    def __call__(self, **kwargs):  # noqa: ANN003, ANN204
        return self.command.main(prog_name="specledger", **kwargs)


_BUILT: list[_BuiltOnce] = []


def run_cli(args: list[str], budget_s: float = CLI_BUDGET_S) -> tuple[int | str, str, str, float]:
    """(exit code or "crash: ...", stdout, stderr, seconds) of ``specledger ARGS`` run in process, through
    ``specledger.cli.main`` (its error handling, the real verbs)."""
    import warnings

    import specledger.cli as cli

    if not _BUILT:
        _BUILT.append(_BuiltOnce(cli.app))
    main, app = cli.main, cli.app
    cli.app = _BUILT[0]
    out, err = io.StringIO(), io.StringIO()
    shown = warnings.showwarning
    start = time.perf_counter()
    code: int | str = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _deadline(budget_s):
            try:
                main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except _Hang as exc:
        code = f"crash: hang ({exc})"
    except BaseException as exc:  # noqa: BLE001 - every escape is what the test counts
        code = f"crash: {type(exc).__name__}: {str(exc)[:120]}"
        err.write("Traceback (most recent call last):\n" + traceback.format_exc(limit=3))
    finally:
        warnings.showwarning = shown
        cli.app = app
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


def _problems(code: int | str, stdout: str, stderr: str, seconds: float) -> list[str]:
    found = []
    if code not in (0, 2):
        found.append(f"exit {code}")
    if "Traceback" in stdout + stderr:
        found.append("traceback")
    if "\x1b" in stdout or "\x9b" in stdout:
        found.append("raw escape on stdout")
    if seconds > CLI_BUDGET_S:
        found.append(f"{seconds:.1f} s")
    return found


def crafted_outcomes(tmp: Path) -> dict[str, list[str]]:
    """Every crafted file through every verb: (name, verb) -> problems (empty: fine)."""
    outcomes = {}
    for name, build in CRAFTED.items():
        path = tmp / f"{name}.txt"
        path.write_text(build(), encoding="utf-8")
        for verb in ("inspect", "import"):
            outcomes[f"{name} {verb}"] = _problems(*run_cli([verb, str(path)]))
    for name, build in CALIBRATE_CRAFTED.items():
        path = tmp / f"{name}.jsonl"
        path.write_text(build(), encoding="utf-8")
        outcomes[f"{name} calibrate"] = _problems(*run_cli(["calibrate", "--import", str(path),
                                                            "--out", str(tmp / f"{name}.json")]))
    return outcomes


def test_crafted_files_through_the_cli(tmp_path: Path) -> None:
    assert len(CRAFTED) + len(CALIBRATE_CRAFTED) >= 30
    outcomes = crafted_outcomes(tmp_path)
    bad = {k: v for k, v in outcomes.items() if v}
    assert not bad, f"{len(bad)} of {len(outcomes)} runs misbehaved: {bad}"


def test_refused_and_detected_formats_are_named(tmp_path: Path) -> None:
    """A trace record, an empty object, a JSON Lines file whose second line is a trace: exit 2 naming what is
    missing; a real result is imported with the format it was detected as."""
    for name in ("vb_traces_line", "vb_empty_object", "vb_traces_jsonl"):
        path = tmp_path / f"{name}.json"
        path.write_text(CRAFTED[name]())
        for verb in ("inspect", "import"):
            code, out, err, _ = run_cli([verb, str(path)])
            assert code == 2, (name, verb, out, err)
            assert "not a vllm bench result: no `completed` or `request_throughput` key" in err, err
            assert err.count("\n") == 1
    path = tmp_path / "second_is_trace.jsonl"
    path.write_text(CRAFTED["vb_jsonl_second_is_trace"]())
    code, _, err, _ = run_cli(["import", str(path)])
    assert code == 2 and "line 2: not a vllm bench result" in err
    good = tmp_path / "good.json"
    good.write_text(_vb())
    for verb in ("import", "inspect"):
        code, out, _, _ = run_cli([verb, str(good)])
        assert code == 0 and "vllm bench serve result (format detected)" in " ".join(out.split())


@pytest.mark.parametrize("name", [n for n in CRAFTED if n.startswith(("vb_", "gl_"))])
def test_crafted_imports_written_to_a_run_folder(tmp_path: Path, name: str) -> None:
    """``import --out``: the document is written (depth-bounded json_safe) and its report built, or exit 2."""
    path = tmp_path / "in.json"
    path.write_text(CRAFTED[name]())
    code, out, err, seconds = run_cli(["import", str(path), "--out", str(tmp_path / "run")])
    assert not _problems(code, out, err, seconds), (code, out[-500:], err[-500:])
    if code == 0:
        written = list((tmp_path / "run").glob("*.json"))
        assert written and all(json.loads(p.read_text()) is not None for p in written)
        assert "\x1b" not in "".join(p.read_text() for p in written)  # JSON escapes it as \u001b


def test_the_installed_entry_point_on_hostile_files(tmp_path: Path) -> None:
    """The same through ``.venv/bin/specledger`` (a real terminal-bound process): exit 0/2, no traceback, no ESC."""
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("specledger")
    if not exe.is_file():
        pytest.skip("no specledger entry point beside the interpreter")
    for name, verb in (("sse_model_escape", "inspect"),):  # one: each start of the entry point costs seconds
        path = tmp_path / f"{name}.json"
        path.write_text(CRAFTED[name]())
        start = time.perf_counter()
        done = subprocess.run([str(exe), verb, str(path)], capture_output=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "COLUMNS": "120", "TERM": "xterm-256color"})
        stdout, stderr = done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")
        assert done.returncode in (0, 2) and "Traceback" not in stdout + stderr, (stdout, stderr)
        assert b"\x1b" not in done.stdout and "\x9b" not in stdout and time.perf_counter() - start < 30


# --- /metrics positions --------------------------------------------------------------------------------


def _figures_cost(position: int) -> tuple[float, int]:
    from specledger.probe.prometheus import EMPTY_SNAPSHOT, parse_prometheus_text
    from specledger.probe.spec_figures import spec_decode_figures

    snap = parse_prometheus_text(_metrics(f'{PER_POS}{{position="{position}"}} 3', f'{PER_POS}{{position="0"}} 4'))
    start = time.perf_counter()
    figures = spec_decode_figures(EMPTY_SNAPSHOT, snap).to_dict()
    return time.perf_counter() - start, len(json.dumps(figures))


@pytest.mark.parametrize("position", [1000, 10**9, 2**63, 10**4000], ids=["1e3", "1e9", "2^63", "1e4000"])
def test_a_far_position_costs_what_position_10_costs(position: int) -> None:
    """Positions stay sparse; only 0..MAX_POSITIONS-1 become rates; a far one is named in a warning."""
    from specledger.probe.prometheus import EMPTY_SNAPSHOT, parse_prometheus_text
    from specledger.probe.spec_figures import MAX_POSITIONS, spec_decode_figures

    near_s, near_size = min(_figures_cost(10) for _ in range(3))
    with _deadline(CLI_BUDGET_S):
        far_s, far_size = min(_figures_cost(position) for _ in range(3))
    assert far_s < 10 * near_s + 0.01 and far_size < near_size + 300
    snap = parse_prometheus_text(_metrics(f'{PER_POS}{{position="{position}"}} 3', f'{PER_POS}{{position="1"}} 4'))
    figures = spec_decode_figures(EMPTY_SNAPSHOT, snap)
    assert figures.per_position_rates == [0.0, 0.4] and len(figures.per_position_rates) <= MAX_POSITIONS
    assert any("outside 0..255 left out" in w for w in figures.warnings)


def test_counters_near_the_float_limit_are_figures_not_overflow() -> None:
    from specledger.ledger.server_acceptance import acceptance_ledger, per_position_mismatch

    assert per_position_mismatch(2.0, [1.7e308, 1.7e308]) is None  # math.fsum overflows: cannot be checked
    assert per_position_mismatch(10**400, [0.5]) is None and per_position_mismatch(2.0, [10**400]) is None
    ledger = acceptance_ledger({"per_position_rates": [0.5, 10**400], "mean_acceptance_length": 10**400})
    assert ledger["error"] and ledger["el_reported"] is None and ledger["el_from_per_position"] is None


# --- deep nesting, huge integers ---------------------------------------------------------------------


def _deep(depth: int) -> dict:
    obj: dict = {"leaf": 1}
    for _ in range(depth):
        obj = {"a": obj}
    return obj


@pytest.mark.parametrize("depth", [500, 10_000])
def test_deep_server_objects_are_written_bounded(tmp_path: Path, depth: int) -> None:
    from specledger.probe.loadgen import RequestResult
    from specledger.rundir import MAX_JSON_DEPTH, TOO_DEEP, json_safe, write_json_atomic

    result = RequestResult(index=0, server_timings=_deep(depth))
    d = result.to_dict()
    text = json.dumps(d)
    assert TOO_DEEP in text and text.count("{") <= MAX_JSON_DEPTH + 2
    write_json_atomic(tmp_path / "x.json", {"r": [d], "raw": _deep(depth)})
    assert json.loads((tmp_path / "x.json").read_text())["r"][0]["index"] == 0
    assert json_safe([[[1]]]) == [[[1]]] and json_safe(_deep(3)) == _deep(3)


@pytest.mark.parametrize("text", ["[" * 10_000 + "]" * 10_000, '{"a": ' + "9" * 5000 + "}",
                                  '{"a": 1e400, "b": NaN}'])
def test_read_json_is_one_line_errors_or_values(tmp_path: Path, text: str) -> None:
    from specledger.rundir import read_json

    path = tmp_path / "f.json"
    path.write_text(text)
    try:
        value = read_json(path)
    except SpecLedgerError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
    else:
        assert math.isinf(value["a"])


def test_sse_parser_is_linear_on_lf_only_input() -> None:
    """A 50 MB LF-only capture (5,000 events of 10 kB) parses in seconds, whole or fed in pieces; the old
    parser searched for CR to the end of the buffer once per line (hours)."""
    from specledger.probe.sse import SSEParser, parse_sse

    line = "data: " + "x" * 10_000 + "\n\n"
    capture = line * 5_000
    assert len(capture) > 50_000_000
    start = time.perf_counter()
    with _deadline(30):
        events = parse_sse(capture)
    assert len(events) == 5_000 and time.perf_counter() - start < 10
    parser, giant = SSEParser(), "data: " + "y" * 20_000_000 + "\n\n"
    start = time.perf_counter()
    with _deadline(30):
        got = [e for i in range(0, len(giant), 1_000) for e in parser.feed(giant[i:i + 1_000])] + parser.close()
    assert len(got) == 1 and len(got[0].data) == 20_000_000 and time.perf_counter() - start < 10


# --- records ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("patch", "field"), [
    ({"extra": []}, "extra"), ({"token_times": ["a"]}, "token_times"), ({"gamma": True}, "gamma"),
    ({"rounds": [{"drafter": "a"}]}, "rounds[0]"), ({"rounds": {}}, "rounds"), ({"seed": 1.5}, "seed"),
    ({"text": None}, "text"), ({"chunks": [1, 2.5]}, "chunks"),
])
def test_trace_records_are_type_checked(tmp_path: Path, patch: dict, field: str) -> None:
    from specledger.records import RecordError, RequestRecord
    from specledger.rundir import read_records

    assert RequestRecord.from_dict(TRACE_LINE).request_id == TRACE_LINE["request_id"]
    with pytest.raises(RecordError, match=re_escape(field)):
        RequestRecord.from_dict({**TRACE_LINE, **patch})
    trace = tmp_path / "traces.jsonl"
    trace.write_text(json.dumps({**TRACE_LINE, **patch}) + "\n" + json.dumps(TRACE_LINE) + "\n")
    with pytest.raises(SpecLedgerError, match=f"{re_escape(str(trace))}:1: malformed trace record") as info:
        list(read_records(trace))
    assert "\n" not in str(info.value) and field.split("[")[0] in str(info.value)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


# --- hostile servers: bounded reads, credentials ---------------------------------------------------------


class HostileServer:
    """A loopback HTTP server (stdlib, one thread per connection) for the probe: ``/v1/models``,
    ``/metrics`` and a streaming ``/v1/completions``; ``mode`` makes it trickle, bloat or echo. Every
    request's headers are kept in ``seen``."""

    def __init__(self, mode: str = "ok", model: str = "m") -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.mode, self.model, self.seen = mode, model, []
        self.stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _trickle(self, ctype: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.end_headers()
                try:
                    while not outer.stop.wait(0.05):
                        self.wfile.write(b"#")
                        self.wfile.flush()
                except OSError:
                    pass

            def do_GET(self) -> None:  # noqa: N802
                outer.seen.append((self.path, dict(self.headers)))
                if outer.mode == "trickle":
                    return self._trickle("text/plain")
                if outer.mode == "bloat":
                    return self._send(200, b"# " + b"x" * 2_000_000 + b"\n", "text/plain")
                if self.path == "/v1/models":
                    return self._send(200, json.dumps({"data": [{"id": outer.model}]}).encode(), "application/json")
                return self._send(200, _metrics(f'{PER_POS}{{position="0"}} 4').encode(), "text/plain")

            def do_POST(self) -> None:  # noqa: N802
                outer.seen.append((self.path, dict(self.headers)))
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if outer.mode == "echo":
                    return self._send(401, f"bad credentials: {self.headers.get('Authorization')}".encode(),
                                      "text/plain")
                if outer.mode == "trickle-stream":
                    return self._trickle("text/event-stream")
                chunk = {"model": outer.model, "choices": [{"text": "ab ", "finish_reason": None}]}
                body = (f"data: {json.dumps(chunk)}\n\n" * 3 + "data: [DONE]\n\n").encode()
                self._send(200, body, "text/event-stream")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> HostileServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_trickling_server_cannot_hang_discovery_or_scrapes() -> None:
    """One byte every 50 ms never trips httpx's per-read timeout; the total timeout does."""
    from specledger.probe.endpoint import discover_model, scrape_metrics

    with HostileServer("trickle") as server:
        start = time.perf_counter()
        with _deadline(15):
            snapshot, why = scrape_metrics(server.url, timeout_s=1.0)
        assert snapshot is None and "TotalTimeout" in why and time.perf_counter() - start < 3
        start = time.perf_counter()
        with _deadline(15), pytest.raises(SpecLedgerError, match="TotalTimeout"):
            discover_model(server.url, None, timeout_s=1.0)
        assert time.perf_counter() - start < 3


def test_an_endless_body_is_cut_at_the_size_bound() -> None:
    from specledger.probe.fetch import BoundExceeded, fetch

    with HostileServer("bloat") as server:
        with pytest.raises(BoundExceeded, match="TooLarge"):
            fetch(f"{server.url}/metrics", timeout_s=5.0, max_bytes=100_000)
        assert len(fetch(f"{server.url}/metrics", timeout_s=5.0, max_bytes=4_000_000).body) > 2_000_000


def test_a_trickling_stream_ends_at_the_request_timeout() -> None:
    import asyncio

    from specledger.probe.loadgen import LoadConfig, PromptItem, run_load

    with HostileServer("trickle-stream") as server:
        config = LoadConfig(base_url=server.url, model="m", concurrency=1, num_requests=1, timeout_s=1.0)
        start = time.perf_counter()
        with _deadline(15):
            run = asyncio.run(run_load(config, [PromptItem(prompt="p")]))
        assert run.results[0].error.startswith("TotalTimeout") and time.perf_counter() - start < 3


SECRETS = ("hunter2pass", "sk-topsecret-123", "hdr-secret-456")


def _leaks(out: Path, *texts: str) -> list[str]:
    """Which secrets (and, given as ``Basic ...`` texts, their base64 tokens) appear in ``texts`` or any file
    under ``out``."""
    tokens = [t.split(" ", 1)[1] for t in texts if t.startswith("Basic ")]
    blob = "".join(texts[:len(texts) - len(tokens)]) + "".join(
        p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    return [s for s in (*SECRETS, *tokens) if s in blob]


def test_probe_sends_credentials_and_writes_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """URL user info becomes Basic auth, --header and --api-key ride on every request; none of them is in
    probe.json, run.json, traces.jsonl, the report or the terminal."""
    import base64

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with HostileServer(model=MARKUP + ESC) as server:
        url = server.url.replace("http://", f"http://alice:{SECRETS[0]}@")
        code, out, err, _ = run_cli(["probe", url, "--requests", "2", "--concurrency", "1", "--out",
                                     str(tmp_path / "a"), "--header", f"X-Extra: {SECRETS[2]}"])
        assert code == 0, (out, err)
        basic = "Basic " + base64.b64encode(f"alice:{SECRETS[0]}".encode()).decode()
        assert {p for p, _ in server.seen} >= {"/v1/models", "/metrics", "/v1/completions"}
        assert all(h.get("Authorization") == basic and h.get("X-Extra") == SECRETS[2] for _, h in server.seen)
        assert not _leaks(tmp_path / "a", out, err, basic) and "\x1b" not in out
        assert (tmp_path / "a" / "probe.json").is_file() and "alice" not in (tmp_path / "a" / "run.json").read_text()
        server.seen.clear()
        monkeypatch.setenv("OPENAI_API_KEY", SECRETS[1])
        code, out, err, _ = run_cli(["probe", server.url, "--requests", "1", "--concurrency", "1", "--json",
                                     "--out", str(tmp_path / "b")])
        assert code == 0 and all(h.get("Authorization") == f"Bearer {SECRETS[1]}" for _, h in server.seen)
        assert json.loads(out)["probe"]["config"]["header_names"] == ["Authorization"]
        assert not _leaks(tmp_path / "b", out, err)


def test_credentials_stay_out_of_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, out, err, _ = run_cli(["probe", f"http://bob:{SECRETS[0]}@127.0.0.1:1", "--requests", "1"])
    assert code == 2 and "cannot reach http://127.0.0.1:1" in err and not _leaks(tmp_path, out, err)
    code, out, err, _ = run_cli(["probe", f"ftp://bob:{SECRETS[0]}@h", "--requests", "1"])
    assert code == 2 and not _leaks(tmp_path, out, err)
    code, out, err, _ = run_cli(["probe", "http://127.0.0.1:1", "--header", f"no colon {SECRETS[2]}"])
    assert code == 2 and not _leaks(tmp_path, out, err)
    with HostileServer("echo") as server:  # a server that quotes our Authorization back in its error body
        code, out, err, _ = run_cli(["probe", server.url, "--api-key", SECRETS[1], "--requests", "1",
                                     "--concurrency", "1", "--no-metrics", "--json", "--out", str(tmp_path / "e")])
        # every request failed: one error line and exit 2 (issue 46), the echoed secret blanked there too
        assert code == 2 and "HTTP 401" in err and not _leaks(tmp_path / "e", out, err)


# --- fuzzing over the full value ranges, through the parsers and the terminal output ----------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HOSTILE_TEXT = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=st.sampled_from(list("[]/\\=#@:ab \x1b\x07\x9b\x00\r\n\t\u202e\x7f")), max_size=30),
    st.sampled_from([MARKUP, ESC, "[/]", "[bold", "\\", "[link=x]", "[/bold]", "\x1b]52;c;ZXZpbA==\x07"]),
)
BIG_INTS = st.one_of(st.integers(-(2**63), 2**63), st.sampled_from([10**400, -(10**400), 2**1000, 10**4000]))
ALL_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
SCALARS = st.one_of(st.none(), st.booleans(), BIG_INTS, ALL_FLOATS, HOSTILE_TEXT)
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(HOSTILE_TEXT, inner, max_size=4)), max_leaves=12)
#: JSON text of any value, or of one nested up to 10,000 levels (json.dumps itself cannot write that deep)
JSON_TEXT = st.one_of(JSON_VALUES.map(json.dumps), st.builds(_nest, st.integers(0, 10_000), SCALARS))
FUZZ = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _object_text(fields: dict[str, str]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in fields.items()) + "}"


def _through_cli(text: str, verbs: tuple[str, ...] = ("inspect", "import")) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzzed.txt"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        for verb in verbs:
            outcome = run_cli([verb, str(path)])
            assert not _problems(*outcome), (verb, outcome[0], outcome[1][-400:], outcome[2][-400:])


VB_KEYS = sorted({*VB_OK, "model_id", "label", "backend", "spec_decode_acceptance_length", "spec_decode_num_drafts",
                  "spec_decode_acceptance_rate", "spec_decode_per_position_acceptance_rates", "errors",
                  "p95_itl_ms", "request_goodput:", "extra"})


@FUZZ
@given(st.dictionaries(st.sampled_from(VB_KEYS), JSON_TEXT, max_size=6), HOSTILE_TEXT, st.booleans(),
       st.booleans())
def test_fuzz_vllm_bench_files_through_the_cli(fields: dict[str, str], model: str, base: bool,
                                               json_lines: bool) -> None:
    """Fuzzed fields over a valid result (``base``: so the file reaches the tables) or alone."""
    start = {k: json.dumps(v) for k, v in VB_OK.items()} if base else {}
    text = _object_text({**start, "model_id": json.dumps(model), **fields})
    _through_cli(text + "\n" + json.dumps(VB_OK) + "\n" if json_lines else text)


@FUZZ
@given(st.fixed_dictionaries({"metadata": JSON_TEXT, "config": JSON_TEXT}), st.lists(st.dictionaries(
    st.sampled_from(["duration", "metrics", "requests", "config", "x"]), JSON_TEXT, max_size=4), max_size=3),
    HOSTILE_TEXT, BIG_INTS)
def test_fuzz_guidellm_reports_through_the_cli(top: dict[str, str], benches: list[dict[str, str]], version: str,
                                               count: int) -> None:
    metrics = {"request_totals": {"successful": count}, "time_to_first_token_ms": {"successful": {"mean": count}}}
    fixed = json.dumps({"duration": 1.0, "metrics": metrics, "requests": {"successful": [
        {"output_tokens": count, "info": {"timings": {"token_iterations": count}}}]}})
    body = [fixed] + [_object_text(b) for b in benches]
    meta = json.dumps({"guidellm_version": version, "version": count})
    _through_cli(_object_text({**top, "metadata": meta, "benchmarks": "[" + ", ".join(body) + "]"}))


@FUZZ
@given(st.lists(st.one_of(
    st.builds(lambda model, text, fp: json.dumps(_chunk(model=model, system_fingerprint=fp,
                                                        usage={"completion_tokens": 1}))
              .replace('"hi"', json.dumps(text)),
              HOSTILE_TEXT, HOSTILE_TEXT, HOSTILE_TEXT),
    st.builds(lambda m: json.dumps({"error": {"message": m}}), HOSTILE_TEXT),
    st.builds(lambda t: json.dumps(_chunk())[:-1] + f', "timings": {t}}}', JSON_TEXT),
    JSON_TEXT, HOSTILE_TEXT), min_size=1, max_size=5), st.sampled_from(["\n", "\r\n", "\r"]))
def test_fuzz_sse_captures_through_the_cli(events: list[str], newline: str) -> None:
    _through_cli("".join(f"data: {e}{newline}{newline}" for e in events) + "data: [DONE]\n\n", ("inspect",))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample(value: float) -> str:
    return ("NaN" if math.isnan(value) else "+Inf" if value == math.inf
            else "-Inf" if value == -math.inf else repr(value))


METRIC_NAMES = st.sampled_from(["vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                                "vllm:spec_decode_num_accepted_tokens_total", PER_POS,
                                "llamacpp:spec_decode_num_drafts_total",
                                "llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "sglang:spec_accept_length",
                                "sglang:spec_accept_rate", "vllm:time_to_first_token_seconds_bucket",
                                "vllm:time_to_first_token_seconds_count", "vllm:spec_decode_num_emitted_tokens_total"])
METRIC_LINES = st.lists(st.builds(
    lambda name, pos, le, value: f'{name}{{position="{_label(pos)}",le="{_label(le)}"}} {_sample(value)}',
    METRIC_NAMES, st.one_of(BIG_INTS.map(str), HOSTILE_TEXT), st.one_of(ALL_FLOATS.map(_sample), HOSTILE_TEXT),
    ALL_FLOATS), min_size=1, max_size=10)


@FUZZ
@given(METRIC_LINES)
def test_fuzz_metrics_dumps_through_the_cli(lines: list[str]) -> None:
    """Fuzzed samples after vLLM's drafts counters, so the spec-decode readers see every position."""
    _through_cli(_metrics(*lines), ("inspect",))


@settings(FUZZ, max_examples=150)
@given(METRIC_LINES, METRIC_LINES)
def test_fuzz_metrics_parsers_over_full_ranges(before: list[str], after: list[str]) -> None:
    """Positions to 2^63 and beyond, every float: figures or one-line errors, bounded rates, in time."""
    from specledger.probe.histograms import counter_rates, latency_histogram_summaries
    from specledger.probe.prometheus import parse_prometheus_text
    from specledger.probe.spec_figures import MAX_POSITIONS, spec_decode_figures

    with _deadline(CLI_BUDGET_S):
        try:
            b, a = parse_prometheus_text("\n".join(before) + "\n"), parse_prometheus_text("\n".join(after) + "\n")
            figures = spec_decode_figures(b, a)
            latency_histogram_summaries(b, a)
            counter_rates(b, a)
        except SpecLedgerError as exc:
            assert "\n" not in str(exc)
        else:
            assert len(figures.per_position_rates) <= MAX_POSITIONS
            json.dumps(figures.to_dict())


@settings(FUZZ, max_examples=25)
@given(st.lists(st.dictionaries(st.sampled_from(["batch", "q", "ctx", "ms", "repeats", "x"]), JSON_TEXT,
                                max_size=5), min_size=1, max_size=3))
def test_fuzz_calibrate_import_through_the_cli(lines: list[dict[str, str]]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "surface.jsonl"
        path.write_text("\n".join(_object_text(line) for line in lines) + "\n")
        outcome = run_cli(["calibrate", "--import", str(path), "--out", str(Path(d) / "out.json")])
        assert not _problems(*outcome), outcome


RECORD_FIELDS = sorted(TRACE_LINE) + ["tree_budget"]


@settings(FUZZ, max_examples=200)
@given(st.dictionaries(st.sampled_from(RECORD_FIELDS), JSON_VALUES, max_size=4), st.lists(
    st.dictionaries(st.sampled_from(["drafter", "gamma", "proposed", "truncated", "t_draft", "tree_parents"]),
                    JSON_VALUES, max_size=3), max_size=2))
def test_fuzz_trace_records_load_or_name_the_field(patch: dict, rounds: list[dict]) -> None:
    """Any JSON values: a record whose fields have their types, or a RecordError -- never a TypeError
    or AttributeError later."""
    from specledger.records import RecordError, RequestRecord

    good_round = {"drafter": "a", "gamma": 1, "proposed": 1, "accepted": 0, "committed": 1, "truncated": False,
                  "t_draft": 0.0, "t_verify": 0.0, "t_other": 0.0, "context_len": 1}
    d = {**TRACE_LINE, **patch}
    if rounds:
        d["rounds"] = [{**good_round, **r} for r in rounds]
    try:
        record = RequestRecord.from_dict(d)
    except RecordError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(record.extra, dict) and all(isinstance(t, (int, float)) for t in record.token_times)
    assert all(isinstance(r.truncated, bool) for r in record.rounds)
    record.to_json()


@settings(FUZZ, max_examples=100)
@given(JSON_VALUES, st.integers(0, 10_000))
def test_fuzz_json_safe_bounds_any_nesting(value: object, depth: int) -> None:
    from specledger.rundir import json_safe

    deep = value
    for _ in range(depth):
        deep = {"a": [deep]}
    json.dumps(json_safe(deep), allow_nan=False, default=str)  # strict JSON, no RecursionError


@settings(FUZZ, max_examples=300)
@given(st.one_of(HOSTILE_TEXT, st.text()))
def test_fuzz_safe_text_shows_everything_and_obeys_nothing(text: str) -> None:
    import io as _io

    from rich.console import Console

    from specledger.probe.safe_text import safe, visible

    shown = visible(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in shown)
    buffer = _io.StringIO()
    console = Console(file=buffer, width=10_000, force_terminal=False, color_system=None)
    console.print(f"[yellow]{safe(text)}[/yellow]", end="", soft_wrap=True)
    assert buffer.getvalue() == shown  # markup escaped: printed as written, not styled


if __name__ == "__main__":  # python tests/test_hostile_inputs.py: how many crafted runs crash today
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        result = crafted_outcomes(Path(d))
    bad = {k: v for k, v in result.items() if v}
    files_bad = {k.rsplit(" ", 1)[0] for k in bad}
    for k, v in bad.items():
        print(f"{k}: {', '.join(v)}")
    print(f"{len(bad)} of {len(result)} runs, {len(files_bad)} of {len(CRAFTED) + len(CALIBRATE_CRAFTED)} files")
    sys.exit(0)
