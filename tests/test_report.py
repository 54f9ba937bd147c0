"""The report: summary.json + self-contained report.html from a run folder, and the `report` verb."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
import typer
from synthetic import plain_rounds, request_from_rounds, spec_rounds
from typer.testing import CliRunner

from specledger.cli.report import report
from specledger.errors import SpecLedgerError
from specledger.report import build_report
from specledger.report.plots import FIGURES
from specledger.rundir import append_records


def _write_run(run_dir: Path, n_prompts: int = 6) -> Path:
    """code: ngram γ=2 pays (cheap draft), draft γ=2 slows down (expensive draft); token-identical outputs."""
    records = []
    for i in range(n_prompts):
        pid = f"p{i}"
        jitter = 1 + 0.01 * i
        records.append(
            request_from_rounds(
                f"b{i}", pid, plain_rounds(9, 0.010 * jitter), category="code", t_prefill=0.004, quality=0.5
            )
        )
        for drafter, t_draft in (("ngram", 0.0005), ("draft", 0.02)):
            rounds = spec_rounds(drafter, 2, [2, 2, 2], t_draft, 0.012 * jitter, 0.001)
            records.append(
                request_from_rounds(
                    f"{drafter}{i}", pid, rounds, category="code", t_prefill=0.004, quality=0.5
                )
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    append_records(run_dir / "traces.jsonl", records)
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "model": "synthetic",
                "dtype": "fp32",
                "machine": "ci",
                "started": "2025-01-01T00:00:00",
                "config": {"gammas": [2]},
                "unknown_key": {"nested": [1, 2]},
            }
        )
    )
    return run_dir


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    run_dir = _write_run(tmp_path_factory.mktemp("run"))
    summary, html_path = build_report(run_dir, n_resamples=200)
    return run_dir, summary, html_path


def test_summary_json_round_trips_and_holds_the_figures(built):
    run_dir, summary, _ = built
    loaded = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert loaded == summary
    assert loaded["meta"]["unknown_key"] == {"nested": [1, 2]}
    by_drafter = {s["drafter"]: s for s in loaded["scenarios"]}
    assert by_drafter["ngram"]["speedup"] > 1 > by_drafter["draft"]["speedup"]
    assert by_drafter["draft"]["why"] and "draft cost" in by_drafter["draft"]["why"][-1]
    assert all(g["status"] == "pass" for g in by_drafter["ngram"]["gates"].values())
    (verdict,) = loaded["verdicts"]
    assert verdict["decision"] == "deploy" and verdict["drafter"] == "ngram"
    assert set(loaded["cost_models"]) == {"ngram", "draft"}


def test_report_html_is_self_contained_and_has_every_plot(built):
    run_dir, _, html_path = built
    html = html_path.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]+src\s*=\s*[\"']?(https?:)?//", html, re.I)
    assert not re.search(r"<link[^>]+href\s*=\s*[\"']?(https?:)?//", html, re.I)
    for div_id in FIGURES:
        assert f'id="{div_id}"' in html
    assert 'id="gates-table"' in html and "deploy ngram γ=2" in html
    assert len(html) > 1_000_000  # plotly.js is inlined
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_report_rebuild_is_deterministic_in_its_figures(built):
    run_dir, summary, _ = built
    again, _ = build_report(run_dir, n_resamples=200)
    assert {k: v for k, v in again.items() if k != "generated"} == {
        k: v for k, v in summary.items() if k != "generated"
    }


def test_missing_or_empty_traces_are_user_errors(tmp_path):
    with pytest.raises(SpecLedgerError, match="no traces.jsonl"):
        build_report(tmp_path)
    (tmp_path / "traces.jsonl").write_text("")
    with pytest.raises(SpecLedgerError, match="no complete request"):
        build_report(tmp_path)
    with pytest.raises(SpecLedgerError, match="run directory not found"):
        build_report(tmp_path / "missing")


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("report")(report)
    app.command("noop")(lambda: None)  # keep `report` a sub-command, as in the real CLI
    return app


def test_report_command_prints_table_and_verdict(tmp_path):
    run_dir = _write_run(tmp_path / "run")
    result = CliRunner().invoke(_app(), ["report", str(run_dir), "--resamples", "50"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "deploy ngram γ=2" in result.output and "report.html" in result.output
    as_json = CliRunner().invoke(_app(), ["report", str(run_dir), "--json", "--resamples", "50"])
    assert json.loads(as_json.output)["verdicts"][0]["drafter"] == "ngram"


def test_report_command_applies_the_slo_file(tmp_path):
    run_dir = _write_run(tmp_path / "run")
    slo = tmp_path / "slo.toml"
    slo.write_text("stall_ms = 1\n")  # every stream stalls longer than 1 ms
    result = CliRunner().invoke(
        _app(), ["report", str(run_dir), "--slo", str(slo), "--json", "--resamples", "20"]
    )
    summary = json.loads(result.output)
    assert summary["verdicts"][0]["decision"] == "off"
    assert "latency" in summary["verdicts"][0]["reason"]


# ----------------------------------------------------------------------------- browser


def _png_unique_colours(path: Path, sample_rows: int = 200) -> int:
    """Count distinct RGB(A) pixels in a non-interlaced 8-bit PNG (tiny zlib decoder, no PIL)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and interlace == 0 and colour_type in (2, 6)
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    colours: set[bytes] = set()
    step = max(1, height // sample_rows)
    for y in range(height):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 0xFF
            elif ftype == 2:
                line[x] = (line[x] + b) & 0xFF
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        if y % step == 0:
            colours.update(bytes(line[i : i + 3]) for i in range(0, stride, bpp))
        prev = line
    return len(colours)


@pytest.mark.browser
def test_report_renders_in_headless_chromium(built, tmp_path):
    chromium = shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    _, _, html_path = built
    shot = tmp_path / "shot.png"
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        f"--screenshot={shot}",
        "--window-size=1280,2000",
        "--virtual-time-budget=5000",
        html_path.resolve().as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    console_errors = [
        ln for ln in proc.stderr.splitlines() if "Uncaught" in ln or ("CONSOLE" in ln and "rror" in ln)
    ]
    assert not console_errors, console_errors
    assert _png_unique_colours(shot) > 50  # text, coloured gate cells and plot traces, not a blank page


def test_report_handles_unpaired_scenarios_and_policy_gammas(tmp_path):
    run_dir = _write_run(tmp_path / "run", n_prompts=3)
    lonely = request_from_rounds(
        "x", "lonely", spec_rounds("ngram", 2, [1, 1], 0.001, 0.01), category="other"
    )
    policy = request_from_rounds("y", "p0", spec_rounds("ngram", 3, [3, 1], 0.001, 0.012), category="code")
    policy.gamma = "ema"
    append_records(run_dir / "traces.jsonl", [lonely, policy])
    summary, html_path = build_report(run_dir, n_resamples=20)
    assert summary["unpaired"] == ["other T=0 ngram γ=2"]
    # never deployed
    assert {v["category"]: v["decision"] for v in summary["verdicts"]}["other"] in ("off", "no-decision")
    assert any(s["gamma"] == "ema" and s["speedup"] is not None for s in summary["scenarios"])
    assert "γ=ema" in html_path.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- serving section


def _serving_point(kind, load, drafter, gamma, tp, speedup):
    lat = {"p50": 10.0 * load, "p95": 12.0 * load, "p99": 15.0 * load}
    p = {"kind": kind, "load": load, "drafter": drafter, "gamma": gamma, "requests": 4, "tokens": 64,
         "setting": "plain" if drafter == "none" else f"{drafter} γ={gamma}", "throughput_tok_s": tp,
         "speedup": speedup, "ttft_ms": lat, "tpot_ms": lat, "itl_token_ms": lat, "itl_chunk_ms": lat,
         "tokens_per_chunk": {"mean": 1.0 if drafter == "none" else 1.8}, "longest_stall_ms": 20.0,
         "mean_batch": float(load), "preemptions": 0, "el": None if drafter == "none" else 1.8}
    if drafter != "none":
        p["memory"] = {"batch": load, "gamma": gamma, "m_kv_bytes_per_token": 1024,
                       "predicted_candidate_kv_bytes": load * gamma * 1024,
                       "engine_peak_candidate_kv_bytes": load * gamma * 512, "relative_difference": -0.5,
                       "static_slot_cache_bytes": load * 256 * 1024}
    return p


def _serving_doc(with_context: bool) -> dict:
    conc = []
    for load, s in ((1, 1.4), (4, 1.1), (16, 0.7)):
        conc += [_serving_point("concurrency", load, "none", 0, 100.0 * load, 1.0),
                 _serving_point("concurrency", load, "ngram", 4, 100.0 * load * s, s)]
    ctx = [_serving_point("context", n, d, g, 50.0, s) for n in (256, 1024)
           for d, g, s in (("none", 0, 1.0), ("ngram", 4, 1.2 if n == 256 else 0.9))] if with_context else []
    return {
        "experiment": "serving", "drafters": ["ngram γ=4"], "prompts": ["a", "b"], "categories": ["code"],
        "max_tokens": 16, "context_concurrency": 4, "concurrency": conc, "rate": [], "context": ctx,
        "crossover": {"concurrency": {"ngram γ=4": 16}, **({"context": {"ngram γ=4": 1024}} if with_context else {})},
        "deploy_table": [
            {"kind": "concurrency", "load": 1, "decision": "deploy", "drafter": "ngram", "gamma": 4,
             "setting": "ngram γ=4", "speedup": 1.4, "best_candidate": "ngram γ=4", "throughput_tok_s": 140.0},
            {"kind": "concurrency", "load": 16, "decision": "off", "drafter": None, "gamma": 0,
             "setting": "off", "speedup": 0.7, "best_candidate": "ngram γ=4", "throughput_tok_s": 1600.0},
        ],
        "deploy": {"best_drafter": "ngram", "gamma": 4, "gamma_by_concurrency": {"1": 4, "4": 4, "16": 0},
                   "vllm": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                                   "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 16, 0]]},
                            "note": "ranges from the measured concurrencies"},
                   "sglang_note": "SGLang fixes the draft length per server at launch."},
    }


