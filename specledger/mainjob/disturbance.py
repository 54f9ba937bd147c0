"""Was the machine disturbed while we measured? Signals sampled around each measurement, one stated rule.

A speed-up is a ratio of two timings; a paired ratio cancels only the noise both settings of a prompt share.
Time another process takes lands on some rounds and not others (issue 47: the same setting's rounds measured
4.7 ms in one place and 22.7 ms in another in one disturbed run). So every measurement window is watched:

- ``other_cores``: CPU time every other process used, in cores (1.0 = one core busy the whole window):
  ``/proc/stat``'s busy time (user, nice, system, irq, softirq) minus our own (``/proc/PID/stat`` utime + stime
  of this process, its threads included, and the processes we watch: ``probe``'s server and their children),
  over the window's total ticks times the CPUs;
- ``steal_cores``: time the hypervisor gave to another guest (``/proc/stat`` steal), in cores;
- ``step_drift`` (``specledger run`` only): plain decoding's steps in the window against the run's own: the
  median over the prompt's plain steps of (step / the verify cost surface's price of a 1-row forward at that
  context, measured at the run's start), divided by the median of that figure over the run's earlier prompts.
  The surface takes out the context (a step at 1,200 tokens costs 3.5x one at 40); the median takes out the
  surface's own level.

**The rule** (:func:`reasons`): a window is *disturbed* when other processes and steal together used more than
:data:`OTHER_CORES_LIMIT` of a core on average, or its plain steps sat more than :data:`STEP_DRIFT_LIMIT` times
the run's own; windows shorter than :data:`MIN_WINDOW_S` are not judged (the kernel counts CPU time in ticks
of 10 ms). Thresholds from measurements on the 2-core AMD EPYC box (docs/measurements.md, "A disturbed
machine"): with 0.00-0.04 cores of others the plain step was 5.8-6.1 ms; 0.12 cores already read 7.3 ms, 0.4
cores 8.3-8.9 ms, a one-core loop 15-18 ms; on a quiet run the surface-scaled step drift of 31 prompts lay in
0.91-1.21.

**What a run does with a disturbed prompt** (:class:`RunWatch`): it is measured once more, its first records
kept in the trace under ``extra.experiment = "disturbed"`` (out of every figure, counted in summary.json),
unless the last re-measure was itself disturbed (the disturbance is lasting: re-measuring would not find a quiet
moment; it resumes after a quiet prompt) or :data:`REMEASURE_SHARE` of the prompts (at least one) were
re-measured already. A prompt not re-measured keeps its records, each marked ``extra.disturbance.disturbed``,
at full weight, and the answer's first lines say how many: nothing is dropped. ``probe`` (:class:`ProbeWatch`)
judges each second of its loads and reports; it re-measures nothing (its requests run concurrently).

**What a run does with a disturbed load point** (:class:`LoadWatch`, ``specledger run --loads``): each batched
point (one setting at one load > 1 and temperature) is a window too, judged by the CPU signals alone (a batched
step is no solo step: no step drift). A disturbed point is measured once more, its first records kept in the
trace under ``extra.experiment = "disturbed"`` (out of the load records and every figure), at most once per
point, and not while the last re-measure was itself disturbed (lasting; it resumes after a quiet point); no
share cap (a load point decides a whole load). A re-measure is not promised to be quiet: the kept records carry
their own window, and summary.json's ``disturbance.load_points`` says how many were disturbed, re-measured and
quiet the second time.

``SPECLEDGER_DISTURBANCE=off`` turns the watch off (the test suite does, so a busy test machine does not change
what a test runs). Torch-free; reads only ``/proc`` (elsewhere nothing is watched and nothing is said).
"""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specledger.engine.drafters.catalog import PLAIN
from specledger.mainjob.proc_readings import (
    CpuTimes,
    Reading,
    descendants,
    local_servers,
    parse_pid_stat,
    parse_proc_stat,
    read,
)
from specledger.records import EXPERIMENT_KEY

