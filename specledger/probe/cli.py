"""CLI verbs ``probe``, ``import-vllm-bench`` and ``import`` (registered by specledger/cli.py): parse the flags,
call the library (:mod:`~specledger.probe.endpoint`, :mod:`~specledger.probe.workload`,
:mod:`~specledger.probe.outputs`), print the tables.

``probe`` loads an OpenAI-compatible streaming endpoint (fixed concurrency or Poisson rate),
times every chunk, scrapes ``URL/metrics`` before and after for spec-decode counters, and
prints one summary table; ``--baseline URL2`` repeats the same load on a second endpoint
and prints the speed-up. ``--loads 1,4,16`` probes both endpoints at each concurrency
(:mod:`~specledger.probe.loads`) and ends in the per-load gates, verdicts and schedule of
``specledger run --loads``. It only ever contacts the URLs it is given.

Everything a server or a file supplies (model names, versions, warnings quoting them) is printed through
:func:`specledger.probe.safe_text.safe`: no Rich markup and no control byte of theirs reaches the terminal.
``--header`` / ``--api-key`` values are sent and never written or printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from specledger.errors import SpecLedgerError
from specledger.load_points import parse_loads
from specledger.probe.endpoint import load_tokenizer, run_probe
from specledger.probe.fetch import parse_headers
from specledger.probe.guidellm import guidellm_version, load_guidellm
from specledger.probe.loadgen import LoadConfig
from specledger.probe.loads import run_probe_loads, without_results
from specledger.probe.loads_cli import print_run_report, show_loads, summary_in_memory
from specledger.probe.outputs import (
    GUIDELLM_KIND,
    GUIDELLM_NOTE,
    VLLM_BENCH_KIND,
    check_new_run_dir,
    vllm_bench_document,
    write_import_run,
    write_probe_dir,
    write_probe_loads_dir,
)
from specledger.probe.records import ENDPOINT_DRAFTER, check_label
from specledger.probe.safe_text import safe
from specledger.probe.vllm_bench import load_vllm_bench_records, records_of
from specledger.probe.workload import select_workload
from specledger.rundir import GUIDELLM_JSON, VLLM_BENCH_JSON

#: a figure longer than this is cut in a table cell (a 10**400 count is a number, not a screenful)
MAX_CELL = 80


def _fmt(value: Any, digits: int = 2) -> str:
    """A figure as plain text (escaped for the terminal by :func:`render_report`)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return _big_int(value)
    return str(value)


def _big_int(value: int) -> str:
    """An int as digits, or ``~1.0e400`` past :data:`MAX_CELL` digits (no 4300-digit str() limit applies)."""
    if value.bit_length() < 200:
        return str(value)
    digits = int(value.bit_length() * 0.30103)  # log10(2): the exponent within one
    return f"{'-' if value < 0 else ''}~1e{digits} (an integer of about {digits + 1} digits)"


def _pcts(block: dict | None) -> str:
    block = block or {}
    return " / ".join(_fmt(block.get(k)) for k in ("p50", "p95", "p99"))


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows shared by probe and vllm-bench tables."""
    return [
        (
            "requests ok / failed",
            f"{_fmt(summary.get('requests_ok'))} / {_fmt(summary.get('requests_failed'))}",
        ),
        ("errors", ", ".join(f"{k}: {v}" for k, v in (summary.get("errors") or {}).items()) or "-"),
        ("wall time (s)", _fmt(summary.get("wall_time_s"))),
        ("output throughput (tok/s)", _fmt(summary.get("output_throughput_tok_s"))),
        ("request throughput (req/s)", _fmt(summary.get("request_throughput_req_s"), 3)),
        ("TTFT p50/p95/p99 (ms)", _pcts(summary.get("ttft_ms"))),
        ("TPOT p50/p95/p99 (ms)", _pcts(summary.get("tpot_ms"))),
        ("pooled TPOT (ms)", _fmt(summary.get("pooled_tpot_ms"))),
        ("token ITL p50/p95/p99 (ms)", _pcts(summary.get("token_itl_ms"))),
        ("chunk ITL p50/p95/p99 (ms)", _pcts(summary.get("chunk_itl_ms"))),
        ("longest stall (ms)", _fmt(summary.get("longest_stall_ms"))),
        ("tokens per chunk", _fmt(summary.get("mean_tokens_per_chunk"))),
    ] + _optional_rows(summary)


def _optional_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Rows only some sources have: goodput (vllm bench), llama.cpp's per-response draft counts."""
    rows = []
    if summary.get("request_goodput_req_s") is not None:
        rows.append(("request goodput (req/s)", _fmt(summary["request_goodput_req_s"], 3)))
    timings = summary.get("response_timings")
    if timings:
        rows.append((
            "llama.cpp timings: accepted / drafted",
            f"{_fmt(timings.get('num_accepted_tokens'), 0)} / {_fmt(timings.get('num_draft_tokens'), 0)}"
            f" = {_fmt(timings.get('draft_acceptance_rate'), 3)} over {timings.get('responses')} responses",
        ))
    return rows