@pytest.mark.parametrize("with_context", [True, False])
def test_report_renders_the_serving_section(tmp_path, with_context):
    from rich.console import Console

    from specledger.report.console_experiments import print_experiments

    run_dir = _write_run(tmp_path / "run", n_prompts=3)
    (run_dir / "serving.json").write_text(json.dumps(_serving_doc(with_context)), encoding="utf-8")
    summary, html_path = build_report(run_dir, n_resamples=20)
    html = html_path.read_text(encoding="utf-8")
    assert summary["experiments"]["serving"]["deploy"]["best_drafter"] == "ngram"
    for div in ("plot-serving-throughput", "plot-serving-speedup", "plot-serving-tpot", "plot-serving-itl"):
        assert f'id="{div}"' in html
    assert ('id="plot-serving-context"' in html) == with_context
    for table in ("serving-table", "serving-crossover-table", "serving-memory-table", "serving-deploy-table"):
        assert f'id="{table}"' in html
    assert "speed-up &lt; 1 from 16" in html and "num_speculative_tokens_per_batch_size" in html
    assert "-50.0%" in html and "4.0 KiB" in html  # memory ledger: relative difference and predicted bytes
    console = Console(width=220, record=True)
    print_experiments(summary, console)
    text = console.export_text()
    assert "deploy table" in text and "deploy ngram" in text and "off" in text
    assert "γ by concurrency {1: 4, 4: 4, 16: 0}" in text


def test_report_without_serving_json_has_no_serving_section(built):
    _, _, html_path = built
    html = html_path.read_text(encoding="utf-8")
    assert 'id="serving"' not in html and "plot-serving" not in html
