"""The kill test's driver: ``specledger run`` (the verb's own function, :func:`specledger.cli.main`, with the
engine builder swapped for the tiny test model) killed with SIGKILL again and again, then continued with
``--resume``, until a fixed number of kills have landed.

Run as ``python tests/kill_driver.py WORKDIR SEED KILLS``. It imports torch and specledger once, then forks
one child per attempt (a fork costs milliseconds where a fresh interpreter costs seconds), so each attempt
is a separate process that the driver kills with a real SIGKILL. It first runs the plan once uninterrupted
(``WORKDIR/reference``), then chains of attempts into ``WORKDIR/chain-N``: an attempt is ``--resume DIR``
when DIR holds a ``run.json``, else a fresh ``--out DIR`` (a run killed before its ``run.json`` is no run
yet). When a chain finishes before the kills are spent, the next chain starts. Kinds of kill, in a seeded
order:

* ``delay``: SIGKILL after a seeded random delay, anywhere (start-up, the cost surface, decoding, an append,
  the report);
* ``grow``: SIGKILL as soon as the driver sees ``traces.jsonl`` grow (polled every millisecond): right
  after an append's write, before or after its fsync;
* ``write``: the child kills itself with SIGKILL inside the trace append, at a seeded record of its
  writes and a byte of that record's line (none of it, its first byte, a seeded interior byte, all but
  the newline, all of it: each of these once in every five such kills, in a seeded order), the bytes
  before the cut flushed: every state a kill inside ``write(2)`` can
  leave on disk (a prefix of the append's bytes);
* ``replace``: the child kills itself inside an atomic write of the folder's JSON or HTML files
  (``run.json``, ``summary.json``, ``cost_model.json``, ``report.html``), at a seeded one of them, with its
  temp file complete and just before the ``os.replace`` that would publish it.

The driver asserts nothing: after each attempt it keeps the trace as it was (``WORKDIR/snapshots``) and
the child's output, and writes ``WORKDIR/log.json`` (the reference's duration, one entry per attempt) for
the test (``tests/test_kill_resume.py``) to judge.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specledger.engine.build as engine_build  # noqa: E402
import specledger.rundir as rundir  # noqa: E402
from specledger.cli import main  # noqa: E402
from tests.conftest import char_engine, tiny_model  # noqa: E402

#: the plan: plain + ngram γ 2 + suffix γ 2 at T = 0 (greedy: a resumed request reproduces its tokens
#: exactly), every prompt of the workload and nothing more (no race)
PLAN_ARGS = ["--drafters", "ngram,suffix", "--gammas", "2", "--temperatures", "0", "--max-tokens", "12",
             "--loads", "1", "--simulate-loads", "none", "--budget", "none"]
SETTINGS = 3  # requests per prompt: plain, ngram γ 2, suffix γ 2
PROMPTS = [("p0", "copy", "abcabcabcabc def"), ("p1", "chat", "hello hello hello"), ("p2", "copy", "xyz xyz xyz"),
           ("p3", "chat", "one two one two"), ("p4", "copy", "q r s t q r s t"), ("p5", "chat", "the cat the cat"),
           ("p6", "copy", "1 2 3 1 2 3 1 2"), ("p7", "chat", "go on go on go")]
ATTEMPT_TIMEOUT_S = 120.0  # an attempt still running then is a hang: killed, and the driver stops
CUTS = ("none", "first-byte", "interior", "no-newline", "whole")


def write_workload(path: Path) -> None:
    path.write_text("".join(json.dumps({"id": i, "prompt": p, "category": c}) + "\n" for i, c, p in PROMPTS))


def tiny_engine(target=None, dtype="auto", device="cpu"):
    return char_engine(tiny_model(2), max_context=256)


class _DieInWrite:
    """The trace file of one append, killing the process inside the ``skip``-th record write after
    writing ``cut`` of that line (what a SIGKILL inside ``write(2)`` leaves: a prefix of the bytes)."""

    def __init__(self, f, state: dict) -> None:
        self.f, self.state = f, state

    def write(self, text: str) -> int:
        if self.state["skip"] == 0:
            n = len(text)
            cut = {"none": 0, "first-byte": 1, "no-newline": n - 1, "whole": n}.get(
                self.state["cut"], 2 + int(self.state["u"] * max(0, n - 4)))
            self.f.write(text[:cut])
            self.f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        self.state["skip"] -= 1
        return self.f.write(text)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)


def _die_before_replace(run_dir: Path, state: dict) -> None:
    """Make the ``state["skip"]``-th ``os.replace`` into ``run_dir`` the process's last act (a SIGKILL)."""
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst).parent == run_dir:
            if state["skip"] == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            state["skip"] -= 1
        return real_replace(src, dst, *args, **kwargs)

    os.replace = replace  # this child's own os module: write_text_atomic publishes through it