#: other processes' CPU plus steal, in cores averaged over a window, above which the window is disturbed
OTHER_CORES_LIMIT = 0.1
#: plain steps' drift (scaled by the cost surface, against the run's own median) above which a window is disturbed
STEP_DRIFT_LIMIT = 1.5
#: windows shorter than this are not judged: CPU time is counted in ticks of 1/100 s
MIN_WINDOW_S = 0.5
#: earlier prompts with plain steps before the drift is judged
MIN_DRIFT_PROMPTS = 5
#: plain steps a prompt needs for its drift
MIN_DRIFT_STEPS = 4
#: at most this share of a run's prompts are measured a second time
REMEASURE_SHARE = 0.2
#: ``extra.experiment`` of the records a re-measure replaced (kept in the trace, out of the analysis)
DISTURBED_EXPERIMENT = "disturbed"
#: ``RequestRecord.extra`` key of a record's window (its signals and whether it was disturbed)
EXTRA_KEY = "disturbance"
#: the environment variable that turns the watch off (``off``)
SWITCH = "SPECLEDGER_DISTURBANCE"
#: seconds between ``probe``'s readings
PROBE_INTERVAL_S = 1.0

RULE = (f"a window is disturbed when other processes and steal used more than {OTHER_CORES_LIMIT:g} of a core on "
        f"average, or its plain decode steps sat more than {STEP_DRIFT_LIMIT:g}x the run's own at the same context "
        f"(windows under {MIN_WINDOW_S:g} s are not judged)")
REMEASURE_RULE = (f"a disturbed prompt is measured once more and its first records kept under experiment "
                  f"'{DISTURBED_EXPERIMENT}', out of the figures; not while the last re-measure was disturbed "
                  f"again (a lasting disturbance) nor beyond {100 * REMEASURE_SHARE:.0f} % of the prompts (at least "
                  "one); a prompt not re-measured keeps its records, marked, at full weight")
LOAD_REMEASURE_RULE = (f"a disturbed load point is measured once more and its first records kept under experiment "
                       f"'{DISTURBED_EXPERIMENT}', out of the figures; at most once per point, not while the last "
                       "re-measure was disturbed again (a lasting disturbance); a point not re-measured keeps its "
                       "records, marked")
PROBE_RULE = "probe: each second of its loads judged, nothing re-measured (its requests run concurrently)"


@dataclass(frozen=True)
class Window:
    """The signals over one window (see the module doc); ``step_drift`` None where not measured."""

    seconds: float
    other_cores: float
    steal_cores: float
    step_drift: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"window_s": round(self.seconds, 3), "other_cores": round(self.other_cores, 3),
               "steal_cores": round(self.steal_cores, 3),
               "step_drift": None if self.step_drift is None else round(self.step_drift, 3)}
        why = reasons(self)
        return {**out, "reasons": why, "disturbed": bool(why)}


# ---- pure functions: the rule (the readings: specledger.mainjob.proc_readings) ----

def cpu_window(a: Reading, b: Reading, cpus: int) -> Window:
    """The CPU signals between two readings: other processes' and steal's cores (never below 0). Our processes'
    ticks count from 0 for one that started inside the window; one that ended inside it is lost (counted as
    other), so watch processes that live through the window."""
    total = max(b.machine.total - a.machine.total, 1)
    own = sum(t - a.own.get(pid, 0) for pid, t in b.own.items())
    busy = b.machine.busy - a.machine.busy
    return Window(seconds=b.wall - a.wall, other_cores=max(busy - own, 0) / total * cpus,
                  steal_cores=max(b.machine.steal - a.machine.steal, 0) / total * cpus)


def reasons(w: Window) -> list[str]:
    """Why the window is disturbed under the rule (module doc); [] when it is quiet or too short to judge."""
    if w.seconds < MIN_WINDOW_S:
        return []
    out = []
    if w.other_cores + w.steal_cores > OTHER_CORES_LIMIT:
        out.append(f"other processes {w.other_cores:.2f} cores" + (f" + steal {w.steal_cores:.2f}"
                                                                    if w.steal_cores >= 0.005 else ""))
    if w.step_drift is not None and w.step_drift > STEP_DRIFT_LIMIT:
        out.append(f"plain steps {w.step_drift:.2f}x the run's own")
    return out


def plain_step_ratio(rounds: Iterable[Any], expected: Callable[[int], float]) -> float | None:
    """Median over a plain request's full solo steps of (verify seconds / ``expected(context)``); None with
    fewer than :data:`MIN_DRIFT_STEPS` steps or no price."""
    ratios = []
    for rd in rounds:
        if rd.truncated or rd.batch_size > 1:
            continue
        price = expected(rd.context_len)
        if price > 0:
            ratios.append(rd.t_verify / price)
    return statistics.median(ratios) if len(ratios) >= MIN_DRIFT_STEPS else None


