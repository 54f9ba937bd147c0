"""``specledger probe --launch CMD --spec NAME=ARGS ...``: the launcher starts an engine per configuration (here
tests/launchable_server.py, the fake OpenAI server as a program), probes it at every load, stops it, and decides
each configuration against ``off``; every way an engine can fail is a one-line error naming its log, and the
configurations already finished stay in the run folder (loopback only)."""

from __future__ import annotations

import json
import shlex
import socket
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specledger.cli import app as cli_app
from specledger.errors import SpecLedgerError
from specledger.probe.engine_command import Spec, configured_gamma, engine_argv, engine_kind, parse_specs
from specledger.probe.launch_schedules import engine_flags
from specledger.probe.model_file import gguf_kv_facts

ROOT = Path(__file__).resolve().parents[1]
SERVER = f"{shlex.quote(sys.executable)} -m tests.launchable_server --port {{port}} {{spec}}"
PROMPTS = [{"id": f"p{i}", "category": cat, "messages": [{"role": "user", "content": f"{cat} question {i}"}]}
           for i, cat in enumerate(["code", "code", "chat", "chat"])]


@pytest.fixture()
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def _launch(tmp_path: Path, workload: Path, *extra: str, template: str = SERVER, specs=("off=", "spec=--draft-max 3"),
            out: str = "run") -> tuple[object, Path]:
    args = ["probe", "--launch", template, *[a for s in specs for a in ("--spec", s)], "--loads", "1,2",
            "--workload", str(workload), "--requests", "4", "--max-tokens", "12", "--chat",
            "--out", str(tmp_path / out), "--launch-timeout", "60", *extra]
    return CliRunner().invoke(cli_app, args, catch_exceptions=True), tmp_path / out


def _one_line(res, needle: str) -> str:
    exc = res.exception
    assert isinstance(exc, SpecLedgerError), (res.output, exc)
    text = str(exc)
    assert "\n" not in text and needle in text, text
    return text


# ------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("texts, needle", [
    (["ngram=--spec-type ngram-simple"], "needs a baseline: --spec off="),
    (["off="], "needs a configuration to compare with off"),
    (["off=", "a=x", "a=y"], "--spec a is given twice"),
    (["off=", "ngram"], "is not NAME=ARGS"),
    (["off=", "bad name=x"], "is not usable"),
    (["off=", "q='unclosed"], "check the quotes"),
])
def test_bad_specs_are_one_line_errors(texts: list[str], needle: str) -> None:
    with pytest.raises(SpecLedgerError, match=needle):
        parse_specs(texts)


def test_the_command_of_a_configuration() -> None:
    ngram = Spec("ngram", ("--spec-type", "ngram-simple", "--draft-max", "8"))
    template = "llama-server -m m.gguf --port {port} -np 4 {spec}"
    argv = engine_argv(template, 8123, ngram)
    assert argv == ["llama-server", "-m", "m.gguf", "--port", "8123", "-np", "4", "--spec-type", "ngram-simple",
                    "--draft-max", "8"]
    assert engine_argv("llama-server --port {port}", 1, ngram)[-4:] == list(ngram.args)  # no {spec}: last
    assert engine_kind(argv) == "llama.cpp"
    assert engine_kind(["python", "-m", "sglang.launch_server"]) == "sglang"
    assert engine_kind(["vllm", "serve", "m"]) == "vllm"