NO_METRICS_REASON = "not measured (--no-metrics or no /metrics)"


def spec_rows(spec: dict[str, Any] | None, missing: str = NO_METRICS_REASON) -> list[tuple[str, str]]:
    """Spec-decode rows; ``missing`` says why there are none (it depends on where the figures come from)."""
    if not spec:
        return [("spec decode", missing)]
    rows = [("spec-decode source", _fmt(spec.get("source")))]
    if spec.get("off"):
        rows.append(("spec decode", "off (the server's gauges say so)"))
    for key, label in (
        ("num_drafts", "draft rounds"),
        ("mean_acceptance_length", "pooled acceptance length (1 + Σacc/Σdrafts)"),
        ("draft_acceptance_rate", "draft acceptance rate (acc/draft tokens)"),
        ("sglang_accept_length", "SGLang accept length (gauge, bonus inside)"),
        ("sglang_accept_rate", "SGLang accept rate (gauge)"),
    ):
        if spec.get(key) is not None:
            rows.append((label, _fmt(spec[key], 3)))
    if spec.get("per_position_rates"):
        rows.append(("Pr(K>=i), i=1..", " ".join(_fmt(r, 3) for r in spec["per_position_rates"])))
        rows.append(("conditional a_i", " ".join(_fmt(r, 3) for r in spec["conditional_rates"])))
    rows.extend(("warning", w) for w in spec.get("warnings") or [])
    return rows


def render_report(
    console: Console, title: str, columns: dict[str, dict[str, Any]], ratios: dict | None
) -> None:
    """One table with a column per endpoint, speed-up rows for a baseline, warnings below. Every title,
    name and value is escaped (:func:`~specledger.probe.safe_text.safe`): they may come from a server."""
    table = Table(title=safe(title, 200))
    table.add_column("figure")
    for name in columns:
        table.add_column(safe(name, 200), overflow="fold")
    per_column: dict[str, dict[str, str]] = {}
    warnings: list[tuple[str, str]] = []
    for name, report in columns.items():
        missing = report.get("spec_decode_note") or NO_METRICS_REASON
        rows = summary_rows(report["summary"]) + spec_rows(report.get("spec_decode"), missing)
        per_column[name] = {label: value for label, value in rows if label != "warning"}
        warnings += [(name, value) for label, value in rows if label == "warning"]
        warnings += [(name, w) for w in report.get("warnings") or []]
    labels = list(dict.fromkeys(label for rows in per_column.values() for label in rows))
    for label in labels:
        table.add_row(safe(label), *[safe(rows.get(label, "-"), 4 * MAX_CELL) for rows in per_column.values()])
    if ratios:
        table.add_row("speed-up: throughput ratio", safe(_fmt(ratios.get("throughput_ratio"), 3)))
        table.add_row("speed-up: TPOT ratio (base/cand)", safe(_fmt(ratios.get("tpot_ratio"), 3)))
    console.print(table)
    for name, warning in dict.fromkeys((str(n), str(w)) for n, w in warnings):
        console.print(f"[yellow]warning ({safe(name, 200)}):[/yellow] {safe(warning, 400)}")


