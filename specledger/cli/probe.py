"""CLI verbs ``probe``, ``import-vllm-bench``, ``import`` and ``inspect`` (registered by specledger/cli/__init__.py):
parse the flags, call the library (:mod:`~specledger.probe.options`, :mod:`~specledger.probe.endpoint`,
:mod:`~specledger.probe.endpoint_loads`, :mod:`~specledger.probe.launch`, :mod:`~specledger.probe.outputs`), build the
report from the run folder the library wrote, print (:mod:`specledger.cli.probe_show`).

``probe`` loads an OpenAI-compatible streaming endpoint (fixed concurrency or Poisson rate),
times every chunk, scrapes ``URL/metrics`` before and after for spec-decode counters, and
prints one summary table; ``--baseline URL2`` repeats the same load on a second endpoint
and prints the speed-up. ``--loads 1,4,16`` probes both endpoints at each concurrency
(:mod:`~specledger.probe.endpoint_loads`) and ends in the per-load gates, verdicts and schedule of
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

from specledger.cli.probe_show import print_run_report, render_report, show_launch, show_loads
from specledger.errors import SpecLedgerError
from specledger.probe.bounds import check_some_succeeded
from specledger.probe.endpoint import run_probe
from specledger.probe.endpoint_loads import LoadPoint, run_probe_loads, without_results
from specledger.probe.imports import Imported, benchmark_kind, guidellm_documents, vllm_bench_documents
from specledger.probe.launch import run_launch
from specledger.probe.launch_dir import write_launch_dir
from specledger.probe.options import ProbeOptions, ProbePlan, plan_probe
from specledger.probe.outputs import (
    GUIDELLM_KIND,
    VLLM_BENCH_KIND,
    import_target,
    probe_loads_run,
    write_import_run,
    write_probe_dir,
    write_probe_loads_dir,
)
from specledger.probe.records import ENDPOINT_DRAFTER
from specledger.probe.safe_text import safe
from specledger.probe.tables import (
    FORMAT_NAMES,
    MAX_CELL,
    import_columns,
    import_el_lines,
    inspect_columns,
    inspect_rows,
)
from specledger.rundir import GUIDELLM_JSON, VLLM_BENCH_JSON


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
                     "load and no verdict. A range 1..16 measures both ends, then bisects in powers of two where "
                     "S against 1 changes (per category) until it is bracketed within 2x. Not with --concurrency / "
                     "--rate."),
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
    budget: Annotated[
        str | None,
        typer.Option(help="Race within this time (e.g. 90s, 6m), as `specledger run`: 2 prompts of every category "
                     "to every configuration and the baseline at load 1, then more prompts where a decision is "
                     "open, for the settings still in contention (a launched configuration that is out is not "
                     "started again); then --loads > 1. With --launch, or a URL with --baseline; resumable.")
    ] = None,
    mix: Annotated[
        str | None,
        typer.Option(help="The traffic's mix for the one recommendation over all categories, e.g. "
                     "code=0.5,agent=0.5 (default: each category's share of the workload's prompts)")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="The full tables after the answer")] = False,
    deadline: Annotated[
        float | None,
        typer.Option(help="Seconds each endpoint's load may take in all (requests in flight end at it, none start "
                     "after it); default: the requests' waves times --timeout, plus 10 s"),
    ] = None,
) -> None:
    """Measure an OpenAI-compatible endpoint under load: TTFT, TPOT, ITL, stalls, spec-decode.

    With --out DIR the requests are also written as a run (traces.jsonl + run.json) and the report is
    built: with --baseline URL2 (drafter "none") it shows the paired speed-up and the four gates.
    With --loads 1,4,16 both endpoints run at each load and the verdict is a schedule: load -> setting.
    With --launch CMD --spec off= --spec NAME=ARGS ... it starts the engine once per configuration itself,
    probes each at every load, and decides each against off (specledger/probe/launch.py).
    """
    _probe(ProbeOptions(**locals()))


def _report(out: Path, slo: Any = None, watch: Any = None) -> Any:
    """Build the report of the run folder the library wrote; (summary, html path). ``watch``'s finding (a
    :class:`~specledger.mainjob.disturbance.ProbeWatch`) goes into run.json's ``disturbance`` first."""
    from specledger.report.build import build_report
    from specledger.rundir import RunDir

    if watch is not None and (finding := watch.finding()):
        meta = (rd := RunDir(out)).meta()
        rd.write_meta({**meta, "disturbance": finding})
    return build_report(out, slo)


def _budget_s(o: ProbeOptions) -> float | None:
    """``--budget`` in seconds (None: no race); a one-line error where nothing can be raced."""
    from specledger.mainjob.options import parse_budget

    value = parse_budget(o.budget)
    if value is None or value is False:
        return None
    if o.launch is None and o.baseline is None:
        raise SpecLedgerError("--budget races the settings against plain decoding: give --baseline URL2 (the same "
                              "model without speculation), or --launch with --spec off=")
    if o.concurrency is not None or o.rate is not None:
        raise SpecLedgerError("--budget races at load 1 and then at --loads; not with --concurrency / --rate")
    if o.repeats != 1:
        raise SpecLedgerError("--budget races in rounds that already alternate the order; drop --repeats")
    return float(value)


