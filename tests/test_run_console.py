"""Issue 12 item 7: workload warnings (bad JSONL lines, prompts over the budget) are printed on the
console by ``specledger run``, not only stored in run.json."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specledger.engine.decode import Engine
from tests.conftest import CharLoaded, CharTokenizer, tiny_model


def test_run_prints_workload_warnings_on_the_console(tmp_path, monkeypatch) -> None:
    import typer

    import specledger.engine.build as engine_build
    from specledger.cli.run import run

    workload = tmp_path / "w.jsonl"
    lines = [json.dumps({"id": "a", "prompt": "abcabcabcabc def", "category": "copy", "mood": 1}),
             json.dumps({"id": "long", "prompt": "ab" * 300, "category": "copy", "mood": 2})]
    workload.write_text("\n".join(lines) + "\n")

    def tiny_engine(target=None, dtype="auto"):
        e = Engine(tiny_model(2), tokenizer=CharTokenizer(), max_context=512, name="tiny", dtype="float32")
        e.loaded = CharLoaded()
        return e

    monkeypatch.setattr(engine_build, "build_engine", tiny_engine)
    app = typer.Typer()
    app.command()(run)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["--workload", str(workload), "--out", str(out), "--drafters", "ngram",
                                      "--gammas", "2", "--temperatures", "0", "--max-tokens", "4"])
    assert result.exit_code == 0, result.output
    printed = [line for line in result.output.splitlines() if line.startswith("warning:")]
    # one warning per kind, with the count and the lines (a malformed line refuses the file: tests/test_run_inputs)
    assert any("unknown field 'mood' ignored on 2 lines: 1, 2" in line and str(workload) in line
               for line in printed), result.output
    assert any("skipped long: prompt of 600 tokens" in line for line in printed), result.output
    meta = json.loads((out / "run.json").read_text())
    assert len(meta["workload_warnings"]) == 1 and len(meta["skipped_prompts"]) == 1
    # the plain decode's bandwidth against this machine's read bandwidth, recorded and printed
    assert meta["bandwidth"]["plain_decode_tokens_per_s"] > 0 and meta["bandwidth"]["machine_read_GB_per_s"] > 0
    assert any(line.startswith("plain decode (float32): ") and "GB/s measured read" in line
               for line in result.output.splitlines()), result.output


def test_run_defaults_to_the_gguf_files_own_blocks_on_the_cpu(tmp_path) -> None:
    """``specledger run --dtype auto`` on the CPU with a GGUF target runs the file's quantized blocks (what a
    CPU user deploys); any other choice, target or device is left as given."""
    from specledger.engine import kernels
    from specledger.engine.build import deploy_dtype

    gguf = tmp_path / "m.gguf"
    expected = "gguf" if kernels.lib() is not None else "auto"
    assert deploy_dtype(str(gguf), "auto", "cpu") == expected
    assert deploy_dtype(str(gguf), "float32", "cpu") == "float32"
    assert deploy_dtype(str(gguf), "auto", "cuda") == "auto"
    assert deploy_dtype(str(tmp_path / "hf-dir"), "auto", "cpu") == "auto"


def test_every_verb_resolves_auto_in_build_engine(monkeypatch, tmp_path) -> None:
    """One owner of ``auto``: build_engine (the constructor run, serve, generate and sweep share) resolves it
    itself, so no verb can load float32 where another loads the GGUF's blocks; the engine says why."""
    from specledger.engine import build, kernels, loader

    seen: list[str] = []

    class Loaded:  # what Engine.from_loaded needs, without a model
        weights = ""

    def fake_load(target, dtype="auto", device=None):
        seen.append(dtype)
        raise RuntimeError("stop here")

    monkeypatch.setattr(loader, "load_model", fake_load)
    gguf = tmp_path / "m.gguf"
    for dtype in ("auto", "float32"):
        with pytest.raises(RuntimeError):
            build.build_engine(str(gguf), dtype)
    assert seen == ["gguf" if kernels.lib() is not None else "auto", "float32"]
    chosen, why = build.resolve_dtype(str(gguf))
    assert chosen == seen[0] and why.startswith("auto")
