"""Issue 44, "configs that start": every llama.cpp config a run emits brings up the llama-server the project
builds (scripts/build_llama_server.sh: the llama.cpp vendored in llama-cpp-python 0.3.36), answers a chat
request, and runs the decided γ.

The configs come from the one writer (:func:`specledger.gates.schedule.schedules` over a synthetic set of
verdicts, one category per drafter and schedule shape), checked against this binary's own ``--help``
(:func:`specledger.probe.engine_command.binary_flags`). Each is started on the bundled SmolLM2-135M GGUF
(``DRAFT_MODEL_PATH`` replaced by that GGUF, as its note says), sent one greedy chat request, and its γ read
back from the server itself: ``llamacpp:spec_decode_num_accepted_tokens_per_pos_total`` has one series per
draft position, ``common_speculative_n_max`` of them -- the draft length the server runs -- and the drafted
tokens stay within γ per verification step. The EAGLE head's config (``--spec-type draft-eagle3``) needs an
EAGLE-3 GGUF this project does not have: its flags are checked against ``--help`` (type name included), not
started. Skipped without a binary, like tests/test_llama_server.py.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from specledger.engine.loader import default_target_path
from specledger.gates.engine_configs import DRAFT_PLACEHOLDER, validate_llama_cpp
from specledger.gates.engine_validators import LLAMA_CPP_REMOVED, help_flags
from specledger.gates.schedule import schedules
from specledger.probe.engine_command import _help_text, binary_flags
from specledger.probe.prometheus import counter_by_label, counter_total, parse_prometheus_text
from tests.test_llama_server import LlamaServer, llama_server_binary

BINARY = llama_server_binary()
pytestmark = [
    pytest.mark.llama_server,
    pytest.mark.skipif(BINARY is None, reason="no llama-server binary: run scripts/build_llama_server.sh "
                                              "(or set SPECLEDGER_LLAMA_SERVER)"),
]

#: (category, drafter, {load: γ or None}): every drafter a run can deploy, and the schedule shapes that change
#: the flags (a cap on --parallel where speculation pays at the lowest loads only, none where it pays at all)
PLANS = [
    ("copy", "ngram", {1: 4, 2: 4, 4: None}),
    ("repeat", "ngram", {1: 6, 2: 6, 4: 6}),
    ("chat", "model", {1: 3, 2: None, 4: None}),
    ("code", "head", {1: 2, 2: None}),
    ("edit", "suffix", {1: 4, 2: None}),
    ("noisy", "layerskip", {1: 2}),
]
PROMPT = "Repeat this line three times: the quick brown fox jumps over the lazy dog."


def _verdicts() -> list[dict]:
    return [{"category": cat, "temperature": 0.0, "load": load, "simulated": False,
             "decision": "deploy" if gamma else "off", "drafter": drafter if gamma else None, "gamma": gamma}
            for cat, drafter, plan in PLANS for load, gamma in plan.items()]


@pytest.fixture(scope="module")
def known() -> frozenset[str]:
    assert BINARY is not None
    flags = binary_flags(BINARY)
    assert flags and "--spec-type" in flags
    return flags


@pytest.fixture(scope="module")
def emitted(known: frozenset[str]) -> dict[str, dict]:
    """Every schedule the writer emits for :data:`PLANS`, checked against this binary's --help."""
    return {s["category"]: s for s in schedules(_verdicts(), llama_flags=known)}


def test_the_binary_rejects_what_was_removed_and_offers_what_is_emitted(known: frozenset[str]) -> None:
    assert not set(LLAMA_CPP_REMOVED) & known  # listed in its --help only to say "has been removed"
    for flag in ("--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m", "--spec-draft-n-max",
                 "--spec-draft-n-min", "-md", "--parallel"):
        assert flag in known
    text = _help_text(str(BINARY))
    assert "draft-eagle3" in text and "draft-simple" in text and "ngram-simple" in text
    assert help_flags(text) == known


def test_every_drafter_llama_cpp_lacks_has_no_config(emitted: dict[str, dict]) -> None:
    for cat in ("edit", "noisy"):
        assert emitted[cat]["llama_cpp"] is None and "no llama.cpp flags" in emitted[cat]["configs_note"]


def Server(flags: list[str], log: Path) -> LlamaServer:  # noqa: N802 -- a constructor, as the tests read it
    """One llama-server with ``flags`` on the bundled GGUF (tests/test_llama_server.py's), its log in ``log``."""
    return LlamaServer(BINARY, default_target_path(), log, flags=flags, context=4096)


def _startable(flags: list[str]) -> list[str]:
    """The emitted flags with the draft placeholder replaced by the bundled GGUF (its own draft)."""
    return [str(default_target_path()) if f == DRAFT_PLACEHOLDER else f for f in flags]


@pytest.mark.parametrize("category", ["copy", "repeat", "chat"])
def test_each_emitted_config_starts_answers_and_runs_the_decided_gamma(emitted: dict[str, dict], category: str,
                                                                       tmp_path: Path) -> None:
    sched = emitted[category]
    flags = sched["llama_cpp"]
    assert flags is not None, sched["configs_note"]
    validate_llama_cpp(flags)
    gamma = sched["gamma"]
    server = Server(_startable(flags), tmp_path / "server.log")
    try:
        server.wait_ready(120.0)
        reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=120.0, json={
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 48, "temperature": 0.0})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["choices"][0]["message"]["content"].strip()
        timings = body.get("timings") or {}
        metrics = parse_prometheus_text(httpx.get(f"{server.url}/metrics", timeout=10.0).text)
    finally:
        server.stop()
    drafts = counter_total(metrics, "llamacpp:spec_decode_num_drafts")
    drafted = counter_total(metrics, "llamacpp:spec_decode_num_draft_tokens")
    positions = counter_by_label(metrics, "llamacpp:spec_decode_num_accepted_tokens_per_pos", "position")
    assert drafts and drafted, f"{category}: the server never drafted ({server.log_tail()})"
    assert len(positions) == gamma, f"{category}: the server runs γ={len(positions)}, decided γ={gamma}"
    assert drafted <= gamma * drafts and timings.get("draft_n", drafted) <= drafted
    if "--parallel" in flags:
        assert flags[flags.index("--parallel") + 1] == str(sched["ranges"][0][1])


def test_the_heads_config_names_a_type_and_flags_this_binary_has(emitted: dict[str, dict],
                                                                 known: frozenset[str]) -> None:
    flags = emitted["code"]["llama_cpp"]
    assert flags[:2] == ["--spec-type", "draft-eagle3"] and DRAFT_PLACEHOLDER in flags
    validate_llama_cpp(flags)
    assert all(f in known for f in flags if f.startswith("-"))
    assert "EAGLE-3 GGUF" in emitted["code"]["configs_note"]