def probe(
    url: Annotated[
        str | None, typer.Argument(help="Server root, e.g. http://127.0.0.1:8000 (none with --launch)")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(help="Closed loop: requests in flight (default 4)")
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="Open loop: Poisson arrivals, requests per second")
    ] = None,
    requests: Annotated[int, typer.Option(help="Number of requests (upper bound)")] = 16,
    duration: Annotated[float | None, typer.Option(help="Stop starting requests after S seconds")] = None,
    workload: Annotated[
        Path | None, typer.Option(help="JSONL of {prompt} or {messages} (+ id, category, reference)")
    ] = None,
    categories: Annotated[
        str | None, typer.Option(help="Built-in categories instead, comma-separated (e.g. code,math): scored")
    ] = None,
    n: Annotated[int, typer.Option("--n", help="Items per built-in category (with --categories)")] = 2,
    max_tokens: Annotated[int, typer.Option(help="max_tokens per request")] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy: the correctness gate compares outputs")] = 0.0,
    top_p: Annotated[float, typer.Option()] = 1.0,
    seed: Annotated[int, typer.Option(help="Sampling seed sent to the server and Poisson seed")] = 0,
    stop: Annotated[list[str] | None, typer.Option(help="Stop string (repeatable)")] = None,
    chat: Annotated[bool, typer.Option("--chat/--completions", help="Endpoint flavour")] = False,
    model: Annotated[str | None, typer.Option(help="Model name (default: first of /v1/models)")] = None,
    metrics: Annotated[bool, typer.Option("--metrics/--no-metrics", help="Scrape URL/metrics")] = True,
    tokenizer: Annotated[
        Path | None, typer.Option(help="tokenizer.json: tokens per chunk, and token ids for the correctness gate")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout (s)")] = 120.0,
    baseline: Annotated[str | None, typer.Option(help="Second endpoint: same load, speed-up shown")] = None,
    baseline_model: Annotated[str | None, typer.Option(help="Model name on the baseline endpoint")] = None,
    label: Annotated[str, typer.Option(help="Drafter name of URL in the report (e.g. eagle3)")] = ENDPOINT_DRAFTER,
    gamma: Annotated[
        str | None, typer.Option(help="Gamma label of URL in the report (default: positions seen in /metrics)")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Run folder: traces.jsonl, run.json, probe.json, then the report")
    ] = None,
    loads: Annotated[
        str | None,
        typer.Option(help="Concurrencies, e.g. 1,4,16,64: both endpoints at each load, closed loop over the same "
                     "max(--requests, load) requests, alternating which goes first; with --baseline the gates, "
                     "verdict and schedule per load (as `specledger run --loads`), without it the figures per "
                     "load and no verdict. Not with --concurrency / --rate."),
    ] = None,
    slo: Annotated[
        Path | None, typer.Option(help="SLO file (TOML/JSON) for the gates: latency/capacity targets, target_load")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
    header: Annotated[
        list[str] | None,
        typer.Option("--header", help="Extra request header 'Name: value' (repeatable), e.g. 'Authorization: "
                     "Bearer KEY'; sent to both endpoints, never written to a file or printed"),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", envvar="OPENAI_API_KEY", show_envvar=True,
                     help="Sent as 'Authorization: Bearer KEY' (unless --header gives an Authorization); never "
                     "written. Credentials in the URL (http://user:pass@host) are sent as Basic auth and "
                     "left out of every file and message."),
    ] = None,
    launch: Annotated[
        str | None,
        typer.Option("--launch", help="Start the engine yourself, once per --spec: its command line with {port} "
                     "(a free port is picked) and {spec} (each --spec's arguments; appended when absent), e.g. "
                     "'llama-server -m MODEL --port {port} --metrics -np 4 {spec}'. Each is probed at every "
                     "--loads with the same prompts, then stopped; needs --out (logs and finished "
                     "configurations are kept there; the same command resumes)."),
    ] = None,
    spec: Annotated[
        list[str] | None,
        typer.Option("--spec", help="With --launch: NAME=ARGS, one speculative configuration (repeatable); "
                     "the one named off is the baseline, e.g. --spec off= --spec 'ngram=--spec-type ngram-simple'"),
    ] = None,
    launch_port: Annotated[
        int | None, typer.Option(help="With --launch: this port instead of a free one (it must be free)")
    ] = None,
    launch_timeout: Annotated[
        float, typer.Option(help="With --launch: seconds an engine may take to answer GET /health")
    ] = 600.0,
    repeats: Annotated[
        int, typer.Option(help="With --launch: run every configuration this many times, the order reversed every "
                          "other time (off, ngram | ngram, off | ...); the repeats' requests are pooled")
    ] = 1,
) -> None:
    """Measure an OpenAI-compatible endpoint under load: TTFT, TPOT, ITL, stalls, spec-decode.

    With --out DIR the requests are also written as a run (traces.jsonl + run.json) and the report is
    built: with --baseline URL2 (drafter "none") it shows the paired speed-up and the four gates.
    With --loads 1,4,16 both endpoints run at each load and the verdict is a schedule: load -> setting.
    With --launch CMD --spec off= --spec NAME=ARGS ... it starts the engine once per configuration itself,
    probes each at every load, and decides each against off (specledger/probe/launch.py).
    """
    launching = _check_launch_options(url, launch, spec, baseline, concurrency, rate, out, launch_port, repeats)
    if concurrency is not None and rate is not None:
        raise SpecLedgerError("give either --concurrency or --rate, not both")
    load_list = parse_loads(loads)
    if load_list is not None and (concurrency is not None or rate is not None):
        raise SpecLedgerError("give either --loads (every concurrency to probe) or --concurrency/--rate, not both")
    if workload is not None and categories:
        raise SpecLedgerError("give either --workload or --categories, not both")
    label = check_label(label)
    headers = parse_headers(header, api_key)
    from specledger.gates import check_target_load, load_slo

    slo_obj = load_slo(slo)  # a bad SLO file fails before any request is sent
    if load_list is not None:
        check_target_load(slo_obj, load_list)
    if out is not None:
        check_new_run_dir(out)
    wl = select_workload(workload, categories, n, seed)
    tok = load_tokenizer(tokenizer)

    def config_for(endpoint_model: str | None) -> LoadConfig:
        return LoadConfig(
            base_url="",
            model=endpoint_model or "",
            chat=chat,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop or None,
            concurrency=concurrency if rate is None else None,
            rate=rate,
            num_requests=requests,
            duration_s=duration,
            arrival_seed=seed,
            timeout_s=timeout,
            headers=dict(headers),
        )

    if concurrency is None and rate is None:
        concurrency = 4
    config_for(model).validate()
    if launching is not None:
        _run_launch(str(launch), launching, load_list or [1], config_for(model), wl, out, launch_port,
                    launch_timeout, tok, slo_obj, as_json, repeats)
        return
    assert url is not None  # _check_launch_options: a URL or --launch
    if load_list is not None:
        points = run_probe_loads(url, config_for(model), wl.items, load_list, baseline=baseline,
                                 baseline_config=config_for(baseline_model), metrics=metrics, tokenizer=tok)
        if out is not None:
            summary = write_probe_loads_dir(out, points, wl, label, gamma, tok, slo_obj)
        else:
            summary = summary_in_memory(points, wl, label, gamma, tok, slo_obj)
        show_loads(points, summary, out, as_json)
        return
    full, results, base_results = run_probe(
        url, config_for(model), wl.items, baseline=baseline, baseline_config=config_for(baseline_model),
        metrics=metrics, tokenizer=tok,
    )
    report, base_report, ratios = full["probe"], full.get("baseline"), full.get("speedup")
    columns = {report["url"]: report}
    if base_report is not None:
        columns[f"baseline {base_report['url']}"] = base_report
    summary = None
    if out is not None:
        summary = write_probe_dir(out, full, results, base_results, wl, label, gamma, tok, slo_obj)
    if as_json:
        typer.echo(json.dumps(without_results(full), indent=2, default=str))
        return
    console = Console()
    render_report(console, "specledger probe", columns, ratios)
    if out is not None:
        print_run_report(console, out, summary)


