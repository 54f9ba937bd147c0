"""`specledger ledger`: the seed's worked example, JSON output, and one-line user errors."""

from __future__ import annotations

import json

import pytest

from specledger import cli

EXAMPLE_ARGS = [
    "--acceptance", "0.8", "--gamma", "1,2,4,8", "--base-ms", "10",
    "--round-ms", "10+0.7*k+0.1*k^2", "--round-ms", "10+5*k+0.8*k^2",
]  # fmt: skip


def run_ledger(args: list[str]) -> None:
    """Invoke ``specledger ledger ARGS`` through the real entry point (group or single-verb app)."""
    group = cli.app.registered_callback is not None or len(cli.app.registered_commands) > 1
    cli.main(["ledger", *args] if group else list(args))


def ledger_json(args: list[str], capsys) -> dict:
    run_ledger([*args, "--json"])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("args", [EXAMPLE_ARGS, ["--example"]])
def test_worked_example_prints_the_seed_numbers(args, capsys):
    run_ledger(args)
    out = capsys.readouterr().out
    for value in [
        "1.800",
        "2.440",
        "3.362",
        "4.329",
        "1.667",
        "2.068",
        "2.334",
        "1.968",
        "1.139",
        "1.052",
        "0.785",
        "0.428",
    ]:
        assert value in out, value
    assert "pays?" in out


def test_example_json_matches_the_seed(capsys):
    report = ledger_json(["--example"], capsys)
    cheap, costly = report["scenarios"]
    assert [round(r["expected_length"], 3) for r in cheap["rows"]] == [1.8, 2.44, 3.362, 4.329]
    assert [round(r["speedup"], 3) for r in cheap["rows"]] == [1.667, 2.068, 2.334, 1.968]
    assert [round(r["speedup"], 3) for r in costly["rows"]] == [1.139, 1.052, 0.785, 0.428]
    assert [r["pays"] for r in costly["rows"]] == [True, True, False, False]
    assert [r["round_ms"] for r in cheap["rows"]] == pytest.approx([10.8, 11.8, 14.4, 22.0])


def test_example_command_and_flag_agree(capsys):
    assert (
        ledger_json(EXAMPLE_ARGS, capsys)["scenarios"][0]["rows"]
        == ledger_json(["--example"], capsys)["scenarios"][0]["rows"]
    )


def test_optimal_reports_best_gamma_and_marginal_table(capsys):
    report = ledger_json([*EXAMPLE_ARGS, "--optimal", "--max-gamma", "12"], capsys)
    cheap, costly = report["optimal"]
    assert cheap["best"]["gamma"] == 4 and costly["best"]["gamma"] == 1
    assert len(cheap["marginal"]) == 12
    assert cheap["marginal"][0]["delta_length"] == pytest.approx(0.8)


def test_acceptance_chain_histogram_and_per_position_sources(capsys):
    chain = ledger_json(["--acceptance-chain", "0.9,0.8,0.7"], capsys)
    assert chain["gammas"] == [3]
    assert chain["acceptance"]["expected_length"] == pytest.approx(1 + 0.9 + 0.72 + 0.504)

    per_pos = ledger_json(["--per-position", "0.8,0.6,0.45"], capsys)
    assert per_pos["acceptance"]["conditional"] == pytest.approx([0.8, 0.75, 0.75])
    assert per_pos["acceptance"]["expected_length"] == pytest.approx(2.85)

    hist = ledger_json(["--histogram", "20,20,15,45", "--gamma", "1,2,3"], capsys)
    acc = hist["acceptance"]
    assert acc["observed_expected_length"] == pytest.approx((20 * 1 + 20 * 2 + 15 * 3 + 45 * 4) / 100)
    assert acc["expected_length"] == pytest.approx(acc["observed_expected_length"])
    assert acc["per_position"] == pytest.approx([0.8, 0.6, 0.45])


def test_split_round_time_and_measured_table(capsys):
    report = ledger_json(
        ["-a", "0.8", "-g", "1,2", "--base-ms", "10", "--draft-ms", "0.5*k", "--verify-ms", "10+0.2*k",
         "--other-ms", "0.3", "--round-ms", "1:10.8,2:11.8"],
        capsys,
    )  # fmt: skip
    table, split = report["scenarios"]
    assert [r["speedup"] for r in table["rows"]] == pytest.approx([18 / 10.8, 24.4 / 11.8])
    assert split["rows"][1]["draft_ms"] == pytest.approx(1.0)
    assert split["rows"][1]["round_ms"] == pytest.approx(1.0 + 10.4 + 0.3)


def test_tree_budget_and_kv_tables(tmp_path, capsys):
    report = ledger_json(["--acceptance", "0.7", "--tree-budget", "12"], capsys)
    rows = report["tree"]["rows"]
    assert rows[-1]["shape"] == "best tree (DP)"
    assert all(rows[-1]["expected_length"] >= r["expected_length"] - 1e-12 for r in rows)

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32}))
    kv = ledger_json(["--kv", str(config), "--batch", "3", "--gamma", "2"], capsys)["memory"]
    assert kv["kv_bytes_per_token"] == 2 * 2 * 4 * 8 * 2
    assert kv["rows"][0]["candidate_kv_bytes"] == 3 * 2 * kv["kv_bytes_per_token"]

    run_ledger(["--kv", "smollm2", "--batch", "16"])
    assert "23040 B/token" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--acceptance", "1.5"], "outside [0, 1]"),
        (["--acceptance", "0.8", "--gamma", "-1"], "negative"),
        (["--acceptance", "0.8", "--base-ms", "10", "--round-ms", "10+__import__('os')"], "function call"),
        (["--histogram", ""], "empty"),
        (["--histogram", "0,0,0"], "no observations"),
        (["--acceptance", "0.8", "--round-ms", "10+k"], "--base-ms"),
        (["--acceptance-chain", "0.9,0.8", "--gamma", "4"], "γ=4"),
        (["--acceptance", "0.8", "--acceptance-chain", "0.9"], "one acceptance source"),
        (["--example", "--acceptance", "0.5"], "--example"),
        ([], "nothing to compute"),
    ],
)
def test_bad_input_exits_2_with_one_line_error(args, needle, capsys):
    with pytest.raises(SystemExit) as info:
        run_ledger(args)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ")
    assert "\n" not in err
    assert needle in err


def test_width_profile_text_is_run_length_encoded():
    from specledger.ledger.render import widths_text

    assert widths_text([2, 1, 1, 1]) == "2,1×3"
    assert widths_text([1] * 64) == "1×64"
    assert widths_text([3, 9, 9, 4]) == "3,9,9,4"


def test_tree_budget_is_capped_with_a_user_error(capsys):
    with pytest.raises(SystemExit) as info:
        run_ledger(["--acceptance", "0.8", "--tree-budget", "100000"])
    assert info.value.code == 2
    assert "tree budget" in capsys.readouterr().err


def test_help_lists_the_main_options(capsys):
    try:
        run_ledger(["--help"])
    except SystemExit as exc:  # click may exit 0 after printing help
        assert exc.code in (0, None)
    out = capsys.readouterr().out
    for option in [
        "--acceptance-chain",
        "--round-ms",
        "--optimal",
        "--tree-budget",
        "--kv",
        "--example",
        "--json",
    ]:
        assert option in out