def step_drift(ratio: float | None, earlier: Sequence[float]) -> float | None:
    """``ratio`` against the median of the run's ``earlier`` prompts' ratios; None before
    :data:`MIN_DRIFT_PROMPTS` of them."""
    if ratio is None or len(earlier) < MIN_DRIFT_PROMPTS:
        return None
    return ratio / statistics.median(earlier)


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median, P90 and max of ``values`` (None when empty)."""
    if not values:
        return None
    xs = sorted(values)
    return {"median": round(statistics.median(xs), 3), "p90": round(xs[min(len(xs) - 1, int(0.9 * len(xs)))], 3),
            "max": round(xs[-1], 3)}


# ---- the switch ----

def watching() -> bool:
    """Whether the watch is on: ``/proc/stat`` readable and ``SPECLEDGER_DISTURBANCE`` not ``off``."""
    return os.environ.get(SWITCH, "").lower() != "off" and Path("/proc/stat").is_file()


# ---- the run: one window per prompt's side-by-side group, one per load point ----

@dataclass
class Watch:
    """What the run's watches share: the readings (``reader``: a reading now; tests pass their own), numbered
    windows, re-measures counted, and whether the disturbance lasts (the last re-measure was disturbed again;
    a quiet first measurement ends it)."""

    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    reader: Callable[[], Reading] | None = None
    on: bool = field(default_factory=watching)
    windows: int = 0
    remeasured: int = 0
    lasting: bool = False

    def start(self) -> Reading | None:
        return (self.reader or read)() if self.on else None

    def window(self, start: Reading) -> Window:
        """The CPU signals since ``start`` (no step drift)."""
        return cpu_window(start, (self.reader or read)(), self.cpus)

    def entry(self, w: Window, second: bool, **marks: Any) -> dict[str, Any]:
        """``w``'s ``extra.disturbance`` entry, numbered (``window``), ``remeasure`` 1 on a second measurement,
        with ``marks``; a disturbed re-measure starts a lasting disturbance, a quiet first measurement ends it."""
        self.windows += 1
        entry = {**w.to_dict(), "window": self.windows, "remeasure": int(second), **marks}
        if second:
            self.lasting = entry["disturbed"]
        elif not entry["disturbed"]:
            self.lasting = False
        return entry

    def may_remeasure(self, entry: dict[str, Any] | None) -> bool:
        """A first measurement is measured again only when disturbed and the disturbance does not last."""
        return bool(entry) and bool(entry["disturbed"]) and not self.lasting


@dataclass
class RunWatch(Watch):
    """The main job's watch over prompts (module doc): :meth:`start` before a prompt's group, :meth:`judge` after
    it, :meth:`remeasure` says whether to measure it again. ``expected``: seconds of a 1-row forward at a context
    (the run's cost surface); None leaves the step drift out."""

    expected: Callable[[int], float] | None = None
    ratios: list[float] = field(default_factory=list)
    prompts: int = 0

    def judge(self, start: Reading | None, records: Sequence[Any], second: bool = False) -> dict[str, Any] | None:
        """The window since ``start`` over a group's ``records`` (its plain request's steps give the drift): the
        ``extra.disturbance`` entry (:meth:`Watch.entry`). Keeps the plain ratio of a quiet window (a disturbed
        one would pull the run's own median) and counts the prompt."""
        if start is None:
            return None
        w = self.window(start)
        plain = next((r for r in records if r.drafter == PLAIN.name), None)
        ratio = plain_step_ratio(plain.rounds, self.expected) if plain is not None and self.expected else None
        entry = self.entry(Window(w.seconds, w.other_cores, w.steal_cores, step_drift(ratio, self.ratios)), second)
        if ratio is not None and not entry["disturbed"]:
            self.ratios.append(ratio)
        self.prompts += 0 if second else 1
        return entry

    def remeasure(self, entry: dict[str, Any] | None) -> bool:
        """Whether a first measurement with ``entry`` is measured again (the rule in the module doc)."""
        if not self.may_remeasure(entry) or self.remeasured >= max(1.0, REMEASURE_SHARE * self.prompts):
            return False
        self.remeasured += 1
        return True


@dataclass
class LoadWatch(Watch):
    """The load points' watch (module doc): one window per batched point, judged by the CPU signals alone."""

    def judge(self, start: Reading | None, records: Sequence[Any], second: bool = False) -> dict[str, Any] | None:
        """The window since ``start`` over one load point's ``records`` (tagged with their ``load``): the entry
        (:meth:`Watch.entry`) marked ``load_point`` (the load)."""
        if start is None:
            return None
        load = records[0].extra.get("load") if records else None
        return self.entry(self.window(start), second, load_point=load)

    def remeasure(self, entry: dict[str, Any] | None) -> bool:
        """Whether a first measurement with ``entry`` is measured again: disturbed and not lasting (each point at
        most once: a second measurement is never asked)."""
        if not self.may_remeasure(entry):
            return False
        self.remeasured += 1
        return True


def watched(watch: RunWatch | LoadWatch, measure: Callable[[], list[Any]],
            set_aside: Callable[[list[Any]], None]) -> list[Any]:
    """``measure()`` once, watched; when ``watch.remeasure`` says so, the first records are marked (experiment
    ``disturbed``, their entry) and handed to ``set_aside`` (to append to the trace), then measured once more.
    Returns the kept records, each carrying its window's entry (none when the watch is off)."""
    start = watch.start()
    records = measure()
    entry = watch.judge(start, records)
    if watch.remeasure(entry):
        for rec in records:
            rec.extra.update({EXPERIMENT_KEY: DISTURBED_EXPERIMENT, EXTRA_KEY: entry})
        set_aside(records)
        start = watch.start()
        records = measure()
        entry = watch.judge(start, records, second=True)
    for rec in records if entry else []:
        rec.extra[EXTRA_KEY] = entry
    return records


# ---- probe: one reading a second in a thread ----

class ProbeWatch:
    """Reads the machine every :data:`PROBE_INTERVAL_S` while ``probe`` loads its endpoints, counting this process,
    its children (a launched engine) and ``servers`` (a local endpoint's processes) as ours. A context manager;
    :meth:`finding` is summary.json's ``disturbance`` entry so far."""

    def __init__(self, servers: set[int] | None = None, interval_s: float | None = None) -> None:
        self.roots = {os.getpid(), *(servers or set())}
        self.interval_s = PROBE_INTERVAL_S if interval_s is None else interval_s
        self.windows: list[Window] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ProbeWatch:
        if watching():
            self._thread = threading.Thread(target=self._loop, name="specledger-disturbance", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        cpus = os.cpu_count() or 1
        last = read(self.roots)
        while not self._stop.wait(self.interval_s):
            now = read(self.roots)
            self.windows.append(cpu_window(last, now, cpus))
            last = now

    def finding(self) -> dict[str, Any] | None:
        """The ``disturbance`` entry over the seconds read so far (None when nothing was watched)."""
        if self._thread is None:
            return None
        return window_finding([w.to_dict() for w in self.windows], "second", PROBE_RULE)


# ---- summary.json's entry and its one line ----

def window_finding(entries: Sequence[dict[str, Any]], unit: str, handling: str,
                   remeasured: int = 0, remeasured_quiet: int = 0) -> dict[str, Any]:
    """summary.json's ``disturbance`` from the windows' entries (each :meth:`Window.to_dict`): how many were
    judged and disturbed, the signals' spread, the rules, and :func:`finding_line`."""
    judged = [e for e in entries if e.get("window_s", 0) >= MIN_WINDOW_S]
    disturbed = [e for e in judged if e.get("disturbed")]
    out = {
        "watched": True, "unit": unit, "windows": len(entries), "judged": len(judged), "disturbed": len(disturbed),
        "fraction": round(len(disturbed) / len(judged), 4) if judged else None,
        "remeasured": remeasured, "remeasured_quiet": remeasured_quiet,
        "other_cores": spread([e["other_cores"] for e in judged]),
        "steal_cores": spread([e["steal_cores"] for e in judged]),
        "step_drift": spread([e["step_drift"] for e in judged if e.get("step_drift") is not None]),
        "thresholds": {"other_cores": OTHER_CORES_LIMIT, "step_drift": STEP_DRIFT_LIMIT, "min_window_s": MIN_WINDOW_S},
        "rule": RULE, "handling": handling,
    }
    return {**out, "line": finding_line(out)}


def _first_and_again(records: Sequence[Any], load_points: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The windows' entries of the prompts' groups (``load_points`` False) or of the load points (True, entries
    marked ``load_point``) as first measured, and those of their re-measures; one entry per window."""
    first: dict[tuple[Any, ...], dict[str, Any]] = {}
    again: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in records:
        entry = r.extra.get(EXTRA_KEY)
        if not isinstance(entry, dict) or "other_cores" not in entry or ("load_point" in entry) != load_points:
            continue
        who = (entry["load_point"], r.extra.get("setting")) if load_points else (r.prompt_id,)
        key = (*who, float(r.temperature), int(entry.get("window") or 0))
        (again if entry.get("remeasure") else first).setdefault(key, entry)
    return list(first.values()), list(again.values())


def _measured_finding(records: Sequence[Any], load_points: bool) -> dict[str, Any] | None:
    """:func:`window_finding` of the prompts or the load points as first measured, with how many were re-measured
    and came out quiet; None when none was watched."""
    first, again = _first_and_again(records, load_points)
    if not first:
        return None
    quiet = sum(1 for e in again if not e.get("disturbed"))
    unit, handling = ("load point", LOAD_REMEASURE_RULE) if load_points else ("prompt", REMEASURE_RULE)
    return window_finding(first, unit, handling, len(again), quiet)


def run_finding(records: Sequence[Any]) -> dict[str, Any] | None:
    """A run's ``disturbance`` entry from its trace: one window per prompt's group (per job with ``--sequential``)
    as it was first measured, how many were re-measured and came out quiet, and the load points' own finding
    under ``load_points`` (its clause in the ``line``); the load points' finding alone when no prompt was
    watched; None when no record was watched."""
    prompts, points = _measured_finding(records, False), _measured_finding(records, True)
    if prompts is None or points is None:
        return prompts or points
    out = {**prompts, "load_points": points}
    return {**out, "line": finding_line(out)}


def finding_line(f: dict[str, Any]) -> str:
    """One line for the answer and the report's first screen: quiet, or how much was disturbed and by what; with
    a clause on the load points (``f["load_points"]``) when some were disturbed."""
    line = _window_line(f)
    points = f.get("load_points") or {}
    if points.get("disturbed"):
        line += (f"; load points: {points['disturbed']} of {points['judged']} disturbed, {points['remeasured']} "
                 f"re-measured ({points['remeasured_quiet']} quiet the second time)")
    return line


def _window_line(f: dict[str, Any]) -> str:
    """:func:`finding_line` of one unit's windows."""
    unit = f["unit"]
    if not f.get("judged"):
        return f"machine: not judged (no {unit} measured for {MIN_WINDOW_S:g} s or more)"
    other, steal, drift = f.get("other_cores") or {}, f.get("steal_cores") or {}, f.get("step_drift")
    signals = f"other processes up to {other.get('max', 0):.2f} cores (median {other.get('median', 0):.2f})"
    signals += f", steal up to {steal.get('max', 0):.2f}" if steal.get("max", 0) >= 0.005 else ""
    signals += f", plain steps up to {drift['max']:.2f}x the run's own" if drift else ""
    if not f["disturbed"]:
        return f"machine: quiet while measuring ({signals})"
    line = (f"machine DISTURBED during {f['disturbed']} of {f['judged']} {unit}s ({100 * f['fraction']:.0f} %): "
            f"{signals}")
    if unit in ("prompt", "load point"):
        kept = f["disturbed"] - f["remeasured_quiet"]
        line += (f"; {f['remeasured']} re-measured ({f['remeasured_quiet']} quiet the second time), "
                 f"{kept} kept measured while disturbed: "
                 + ("speed figures" if unit == "prompt" else "load > 1 decisions") + " less reliable")
    else:
        line += "; the load generator's timings (and a local server's) less reliable"
    return line


__all__ = [
    "DISTURBED_EXPERIMENT", "EXTRA_KEY", "LOAD_REMEASURE_RULE", "MIN_WINDOW_S", "OTHER_CORES_LIMIT", "REMEASURE_SHARE",
    "STEP_DRIFT_LIMIT", "CpuTimes", "LoadWatch", "ProbeWatch", "Reading", "RunWatch", "Watch", "Window", "cpu_window",
    "descendants", "finding_line", "local_servers", "parse_pid_stat", "parse_proc_stat", "plain_step_ratio",
    "reasons", "run_finding", "step_drift", "watched", "window_finding",
]