def test_gamma_is_the_configured_draft_length_never_a_guess() -> None:
    assert configured_gamma(["--spec-type", "draft-simple", "--spec-draft-n-max", "6"], "llama.cpp") == 6
    assert configured_gamma(["--spec-type", "ngram-simple"], "llama.cpp") is None  # no program to ask
    assert configured_gamma(["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "8"], "llama.cpp") == 8
    assert configured_gamma(["--spec-type", "ngram-simple", "--spec-draft-n-max", "5"], "llama.cpp") is None
    assert configured_gamma(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}'],
                            "vllm") == 5
    assert configured_gamma(['--speculative-config={"method": "eagle3", "num_speculative_tokens": 3}'], "vllm") == 3
    assert configured_gamma(["--speculative-num-steps", "4"], "sglang") == 4
    assert configured_gamma(["--speculative-num-draft-tokens", "5"], "sglang") == 4


def test_the_paste_ready_flags_cap_concurrency_where_speculation_stops_paying() -> None:
    ngram = Spec("ngram", ("--spec-type", "ngram-simple"))
    argv, note = engine_flags("llama-server -m m.gguf --port {port} -np 4 {spec}", ngram, "llama.cpp", [1],
                              [1, 4])
    assert argv.count("-np") == 1 and argv[argv.index("-np") + 1] == "1" and "--parallel" not in argv
    assert "pays at loads up to 1" in note
    argv, note = engine_flags("llama-server --port {port} {spec}", ngram, "llama.cpp", [1, 4], [1, 4])
    assert "--parallel" not in argv and "pays at every measured load" in note
    argv, _ = engine_flags("vllm serve m --port {port} {spec}", ngram, "vllm", [1], [1, 16])
    assert argv[-2:] == ["--max-num-seqs", "1"]


def test_kv_bytes_per_token_come_from_the_model_file() -> None:
    from specledger.engine.loader import default_target_path

    try:
        path = default_target_path()
    except SpecLedgerError as exc:
        pytest.skip(str(exc))
    facts = gguf_kv_facts(path)
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims, K and V in f16
    assert (facts["kv_layers"], facts["kv_heads"], facts["kv_head_dims"]) == (30, 3, [64, 64])
    assert facts["kv_bytes_per_token"] == 30 * 3 * (64 + 64) * 2
    assert gguf_kv_facts(path, ["-ctk", "q8_0", "-ctv", "q8_0"])["kv_bytes_per_token"] == \
        round(30 * 3 * 128 * 34 / 32)


# ---------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("args, needle", [
    (["--launch", "server --port 8000 {spec}", "--spec", "off=", "--spec", "n=x", "--out", "o"],
     "--launch must contain {port}"),
    (["http://127.0.0.1:9", "--launch", "s --port {port}", "--spec", "off=", "--spec", "n=x", "--out", "o"],
     "give no URL"),
    (["--launch", "s --port {port}", "--spec", "off=", "--spec", "n=x"], "--launch needs --out"),
    (["--launch", "s --port {port}", "--spec", "off=", "--spec", "n=x", "--out", "o", "--concurrency", "2"],
     "not --concurrency"),
    (["--spec", "off="], "go with --launch"),
    ([], "give the server's URL"),
])
def test_launch_options_are_checked_before_anything_starts(args: list[str], needle: str) -> None:
    _one_line(CliRunner().invoke(cli_app, ["probe", *args]), needle)