def _check_launch_options(url: str | None, launch: str | None, spec: list[str] | None, baseline: str | None,
                          concurrency: int | None, rate: float | None, out: Path | None,
                          launch_port: int | None, repeats: int = 1) -> list[Any] | None:
    """The parsed ``--spec`` list with ``--launch`` (None without it); a one-line error for every combination
    that cannot work, before any engine starts."""
    from specledger.probe.launch import check_template, parse_specs

    if launch is None:
        if spec or launch_port is not None or repeats != 1:
            raise SpecLedgerError("--spec, --launch-port and --repeats go with --launch CMD (the engine's command "
                                  "line)")
        if url is None:
            raise SpecLedgerError("give the server's URL (e.g. http://127.0.0.1:8000), or --launch CMD to start it")
        return None
    if url is not None or baseline is not None:
        raise SpecLedgerError("--launch starts the engines itself: give no URL and no --baseline")
    if concurrency is not None or rate is not None:
        raise SpecLedgerError("--launch probes at --loads (e.g. --loads 1,4), not --concurrency / --rate")
    if out is None:
        raise SpecLedgerError("--launch needs --out DIR: the engines' logs and each finished configuration go there")
    if repeats < 1:
        raise SpecLedgerError(f"--repeats {repeats}: give 1 or more")
    if launch_port is not None and not 0 < launch_port < 65536:
        raise SpecLedgerError(f"--launch-port {launch_port} is not a port; give 1-65535")
    check_template(launch)
    return parse_specs(spec or [])


