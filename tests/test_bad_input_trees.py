"""Bad input around trees and weights gets one line on stderr (exit 2), never a traceback: tree budgets
below 1 or past the cache's room, a tree shape that is not one, a head file for another target (hidden
size, vocabulary), corrupt head and target weights files."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import CharLoaded, CharTokenizer, run_cli, tiny_model

import specledger.engine.build as engine_cli
from specledger.engine.decode import Engine
from specledger.engine.drafters.head import HeadConfig, HeadNet, load_head, save_head, target_fingerprint
from specledger.errors import SpecLedgerError


def _cli(argv, capsys):
    return run_cli(argv, capsys)


@pytest.fixture()
def tiny_cli(monkeypatch):
    def tiny_engine(target, dtype="auto", device="cpu"):
        engine = Engine(tiny_model(), tokenizer=CharTokenizer(), max_context=256)
        engine.loaded = CharLoaded()
        return engine

    monkeypatch.setattr(engine_cli, "build_engine", tiny_engine)


def _head_for(model, path, hidden=16):
    torch.manual_seed(0)
    net = HeadNet(HeadConfig.for_target(model.config, hidden_dim=hidden, draft_vocab=0))
    return save_head(path, net, None, target_fingerprint(model))


def _one_line(code, err, needle):
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err and "Traceback" not in err


@pytest.mark.parametrize("args, needle", [
    (["--tree-budget", "-1"], "--tree-budget must be >= 1"),
    (["--tree-budget", "100000"], "exceeds the cache's room"),
    (["--tree-budget", "8", "--tree-shape", "wide"], "--tree-shape must be"),
    (["--tree-budget", "8", "--tree-shape", "dp:0.9,0.5"], "sum"),
])
def test_generate_tree_options(tiny_cli, capsys, args, needle):
    code, _, err = _cli(["generate", "-p", "abcabc", "--drafter", "ngram", "--max-tokens", "8", "--no-compare",
                         *args], capsys)
    _one_line(code, err, needle)


def test_generate_with_a_head_for_another_target_or_a_corrupt_one(tiny_cli, capsys, tmp_path):
    base = ["generate", "-p", "abcabc", "--drafter", "head", "--tree-budget", "8", "--max-tokens", "8",
            "--no-compare"]
    for other, needle in ((tiny_model(2, dim=48), "hidden size 48"), (tiny_model(2, vocab=80), "vocabulary 80")):
        path = _head_for(other, tmp_path / f"other{other.config.dim}-{other.config.vocab_size}.safetensors")
        code, _, err = _cli([*base, "--draft", str(path)], capsys)
        _one_line(code, err, needle)
        assert "train-head" in err
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file" * 4)
    code, _, err = _cli([*base, "--draft", str(garbage)], capsys)
    _one_line(code, err, "corrupt")
    ok = _head_for(tiny_model(), tmp_path / "ok.safetensors")  # the right target: it runs, trees and all
    code, out, err = _cli([*base, "--draft", str(ok), "--json"], capsys)
    assert code == 0, err
    assert all(r["tree_budget"] == 8 for r in json.loads(out)["rounds"])


def test_a_head_file_whose_tensors_do_not_fit_its_config_is_corrupt(tmp_path):
    from safetensors.torch import load_file, save_file

    target = tiny_model()
    path = _head_for(target, tmp_path / "h.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    tensors["fc.weight"] = tensors["fc.weight"][:, :8].contiguous()  # a wrong shape
    save_file(tensors, str(tmp_path / "shape.safetensors"), metadata=meta)
    del tensors["block.w2.weight"]
    save_file(tensors, str(tmp_path / "missing.safetensors"), metadata=meta)
    for name in ("shape", "missing"):
        with pytest.raises(SpecLedgerError) as err:
            load_head(tmp_path / f"{name}.safetensors", target)
        assert "corrupt" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("argv, needle", [
    (["run", "--tree-budgets", "0,-4", "--out", "RUN"], "--tree-budgets must be integers >= 1"),
    (["run", "--tree-budgets", "0,8", "--tree-shape", "wide", "--out", "RUN"], "--tree-shape must be"),
    (["serve", "--tree-budget", "-2"], "--tree-budget must be >= 1"),
])
def test_run_and_serve_tree_options(tiny_cli, capsys, tmp_path, argv, needle):
    code, _, err = _cli([a.replace("RUN", str(tmp_path / "r")) for a in argv], capsys)
    _one_line(code, err, needle)


def test_corrupt_target_weights_are_one_line_errors(tmp_path):
    pytest.importorskip("transformers")
    from test_loader import save_tiny_llama

    from specledger.engine.loader import load_model

    good = tmp_path / "good"
    save_tiny_llama(good)
    truncated = tmp_path / "truncated"
    save_tiny_llama(truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(SpecLedgerError) as err:
        load_model(truncated)
    assert "corrupt or truncated" in str(err.value) and "\n" not in str(err.value)
    mismatch = tmp_path / "mismatch"
    save_tiny_llama(mismatch)
    cfg = json.loads((mismatch / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (mismatch / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecLedgerError) as err:
        load_model(mismatch)
    assert "do not fit its config.json" in str(err.value) and "\n" not in str(err.value)
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(SpecLedgerError) as err:
        load_model(gguf, cache_dir=str(tmp_path / "cache"))
    assert "GGUF" in str(err.value) and "\n" not in str(err.value)
    assert load_model(good).model.config.dim == 64
