"""A kill test that is real: ``specledger run`` killed with SIGKILL 20 times at seeded random points --
anywhere, right after the trace grows, inside the trace's ``write`` at a chosen byte, inside an atomic
JSON/HTML write just before its ``os.replace`` -- each time continued with ``--resume``
(tests/kill_driver.py forks the attempts and does the killing). Judged here:

* nothing finished is lost: after every kill, the trace's complete lines are a byte prefix of the finished
  trace (a resume only removes a torn tail, then appends);
* a resume that appends after a torn tail says it removed it (``warning: ... removed the torn last line``);
* every finished run folder equals an uninterrupted run's: the same records (prompt, drafter, γ, T, tree
  budget), each once, with the same token ids and text (greedy decoding, so exact); no torn line; the same
  ``run.json`` plan and prompts; the same files, no temp file left behind (a resume deletes what a kill
  inside an atomic write left: :meth:`RunDir.remove_stale_temp_files`); a readable ``summary.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest

from specledger.records import RequestRecord
from specledger.rundir import SUMMARY_NAME, TRACE_NAME, RunDir, read_records
from tests.kill_driver import PROMPTS, SETTINGS

DRIVER = Path(__file__).with_name("kill_driver.py")
ROOT = Path(__file__).resolve().parents[1]
KILLS = 20
#: the driver's wall-clock limit: about 30 s on 2 idle cores (most of it the report, built at each finish)
DRIVER_TIMEOUT_S = 240


def _key(r: RequestRecord) -> tuple:
    return (r.prompt_id, r.drafter, int(r.gamma), round(r.temperature, 6), int(r.tree_budget))


def _complete(data: bytes) -> bytes:
    """The trace's complete lines: everything through its last newline."""
    return data[: data.rfind(b"\n") + 1]


def _lines(data: bytes) -> list[RequestRecord]:
    return [RequestRecord.from_dict(json.loads(line)) for line in _complete(data).splitlines() if line.strip()]


def _landed(before: bytes, after: bytes, run_json: bool) -> str:
    """Where a kill left the run: a torn line, a prompt's group cut between records, between appends (a
    torn tail the attempt found and left as it was counts there), before ``run.json``, or after the last
    record (in the report)."""
    if after != before and after and not after.endswith(b"\n"):
        return "torn line"
    new = _lines(after)[len(_lines(before)):]
    if new and Counter(r.prompt_id for r in _lines(after))[new[-1].prompt_id] < SETTINGS:
        return "mid-group"
    if not run_json:
        return "before run.json"
    return "in the report" if len(_lines(after)) == SETTINGS * len(PROMPTS) else "between appends"


def _check_finished(folder: Path, reference: dict[tuple, RequestRecord], ref_meta: dict, ref_files: set[str]):
    data = (folder / TRACE_NAME).read_bytes()
    assert data.endswith(b"\n"), f"{folder.name}: torn last line left"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a skipped (torn) line would warn
        records = list(read_records(folder / TRACE_NAME))
    keys = [_key(r) for r in records]
    assert len(keys) == len(set(keys)), f"{folder.name}: duplicate records {Counter(keys).most_common(3)}"
    assert set(keys) == set(reference), f"{folder.name}: lost {set(reference) - set(keys)}, extra " \
                                        f"{set(keys) - set(reference)}"
    for r in records:
        ref = reference[_key(r)]
        assert (r.token_ids, r.text) == (ref.token_ids, ref.text), f"{folder.name}: {_key(r)} differs"
    meta = RunDir(folder).meta()
    assert meta["config"] == ref_meta["config"] and meta["prompts"] == ref_meta["prompts"]
    assert meta.get("cost_surface", {}).get("points")
    assert isinstance(json.loads((folder / SUMMARY_NAME).read_text()), dict)
    assert {p.name for p in folder.iterdir()} == ref_files, f"{folder.name}: files differ (a temp file left?)"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the driver forks its attempts (POSIX)")