# ------------------------------------------------------------------------------------- the whole run
def test_launch_runs_every_configuration_at_every_load_and_decides(tmp_path: Path, workload: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    res, out = _launch(tmp_path, workload)
    assert res.exit_code == 0, (res.output, res.exception)
    summary = json.loads((out / "summary.json").read_text())
    launch = summary["launch"]
    assert launch["engine"] == "engine" and launch["specs"]["spec"]["gamma"] == 3  # --draft-max 3, configured
    assert launch["specs"]["off"]["gamma"] == 0
    for name in ("off", "spec"):
        assert (out / "launch" / f"{name}.json").is_file()
        assert Path(launch["specs"][name]["log"]).is_file()
    server = summary["engine_counters"]["spec"]["server"]
    # 2 loads x 4 prompts x 12 tokens in chunks of 1,3,2,4 (+ 1,1): 6 rounds per request, 3 drafted each
    assert server["drafts"] == 2 * 4 * 6 and server["draft_tokens"] == 3 * server["drafts"]
    assert server["accepted"] == 2 * 4 * (12 - 6)
    ledger = launch["specs"]["spec"]["ledger"]  # pooled over both loads from the server's counters
    assert ledger["gamma"] == 3 and ledger["rounds"] == 48 and ledger["el_reported"] == pytest.approx(2.0)
    assert ledger["acceptance_rate"] == pytest.approx(48 / (3 * 48))
    assert "E[L] 2.000 tokens per round over 48 rounds" in res.output
    rebuilt = CliRunner().invoke(cli_app, ["report", str(out)])  # a rebuilt report keeps the engine's command
    assert rebuilt.exit_code == 0, rebuilt.output
    assert json.loads((out / "summary.json").read_text())["schedules"] == summary["schedules"]
    html = (out / "report.html").read_text()  # a deployed schedule shows the engine's own command; whether one
    launched = [s for s in summary["schedules"] if s["engine"].get("command")]  # deploys depends on the clock
    assert ("(as launched)" in html) == bool(launched)
    assert all(s["engine"]["spec"] == "spec" for s in launched)
    off_server = summary["engine_counters"]["off"]["server"]
    assert not off_server.get("drafts")
    verdicts = summary["verdicts"]
    assert {(v["category"], v["load"]) for v in verdicts} >= {("code", 1), ("code", 2), ("chat", 1), ("chat", 2)}
    for sch in summary["schedules"]:  # the engine's own command, never another engine's config
        assert sch["vllm"] is None and sch["engine"]["kind"] == "engine"
    assert "spec" in res.output and "order:" in res.output

    _one_line(_launch(tmp_path, workload)[0], "already holds traces")  # a finished run is never appended to


def test_an_engine_that_dies_mid_run_is_one_line_naming_its_log_and_finished_ones_stay(
        tmp_path: Path, workload: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    res, out = _launch(tmp_path, workload, specs=("off=", "spec=--draft-max 3 --die-after 2"))
    text = _one_line(res, "the engine of spec 'spec' exited with code 3")
    assert "spec.log" in text and Path(text.split("its log: ")[1].split()[0]).is_file()
    assert (out / "launch" / "off.json").is_file() and not (out / "launch" / "spec.json").exists()
    again, _ = _launch(tmp_path, workload, specs=("off=", "spec=--draft-max 3 --die-after 2"))
    assert "off (repeat 1): finished before" in again.output  # kept, not run again


def test_an_engine_that_fails_to_start_is_one_line_naming_its_log(tmp_path: Path, workload: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    res, out = _launch(tmp_path, workload, specs=("off=--exit-now", "spec=--draft-max 3"))
    text = _one_line(res, "exited with code 2 before it was ready")
    log = out / "launch" / "logs" / "off.log"
    assert str(log) in text and "failing at start" in log.read_text()


def test_a_port_already_taken_is_one_line(tmp_path: Path, workload: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        res, _ = _launch(tmp_path, workload, "--launch-port", str(port))
    _one_line(res, f"port {port} is already taken")


def test_repeats_alternate_the_order_and_their_counters_add_up(tmp_path: Path, workload: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """--repeats 2: off, spec, then spec, off (each a fresh server); every repeat's requests pooled per load, and
    the server side is the sum of each (repeat, load) window: a restarted server counts from zero."""
    monkeypatch.chdir(ROOT)
    res, out = _launch(tmp_path, workload, "--repeats", "2")
    assert res.exit_code == 0, (res.output, res.exception)
    for name in ("off.json", "spec.json", "off.rep1.json", "spec.rep1.json"):
        assert (out / "launch" / name).is_file()
    meta = json.loads((out / "run.json").read_text())
    assert meta["load_order"]["1"] == ["off", "spec", "spec", "off"] and meta["launch"]["repeats"] == 2
    summary = json.loads((out / "summary.json").read_text())
    counters = summary["engine_counters"]["spec"]
    assert counters["server"]["drafts"] == 2 * 2 * 4 * 6 and counters["agree"] in (True, None)
    assert summary["launch"]["specs"]["spec"]["ledger"]["rounds"] == 96
    assert sum(1 for r in (out / "traces.jsonl").read_text().splitlines() if '"spec"' in r) == 2 * 2 * 4