def _run_launch(template: str, specs: list[Any], loads: list[int], config: LoadConfig, wl: Any, out: Path | None,
                port: int | None, ready_timeout: float, tok: Any, slo_obj: Any, as_json: bool, repeats: int) -> None:
    from specledger.probe.launch import run_launch, write_launch_dir
    from specledger.probe.loads_cli import show_launch

    assert out is not None
    runs = run_launch(template, specs, loads, config, wl, out, port=port, ready_timeout_s=ready_timeout,
                      tokenizer=tok, progress=lambda m: typer.echo(safe(m, 600), err=True), repeats=repeats)
    summary = write_launch_dir(out, runs, template, specs, loads, config, wl, tok, slo_obj, repeats)
    show_launch(runs, summary, out, as_json)


Imported = tuple[int, str | None, dict[str, Any]]  # (1-based index, model, import document)


def _write_and_show(file: Path, documents: list[Imported], out: Path | None, as_json: bool, title: str,
                    kind: str, filename: str) -> None:
    """Write one run folder per document (OUT itself for one, OUT/record-N for several) and build its
    report; print the summaries as JSON or as one table with a column per document."""
    written = []
    if out is not None:
        from specledger.report.build import build_report

        for index, model, document in documents:
            target = out if len(documents) == 1 else out / f"record-{index}"
            write_import_run(target, document, model, kind=kind, filename=filename)
            written.append(build_report(target)[1])
    if as_json:
        payload = [d["summary"] for _, _, d in documents]
        typer.echo(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2, default=str))
        return
    console = Console()
    console.print(f"{safe(file)}: {safe(FORMAT_NAMES.get(kind, kind))} (format detected)")
    columns = {
        f"result {index}" if len(documents) > 1 else kind: {
            "summary": document["summary"],
            "spec_decode": document["summary"].get("spec_decode"),
            "spec_decode_note": document["summary"].get("spec_decode_note"),
            "warnings": [],
        }
        for index, _, document in documents
    }
    render_report(console, f"{title}: {documents[0][1] or file.name}", columns, None)
    for index, _, document in documents:
        ledger = document["acceptance_ledger"]
        if isinstance(ledger.get("el_from_per_position"), (int, float)):
            console.print(f"result {index}: E[L] = 1 + Σ Pr(K ≥ i) from the per-position rates: "
                          f"{ledger['el_from_per_position']:.3f}")
    for html_path in written:
        console.print(f"wrote {safe(html_path.parent / filename)}; report: {safe(html_path)}")


#: what ``import`` and ``inspect`` say they found
FORMAT_NAMES = {VLLM_BENCH_KIND: "vllm bench serve result", GUIDELLM_KIND: "guidellm report",
                "prometheus": "Prometheus /metrics dump", "sse": "SSE stream capture",
                "vllm-bench": "vllm bench serve result"}


def _source(file: Path, index: int, count: int) -> str:
    return str(file) if count == 1 else f"{file}#{index}"