def _child(argv: list[str], log: Path, die: dict | None, run_dir: Path) -> None:
    """The forked child: ``specledger run ARGV`` with its output in ``log``; never returns."""
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        if die is not None and "replace" in die:
            _die_before_replace(run_dir, die)
        elif die is not None:
            real_open = open

            def killing_open(path, mode="r", *args, **kwargs):
                f = real_open(path, mode, *args, **kwargs)
                return _DieInWrite(f, die) if Path(path).name == rundir.TRACE_NAME and "a" in mode else f

            rundir.open = killing_open  # the module's own ``open``: append_records writes through it
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _records_in(trace: Path) -> int:
    if not trace.is_file():
        return 0
    data = trace.read_bytes()
    return data[: data.rfind(b"\n") + 1].count(b"\n")


def attempt(run_dir: Path, workload: Path, log: Path, kind: str | None, rngs: dict[str, random.Random],
            expected_s: float, cuts: list[str] | None = None) -> dict:
    """One child: start (``--out`` or ``--resume``), kill it as ``kind`` says (None: let it finish), with
    the kind's own seeded generator (a delay that outlives the child leaves the others' draws as they were);
    a ``write`` kill cuts its line as the next of ``cuts`` says."""
    resume = (run_dir / rundir.META_NAME).is_file()
    argv = ["run", "--resume", str(run_dir)] if resume else \
        ["run", "--workload", str(workload), *PLAN_ARGS, "--out", str(run_dir)]
    trace = run_dir / rundir.TRACE_NAME
    remaining = SETTINGS * len(PROMPTS) - _records_in(trace)
    if kind in ("write", "grow") and remaining <= 0:
        kind = None  # nothing left to append: this run finishes, the kill goes to the next
    die = None
    entry: dict = {"dir": run_dir.name, "resume": resume, "kind": kind,
                   "start_bytes": trace.stat().st_size if trace.is_file() else 0}
    if kind == "write":
        rng = rngs["write"]
        die = {"skip": rng.randrange(min(remaining, 2 * SETTINGS)), "cut": cuts.pop(0), "u": rng.random()}
        entry.update(die_at_write=die["skip"], cut=die["cut"])
    elif kind == "replace":  # run.json at the start, then the report's summary, cost model and html
        die = {"replace": True, "skip": rngs["replace"].randrange(4)}
        entry["die_at_replace"] = die["skip"]
    delay = rngs["delay"].uniform(0.0, expected_s) if kind == "delay" else None
    entry["delay_s"] = delay
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(argv, log, die, run_dir)
    baseline = entry["start_bytes"]
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        now = time.monotonic() - t0
        if now > ATTEMPT_TIMEOUT_S or (delay is not None and now >= delay):
            entry["hung"] = now > ATTEMPT_TIMEOUT_S
            os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
            break
        if kind == "grow":
            size = trace.stat().st_size if trace.is_file() else 0
            if size < baseline:
                baseline = size  # the resume removed a torn tail
            elif size > baseline:
                os.kill(pid, signal.SIGKILL)
                status = os.waitpid(pid, 0)[1]
                break
        time.sleep(0.001)
    entry["seconds"] = time.monotonic() - t0
    entry["killed"] = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    entry["exit"] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    entry["log"] = log.name
    entry["run_json_after"] = (run_dir / rundir.META_NAME).is_file()
    return entry


def drive(work: Path, seed: int, kills: int) -> dict:
    rngs = {kind: random.Random(f"{seed}-{kind}") for kind in ("order", "write", "replace", "delay")}
    workload = work / "w.jsonl"
    write_workload(workload)
    engine_build.build_engine = tiny_engine
    (work / "logs").mkdir(exist_ok=True)
    (work / "snapshots").mkdir(exist_ok=True)
    ref = attempt(work / "reference", workload, work / "logs" / "reference.log", None, rngs, 0.0)
    kinds = ["write"] * (kills * 7 // 20) + ["grow"] * (kills // 4) + ["replace"] * (kills // 10)
    kinds += ["delay"] * (kills - len(kinds))
    rngs["order"].shuffle(kinds)
    cuts = [c for _ in range(kills) for c in rngs["order"].sample(CUTS, len(CUTS))]  # each cut in every 5 writes
    attempts: list[dict] = []
    chain, landed, started = 0, 0, time.monotonic()
    while (landed < kills or attempts and not attempts[-1]["exit"] == 0) and len(attempts) < 4 * kills:
        run_dir = work / f"chain-{chain}"
        kind = kinds[landed] if landed < kills else None
        n = len(attempts)
        entry = attempt(run_dir, workload, work / "logs" / f"{n:02d}.log", kind, rngs, ref["seconds"], cuts)
        trace = run_dir / rundir.TRACE_NAME
        if trace.is_file():
            (work / "snapshots" / f"{n:02d}.jsonl").write_bytes(trace.read_bytes())
            entry["snapshot"] = f"{n:02d}.jsonl"
        attempts.append(entry)
        landed += entry["killed"]
        if entry.get("hung") or (not entry["killed"] and entry["exit"] != 0):
            break  # a crash or a hang: the test reports it
        if not entry["killed"] and landed < kills:
            chain += 1  # this chain finished: the kills go on in a fresh run
    return {"seed": seed, "reference": ref, "attempts": attempts, "kills": landed,
            "seconds": time.monotonic() - started}


if __name__ == "__main__":
    work_dir, seed_arg, kills_arg = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "log.json").write_text(json.dumps(drive(work_dir, seed_arg, kills_arg), indent=1))