def _print_workload_warnings(plan: ProbePlan) -> None:
    """The workload reader's warnings, folded per kind (:func:`specledger.workloads.jsonl.fold_warnings`), once
    each on stderr before any request, as ``run`` prints them."""
    from specledger.workloads.jsonl import workload_warning

    for message in plan.workload.warnings:
        typer.echo(f"warning: {safe(workload_warning(plan.workload.source, message), 400)}", err=True)


def _probe(o: ProbeOptions) -> None:
    """The verb, while a :class:`~specledger.mainjob.disturbance.ProbeWatch` reads the machine every second (a
    local endpoint's server counted as ours): its finding goes into the answer and summary.json."""
    from specledger.mainjob.disturbance import ProbeWatch, local_servers, watching

    with ProbeWatch(local_servers([o.url, o.baseline]) if watching() else set()) as watch:  # no /proc scan when off
        _probe_watched(o, watch)


def _probe_watched(o: ProbeOptions, watch: Any) -> None:
    from specledger.gates.mix import mix_weights, parse_mix

    budget_s = _budget_s(o)
    plan = plan_probe(o)
    if (given := parse_mix(o.mix)) is not None:  # a category the workload lacks fails here, before any request
        mix_weights(plan.workload.categories(), given=given)
        plan.workload.mix = given
    _print_workload_warnings(plan)
    if budget_s is not None:
        _race(plan, budget_s, watch)
        return
    if plan.specs is not None:
        _run_launch(plan, watch)
        return
    assert o.url is not None  # check_launch_options: a URL or --launch
    if plan.loads is not None:
        points = run_probe_loads(o.url, plan.config(o.model), plan.workload.items, plan.loads, baseline=o.baseline,
                                 baseline_config=plan.config(o.baseline_model), metrics=o.metrics,
                                 tokenizer=plan.tokenizer, locate=plan.locate_loads,
                                 categories={pid: e.category for pid, e in plan.workload.entries.items()})
        check_some_succeeded([r for p in points for r in p.results], o.url)  # at every load: one error line
        check_some_succeeded([r for p in points for r in p.base_results], o.baseline or "the baseline")
        if o.out is not None:
            write_probe_loads_dir(o.out, points, plan.workload, plan.label, o.gamma, plan.tokenizer)
            summary = _report(o.out, plan.slo, watch)[0]
        else:
            summary = summary_in_memory(points, plan, watch)
        show_loads(points, summary, o.out, o.as_json, o.verbose)
        return
    full, results, base_results = run_probe(
        o.url, plan.config(o.model), plan.workload.items, baseline=o.baseline,
        baseline_config=plan.config(o.baseline_model), metrics=o.metrics, tokenizer=plan.tokenizer,
    )
    check_some_succeeded(results, full["probe"]["url"])  # every request failed: one error line, exit 2
    check_some_succeeded(base_results, (full.get("baseline") or {}).get("url", "the baseline"))
    if finding := watch.finding():  # probe.json and --json carry it too
        full["disturbance"] = finding
    report, base_report, ratios = full["probe"], full.get("baseline"), full.get("speedup")
    columns = {report["url"]: report}
    if base_report is not None:
        columns[f"baseline {base_report['url']}"] = base_report
    summary = None
    if o.out is not None:
        write_probe_dir(o.out, full, results, base_results, plan.workload, plan.label, o.gamma, plan.tokenizer)
        summary = _report(o.out, plan.slo, watch)[0]
    if o.as_json:
        typer.echo(json.dumps(without_results(full), indent=2, default=str))
        return
    console = Console()
    if o.verbose or base_report is None or summary is None:  # without a baseline the figures are the answer
        render_report(console, "specledger probe", columns, ratios)
        if summary is None and full.get("disturbance"):  # else the answer's first lines say it
            console.print(full["disturbance"]["line"], markup=False, highlight=False)
    if o.out is not None:
        print_run_report(console, o.out, summary, o.verbose)


def summary_in_memory(points: list[LoadPoint], plan: ProbePlan, watch: Any = None) -> dict[str, Any] | None:
    """Without --out: the same summary (gates, verdicts, schedule) from the records kept in memory (with
    ``watch``'s disturbance finding)."""
    from specledger.report.summary import summarize

    records, meta = probe_loads_run(points, plan.workload, plan.label, plan.options.gamma, plan.tokenizer, "probe")
    meta["disturbance"] = watch.finding() if watch is not None else None
    return summarize(records, meta, plan.slo) if records else None


def _run_launch(plan: ProbePlan, watch: Any = None) -> None:
    o = plan.options
    assert o.out is not None and o.launch is not None and plan.specs is not None
    loads, config = plan.loads or [1], plan.config(o.model)
    runs = run_launch(o.launch, plan.specs, loads, config, plan.workload, o.out, port=o.launch_port,
                      ready_timeout_s=o.launch_timeout, tokenizer=plan.tokenizer,
                      progress=lambda m: typer.echo(safe(m, 600), err=True), repeats=o.repeats)
    write_launch_dir(o.out, runs, o.launch, plan.specs, loads, config, plan.workload, plan.tokenizer, o.repeats)
    summary, _html = _report(o.out, plan.slo, watch)  # the summary carries launch and engine_counters (run.json)
    show_launch(runs, summary, o.out, o.as_json, o.verbose)


