"""`generate`'s comparison: warmed up, interleaved, decode-only and end-to-end speed-ups reported apart."""

from __future__ import annotations

from conftest import tiny_model

from specledger.engine.decode import Engine
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.sampling import SamplingParams
from specledger.mainjob.compare import compare_plain_spec, decode_speed, end_to_end_speed


def test_compare_plain_spec_shape_and_fresh_cross_request_drafters():
    engine = Engine(tiny_model())
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    built = []

    def make():
        built.append(make_drafter("suffix", engine))
        return built[-1]

    kwargs = dict(max_tokens=24, params=SamplingParams(), stop=[])
    cmp = compare_plain_spec(engine, prompt, make, "suffix", 3, kwargs, repeats=3)
    assert len(cmp.plain) == len(cmp.spec) == 3
    assert len(built) == 4  # warm-up + one per repeat: the suffix tree never sees a previous repeat
    s = cmp.summary()
    for key in ("decode_speedup", "end_to_end_speedup", "plain_tokens_per_s", "spec_tokens_per_s", "repeats"):
        assert key in s
    assert s["identical_to_plain"] is True
    assert len(s["decode_speedups"]) == len(s["end_to_end_speedups"]) == 3
    r = cmp.spec[0]
    assert decode_speed(r) > 0 and end_to_end_speed(r) > 0
    # the end-to-end speed counts the prefill, the decode-only one does not
    assert end_to_end_speed(r) < r.output_tokens / sum(rd.t_round for rd in r.rounds)


def test_compare_reuses_a_stateless_drafter():
    engine = Engine(tiny_model())
    built = []

    def make():
        built.append(make_drafter("ngram", engine))
        return built[-1]

    compare_plain_spec(engine, [1, 2, 3, 1, 2, 3], make, "ngram", 2,
                       dict(max_tokens=8, params=SamplingParams(), stop=[]), repeats=2)
    assert len(built) == 1


def test_generate_cli_prints_decode_only_and_end_to_end_speedups(monkeypatch):
    import json

    from conftest import CharLoaded, CharTokenizer
    from typer.testing import CliRunner

    import specledger.engine.build as engine_build
    from specledger.cli import app

    def tiny_engine(target, dtype="auto"):
        engine = Engine(tiny_model(), tokenizer=CharTokenizer())
        engine.loaded = CharLoaded()
        return engine

    monkeypatch.setattr(engine_build, "build_engine", tiny_engine)
    res = CliRunner().invoke(app, ["generate", "--prompt", "abcabcabcabc", "--drafter", "ngram", "--gamma", "3",
                                   "--max-tokens", "16", "--repeats", "2", "--json"])
    assert res.exit_code == 0, res.output
    led = json.loads(res.output)["ledger"]
    assert led["repeats"] == 2 and led["warmed_up"] is True
    assert led["decode_speedup"] > 0 and led["end_to_end_speedup"] > 0
    assert "speedup" not in led  # one cold pair's ratio is not reported
    res = CliRunner().invoke(app, ["generate", "--prompt", "abcabcabcabc", "--drafter", "ngram", "--gamma", "3",
                                   "--max-tokens", "16", "--repeats", "1"])
    assert res.exit_code == 0, res.output
    assert "decode_speedup" in res.output and "end_to_end_speedup" in res.output
