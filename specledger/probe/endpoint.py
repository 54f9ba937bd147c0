"""Measure one OpenAI-compatible endpoint: discover its model, scrape ``/metrics`` before and after,
run the load (:mod:`specledger.probe.loadgen`), and summarise (:mod:`specledger.probe.metrics`).
Only the URLs given are ever contacted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import httpx

from specledger.errors import SpecLedgerError
from specledger.probe.documents import EndpointReport, ProbeDocument, SpecCountersSnapshot
from specledger.probe.fetch import fetch, redact_url, split_credentials
from specledger.probe.histograms import counter_rates, latency_histogram_summaries
from specledger.probe.loadgen import LoadConfig, PromptItem, RequestResult, Tokenizer, run_load
from specledger.probe.metrics import speedup, summarize
from specledger.probe.prometheus import MetricsSnapshot, parse_prometheus_text
from specledger.probe.spec_figures import SpecDecodeCounters, spec_counter_engine, spec_decode_figures


def normalize_base_url(url: str) -> str:
    """``http(s)://host:port[/v1][/]`` -> ``http(s)://host:port`` (the server root); user info is kept
    (:func:`endpoint_target` takes it out), and never shown in the error."""
    url = url.strip()
    if not url.startswith(("http://", "https://")):
        raise SpecLedgerError(f"URL {redact_url(url)!r} must start with http:// or https://, "
                              "e.g. http://127.0.0.1:8000")
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def endpoint_target(url: str) -> tuple[str, dict[str, str]]:
    """(server root without credentials, the ``Authorization`` header its ``user:pass@`` gave, if any):
    the root is what every file and message names (:func:`specledger.probe.fetch.split_credentials`)."""
    return split_credentials(normalize_base_url(url))


def _unreachable(url: str, exc: Exception) -> SpecLedgerError:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return SpecLedgerError(f"cannot reach {url} ({reason}); check the URL and that the server is running")


def discover_model(base_url: str, model: str | None, timeout_s: float = 10.0,
                   headers: Mapping[str, str] | None = None) -> str:
    """``model`` or the first id of GET /v1/models (read with :func:`~specledger.probe.fetch.fetch`: a total
    timeout and a size bound); an unreachable server is a SpecLedgerError."""
    try:
        response = fetch(f"{base_url}/v1/models", headers=headers, timeout_s=timeout_s)
    except httpx.HTTPError as exc:
        raise _unreachable(base_url, exc) from None
    if model:
        return model
    try:
        ids = [m["id"] for m in json.loads(response.body)["data"]] if response.status == 200 else []
    except (ValueError, KeyError, TypeError, RecursionError):
        ids = []
    if not ids or not isinstance(ids[0], str) or not ids[0]:
        raise SpecLedgerError(
            f"{base_url}/v1/models lists no model (HTTP {response.status}); pass --model"
        )
    return ids[0]


def scrape_metrics(base_url: str, timeout_s: float = 10.0,
                   headers: Mapping[str, str] | None = None) -> tuple[MetricsSnapshot | None, str | None]:
    """(snapshot, None) or (None, why not); a malformed, too slow or too large body is reported, not raised."""
    try:
        response = fetch(f"{base_url}/metrics", headers=headers, timeout_s=timeout_s)
    except httpx.HTTPError as exc:
        return None, f"metrics scrape failed: {type(exc).__name__}" + (f" ({exc})" if str(exc) else "")
    if response.status != 200:
        return None, f"{base_url}/metrics answered HTTP {response.status}"
    try:
        return parse_prometheus_text(response.text()), None
    except SpecLedgerError as exc:
        return None, str(exc)


def load_tokenizer(path: Path | None) -> Tokenizer | None:
    """A ``tokenizer.json`` file -> callable text -> token ids (no special tokens)."""
    if path is None:
        return None
    from tokenizers import Tokenizer as HFTokenizer

    try:
        tok = HFTokenizer.from_file(str(path))
    except Exception as exc:
        raise SpecLedgerError(f"cannot load tokenizer {path} ({exc}); pass a tokenizer.json file") from None
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def probe_endpoint(url: str, config: LoadConfig, items: list[PromptItem], metrics: bool = True,
                   tokenizer: Tokenizer | None = None) -> EndpointReport:
    """Run one load against ``url``; the report holds config, summary, spec-decode and results."""
    return probe_endpoint_results(url, config, items, metrics, tokenizer)[0]


def _counters(snapshot: MetricsSnapshot | None) -> SpecCountersSnapshot | None:
    if snapshot is None:
        return None
    engine = spec_counter_engine(snapshot)
    if engine is None or engine.spec is None:
        return None
    c = SpecDecodeCounters.from_snapshot(snapshot, engine.spec)
    return {
        "engine": engine.engine,
        "num_drafts": c.num_drafts,
        "num_draft_tokens": c.num_draft_tokens,
        "num_accepted_tokens": c.num_accepted_tokens,
        "accepted_per_pos": {str(k): v for k, v in sorted(c.accepted_per_pos.items())},
    }


def probe_endpoint_results(
    url: str,
    config: LoadConfig,
    items: list[PromptItem],
    metrics: bool = True,
    tokenizer: Tokenizer | None = None,
) -> tuple[EndpointReport, list[RequestResult]]:
    """:func:`probe_endpoint`'s report and the per-request results it was built from."""
    base_url, url_auth = endpoint_target(url)
    config.base_url = base_url
    config.headers = {**config.headers, **url_auth}
    config.model = discover_model(base_url, config.model or None, headers=config.headers)
    warnings: list[str] = []
    before = after = None
    if metrics:
        before, why = scrape_metrics(base_url, headers=config.headers)
        if why:
            warnings.append(why)
    run = asyncio.run(run_load(config, items, tokenizer=tokenizer))
    if metrics and before is not None:
        after, why = scrape_metrics(base_url, headers=config.headers)
        if why:
            warnings.append(why)
    report: EndpointReport = {
        "url": base_url,
        "model": config.model,
        "config": run.config,
        "summary": summarize(run.results, run.wall_time_s),
        "spec_decode": None,
        "server_histograms": {},
        "warnings": warnings,
        "results": [r.to_dict() for r in run.results],
    }
    if before is not None and after is not None:
        report["spec_decode"] = spec_decode_figures(before, after).to_dict()
        report["spec_decode_counters"] = {"before": _counters(before), "after": _counters(after)}
        report["server_histograms"] = latency_histogram_summaries(before, after)
        report["server_rates"] = counter_rates(before, after)
    if report["summary"]["requests_ok"] == 0:
        first = next((r.error for r in run.results if r.error), "no request finished")
        warnings.append(f"every request failed; first error: {first}")
    return report, run.results


def run_probe(
    url: str,
    config: LoadConfig,
    items: list[PromptItem],
    *,
    baseline: str | None = None,
    baseline_config: LoadConfig | None = None,
    metrics: bool = True,
    tokenizer: Tokenizer | None = None,
) -> tuple[ProbeDocument, list[RequestResult], list[RequestResult]]:
    """The same load on ``url`` and, when given, on ``baseline``: returns (full, results, baseline
    results) with ``full = {"probe": report[, "baseline": report, "speedup": ratios]}``."""
    report, results = probe_endpoint_results(url, config, items, metrics=metrics, tokenizer=tokenizer)
    full: ProbeDocument = {"probe": report}
    base_results: list[RequestResult] = []
    if baseline:
        base_report, base_results = probe_endpoint_results(
            baseline, baseline_config or config, items, metrics=metrics, tokenizer=tokenizer
        )
        full["baseline"] = base_report
        full["speedup"] = speedup(report["summary"], base_report["summary"])
    return full, results, base_results


__all__ = [
    "discover_model",
    "endpoint_target",
    "load_tokenizer",
    "normalize_base_url",
    "probe_endpoint",
    "probe_endpoint_results",
    "run_probe",
    "scrape_metrics",
]