OutOption = Annotated[
    Path | None,
    typer.Option(help="Run folder: the normalised import + run.json, then the report; with several results, "
                 "one folder per result (OUT/record-N)"),
]
RecordOption = Annotated[int | None, typer.Option(help="Only result N (1-based) of a file that holds several")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the normalised summary as JSON")]


def import_vllm_bench(
    file: Annotated[Path, typer.Argument(help="JSON or JSON Lines written by `vllm bench serve --save-result`")],
    out: OutOption = None,
    record: RecordOption = None,
    as_json: JsonOption = False,
) -> None:
    """Read `vllm bench serve` results (one JSON, or JSON Lines of several runs) and show them with the
    probe's figures and caveats."""
    chosen = records_of(load_vllm_bench_records(file), record)
    documents = [
        (i, r.model_id, vllm_bench_document(_source(file, i, len(chosen)), r.summary(), r.model_dump()))
        for i, r in chosen
    ]
    _write_and_show(file, documents, out, as_json, "vllm bench serve", VLLM_BENCH_KIND, VLLM_BENCH_JSON)


def import_guidellm(file: Path, out: Path | None, record: int | None, as_json: bool) -> None:
    """A guidellm report: one document (and run folder) per benchmark of the report."""
    raw, summaries = load_guidellm(file)
    version = guidellm_version(raw)
    chosen = [(i, s) for i, s in enumerate(summaries, start=1) if record is None or i == record]
    if not chosen:
        raise SpecLedgerError(f"--record {record} is out of range: the report holds {len(summaries)} benchmark(s)")
    model = (raw.get("config") or {}).get("model") if isinstance(raw.get("config"), dict) else None
    documents = [
        (i, model if isinstance(model, str) else None,
         vllm_bench_document(_source(file, i, len(chosen)), s, {"benchmark_index": i - 1}, GUIDELLM_NOTE, version))
        for i, s in chosen
    ]
    _write_and_show(file, documents, out, as_json, "guidellm", GUIDELLM_KIND, GUIDELLM_JSON)


def import_file(
    file: Annotated[Path, typer.Argument(help="A `vllm bench serve` result (JSON / JSON Lines) or a guidellm report")],
    out: OutOption = None,
    record: RecordOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import a benchmark result file, whatever wrote it (the format is sniffed), into a run folder."""
    from specledger.probe.inspect_file import read_text, sniff

    kind = sniff(read_text(file))
    if kind == "guidellm":
        import_guidellm(file, out, record, as_json)
    elif kind == "vllm-bench":
        import_vllm_bench(file, out, record, as_json)
    else:
        raise SpecLedgerError(
            f"{file} is a {kind} file, not a benchmark result; `specledger inspect {file}` shows what it holds"
        )


def inspect(
    file: Annotated[Path, typer.Argument(help="/metrics dump, SSE capture, vllm bench result or guidellm report")],
    as_json: Annotated[bool, typer.Option("--json", help="Print what was found as JSON")] = False,
) -> None:
    """Show what a saved file holds: engine, spec-decode figures (with definitions), latency, tokens per
    chunk, and one line per thing that could not be read."""
    from specledger.probe.inspect_file import inspect_file

    found = inspect_file(file)
    if as_json:
        typer.echo(json.dumps(found, indent=2, default=str))
        return
    console = Console()
    console.print(f"{safe(file)}: {safe(FORMAT_NAMES.get(found['format'], found['format']))} (format detected); "
                  f"engine {safe(found.get('engine') or 'not stated', 200)}; "
                  f"version {safe(found.get('version') or 'not stated', 200)}")
    if found.get("records"):
        columns = {f"result {i}": {"summary": r, "spec_decode": r.get("spec_decode"),
                                   "spec_decode_note": r.get("spec_decode_note"), "warnings": []}
                   for i, r in enumerate(found["records"], start=1)}
        render_report(console, f"{found['format']} results", columns, None)
    table = Table(title="what the file holds", show_header=False)
    for label, value in _inspect_rows(found):
        table.add_row(safe(label, 200), safe(value, 4 * MAX_CELL))
    if table.row_count:
        console.print(table)
    for term, meaning in found["definitions"].items():
        console.print(f"[dim]{safe(term)}: {safe(meaning)}[/dim]")
    for line in found["unread"]:
        console.print(f"[yellow]not read:[/yellow] {safe(line, 400)}")


def _inspect_rows(found: dict[str, Any]) -> list[tuple[str, str]]:
    """Rows of a dump or a stream capture (benchmark results are shown as a result table instead)."""
    rows: list[tuple[str, str]] = []
    if found["format"] == "prometheus":
        rows += spec_rows(found.get("spec_decode"), "none in this dump")
        for key, h in (found.get("latency") or {}).items():
            rows.append((f"{key} ({h['metric']})",
                         f"mean {_fmt(h['mean_s'], 4)} s, p50/p95/p99 {_fmt(h['p50_s'], 4)} / {_fmt(h['p95_s'], 4)}"
                         f" / {_fmt(h['p99_s'], 4)} s over {_fmt(h['count'], 0)}: {h['definition']}"))
        for label, rate in (found.get("rates") or {}).items():
            rows.append((label, _fmt(rate["value"])))
    elif found["format"] == "sse":
        for key, value in found["stream"].items():
            rows.append((key.replace("_", " "), _fmt(value) if not isinstance(value, list)
                         else ", ".join(map(str, value))))
        rows += _optional_rows({"response_timings": found.get("spec_decode")})
    return [(label, value) for label, value in rows if label != "warning"] + [
        ("warning", value) for label, value in rows if label == "warning"]