def test_sigkill_at_random_points_then_resume_loses_nothing(tmp_path):
    seed = int(os.environ.get("SPECLEDGER_KILL_SEED", "34"))
    proc = subprocess.run([sys.executable, str(DRIVER), str(tmp_path), str(seed), str(KILLS)], cwd=ROOT,
                          capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = json.loads((tmp_path / "log.json").read_text())
    attempts = log["attempts"]
    logs = {a["log"]: (tmp_path / "logs" / a["log"]).read_text() for a in attempts}
    for a in attempts:  # every attempt ends killed or finished: no crash, no hang, no traceback
        assert not a.get("hung"), a
        assert a["killed"] or a["exit"] == 0, (a, logs[a["log"]][-3000:])
        assert "Traceback" not in logs[a["log"]], logs[a["log"]][-3000:]
    assert log["kills"] == sum(a["killed"] for a in attempts) == KILLS

    ref_dir = tmp_path / "reference"
    ref_records = list(read_records(ref_dir / TRACE_NAME))
    reference = {_key(r): r for r in ref_records}
    assert len(reference) == len(ref_records) == SETTINGS * len(PROMPTS)
    ref_meta = RunDir(ref_dir).meta()
    ref_files = {p.name for p in ref_dir.iterdir()}

    chains = sorted({a["dir"] for a in attempts})
    final = {}
    for chain in chains:
        _check_finished(tmp_path / chain, reference, ref_meta, ref_files)
        final[chain] = (tmp_path / chain / TRACE_NAME).read_bytes()

    landed = Counter()
    before: dict[str, bytes] = {}
    for a in attempts:
        start = before.get(a["dir"], b"")
        after = (tmp_path / "snapshots" / a["snapshot"]).read_bytes() if a.get("snapshot") else b""
        done = _complete(after)
        assert final[a["dir"]].startswith(done), f"attempt {a['log']}: a finished record was lost or rewritten"
        keys = [_key(r) for r in _lines(after)]
        assert len(keys) == len(set(keys)), f"attempt {a['log']}: duplicate records"
        if start != _complete(start) and len(done) > len(_complete(start)):  # it appended after a torn tail
            assert "removed the torn last line" in logs[a["log"]], logs[a["log"]][-2000:]
        if a["killed"]:
            landed[(a["kind"], _landed(start, after, a["run_json_after"]))] += 1
        before[a["dir"]] = after
    torn = sum(n for (_, where), n in landed.items() if where == "torn line")
    mid_write = torn + sum(n for (_, where), n in landed.items() if where == "mid-group")
    print(f"\nkills {KILLS} (seed {seed}) in {len(chains)} runs, {len(attempts)} attempts, "
          f"{log['seconds']:.1f} s: " + ", ".join(f"{k} -> {w}: {n}" for (k, w), n in sorted(landed.items()))
          + f"; {mid_write} left a torn line or a cut group")
    # 7 of the 20 kills die inside a trace write, each cut (first byte, interior, all but the newline: a
    # torn line) at least once
    assert torn >= 3, landed


def test_a_resume_removes_only_the_temp_files_of_the_folders_own_atomic_writes(tmp_path):
    rd = RunDir(tmp_path)
    ours = [".report.html.k3j_x9ab.tmp", ".run.json.0a1b2c3d.tmp", ".summary.json.zz_zz_zz.tmp"]
    theirs = [".notes.txt.k3j_x9ab.tmp", "report.html", ".tmp", "x.tmp", ".traces.jsonl.swp"]
    for name in ours + theirs:
        (tmp_path / name).write_text("x")
    (tmp_path / ".cost_model.json.dir0000.tmp").mkdir()  # not a file: left alone
    assert rd.remove_stale_temp_files() == sorted(ours)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs + [".cost_model.json.dir0000.tmp"])
    assert rd.remove_stale_temp_files() == []