def _race(plan: ProbePlan, budget_s: float, watch: Any = None) -> None:
    """``--budget``: race (:mod:`specledger.probe.launch_budget`), write the run folder as without it (plus
    run.json's ``race``), build the report, print the answer."""
    from specledger.probe.launch_budget import race_endpoints, race_launch
    from specledger.probe.launch_runs import paired_points

    o = plan.options
    loads = plan.loads or [1]
    say = (lambda m: typer.echo(safe(m, 600), err=True)) if not o.as_json else None
    if plan.specs is not None:
        assert o.out is not None and o.launch is not None
        config = plan.config(o.model)
        runs, race = race_launch(o.launch, plan.specs, loads, config, plan.workload, o.out, budget_s, plan.slo,
                                 port=o.launch_port, ready_timeout_s=o.launch_timeout, tokenizer=plan.tokenizer,
                                 progress=say, locate=plan.locate_loads)
        write_launch_dir(o.out, runs, o.launch, plan.specs, loads, config, plan.workload, plan.tokenizer, race=race)
        summary = _report(o.out, plan.slo, watch)[0]
        show_launch(runs, summary, o.out, o.as_json, o.verbose)
        return
    assert o.url is not None and o.baseline is not None
    runs, race = race_endpoints(o.url, o.baseline, plan.config(o.model), plan.config(o.baseline_model),
                                plan.workload, loads, budget_s, plan.slo, plan.label, o.gamma, o.out,
                                metrics=o.metrics, tokenizer=plan.tokenizer, progress=say, locate=plan.locate_loads)
    points = paired_points(runs["probe"], runs["baseline"])
    gamma = race.get("gamma_label") or o.gamma
    if o.out is not None:
        write_probe_loads_dir(o.out, points, plan.workload, plan.label, gamma, plan.tokenizer, race=race)
        summary = _report(o.out, plan.slo, watch)[0]
    else:
        records, meta = probe_loads_run(points, plan.workload, plan.label, gamma, plan.tokenizer, "probe")
        from specledger.report.summary import summarize

        finding = watch.finding() if watch is not None else None
        summary = summarize(records, {**meta, "race": race, "disturbance": finding}, plan.slo) if records else None
    show_loads(points, summary, o.out, o.as_json, o.verbose)


def _write_and_show(file: Path, documents: list[Imported], out: Path | None, as_json: bool, title: str,
                    kind: str, filename: str) -> None:
    """Write one run folder per document (OUT itself for one, OUT/record-N for several) and build its
    report; print the summaries as JSON or as one table with a column per document."""
    written = []
    if out is not None:
        for index, model, document in documents:
            target = import_target(out, index, len(documents))
            write_import_run(target, document, model, kind=kind, filename=filename)
            written.append(_report(target)[1])
    if as_json:
        payload = [d["summary"] for _, _, d in documents]
        typer.echo(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2, default=str))
        return
    console = Console()
    console.print(f"{safe(file)}: {safe(FORMAT_NAMES.get(kind, kind))} (format detected)")
    render_report(console, f"{title}: {documents[0][1] or file.name}", import_columns(documents, kind), None)
    for line in import_el_lines(documents):
        console.print(line)
    for html_path in written:
        console.print(f"wrote {safe(html_path.parent / filename)}; report: {safe(html_path)}")


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
    _write_and_show(file, vllm_bench_documents(file, record), out, as_json, "vllm bench serve", VLLM_BENCH_KIND,
                    VLLM_BENCH_JSON)


def import_guidellm(file: Path, out: Path | None, record: int | None, as_json: bool) -> None:
    """A guidellm report: one document (and run folder) per benchmark of the report."""
    _write_and_show(file, guidellm_documents(file, record), out, as_json, "guidellm", GUIDELLM_KIND, GUIDELLM_JSON)


def import_file(
    file: Annotated[Path, typer.Argument(help="A `vllm bench serve` result (JSON / JSON Lines) or a guidellm report")],
    out: OutOption = None,
    record: RecordOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import a benchmark result file, whatever wrote it (the format is sniffed), into a run folder."""
    if benchmark_kind(file) == "guidellm":
        import_guidellm(file, out, record, as_json)
    else:
        import_vllm_bench(file, out, record, as_json)


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
        render_report(console, f"{found['format']} results", inspect_columns(found), None)
    table = Table(title="what the file holds", show_header=False)
    for label, value in inspect_rows(found):
        table.add_row(safe(label, 200), safe(value, 4 * MAX_CELL))
    if table.row_count:
        console.print(table)
    for term, meaning in found["definitions"].items():
        console.print(f"[dim]{safe(term)}: {safe(meaning)}[/dim]")
    for line in found["unread"]:
        console.print(f"[yellow]not read:[/yellow] {safe(line, 400)}")
