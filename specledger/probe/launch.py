"""``specledger probe --launch CMD --spec NAME=ARGS ...``: start an engine once per speculative
configuration, probe it at every load with the same prompts, stop it, go on; then decide as the local path.

``CMD`` is the engine's command line with ``{port}`` (required: the port the launcher picks, or
``--launch-port``) and ``{spec}`` (a configuration's arguments; appended at the end when absent). Each
``--spec NAME=ARGS`` is one configuration; the one named ``off`` (:data:`BASELINE_SPEC`) is plain decoding,
the baseline every other is compared with. Per configuration, in this order (:func:`run_order`: ``off``
first, then the others as given; with ``--repeats R`` the sequence R times, reversed every other time; every
server serves every load in ascending order):

1. the port must be free (a port already taken is a one-line error: something else would answer);
2. the engine starts with its log in ``OUT/launch/logs/NAME.log`` (:class:`EngineServer`), and must
   answer ``GET /health`` with 200 while its process lives (``--launch-timeout``);
3. :func:`specledger.probe.loads.run_probe_loads` probes it at each load (``/metrics`` scraped around
   each load);
4. the process group is stopped (SIGTERM, then SIGKILL), and the configuration is saved as
   ``OUT/launch/NAME.json`` (reports and per-request results of every load).

A server that fails to start or exits during its run is a one-line error naming its log; the saved
configurations stay, and the same command resumes (``OUT/launch/plan.json`` must match: same command,
configurations, loads, prompts and sampling). When every configuration is in, the run folder is written
as ``probe --loads`` writes it, with one drafter label per configuration (:func:`launch_records`), and
the report gives the four gates per (category, load), the verdicts and the schedule.

What the launched engine says is read as what it is:

* γ is the configured draft length (:func:`configured_gamma`: llama.cpp the flag of the ``--spec-type``, e.g.
  ``--spec-ngram-simple-size-m`` or ``--spec-draft-n-max``, else the default the binary's ``--help`` states;
  vLLM ``num_speculative_tokens``, SGLang ``--speculative-num-steps``), never the deepest position the
  counters show; ``"unknown"`` when nothing says;
* m_KV (bytes of K and V per token) from the GGUF the command loads (:func:`gguf_kv_facts`:
  ``2 · block_count · head_count_kv · head_dim · bytes per element``, f16 unless ``-ctk`` / ``-ctv`` say);
* the per-request speculation figures are reconciled with the server's counter deltas per configuration
  (:func:`specledger.probe.counters.engine_counters`; ``engine_counters`` in run.json and summary.json);
* the paste-ready config is that engine's own arguments (:func:`engine_flags`): the measured
  configuration's, with the engine's concurrency cap where the schedule turns speculation off above a
  load -- never another engine's config (the schedule's vLLM / TensorRT-LLM snippets are dropped).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx

from specledger.errors import SpecLedgerError
from specledger.probe.counters import engine_counters_over
from specledger.probe.loadgen import LoadConfig, RequestResult, Tokenizer
from specledger.probe.loads import LoadPoint, probe_document, run_probe_loads, tag_load_point
from specledger.probe.metrics import speedup
from specledger.probe.outputs import probe_run_meta, write_probe_run
from specledger.probe.records import BASELINE_DRAFTER, records_from_probe
from specledger.probe.workload import ProbeWorkload
from specledger.records import RequestRecord
from specledger.rundir import PROBE_JSON, RunDir, json_safe

BASELINE_SPEC = "off"
LAUNCH_DIR = "launch"
PLAN_NAME = "plan.json"
UNKNOWN_GAMMA = "unknown"
#: a later repeat's request numbers start at repeat x this (merge_repeats): ids stay unique across repeats
REPEAT_INDEX_STRIDE = 1_000_000
HOST = "127.0.0.1"
#: specledger's own drafter names (and the two probe labels): a configuration named so gets ``NAME@ENGINE``
#: as its label, so the schedule never writes specledger's config for that drafter to another engine
RESERVED_LABELS = frozenset({"ngram", "suffix", "model", "head", "layerskip", "quant-self", "none", "endpoint"})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: the flags that set the draft length, per engine (first found wins)
LLAMA_CPP_GAMMA_FLAGS = ("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft")
#: llama.cpp's n-gram drafters take their draft length from their own flag (llama.cpp 0.3.36 sources)
LLAMA_CPP_TYPE_GAMMA_FLAG = {"ngram-simple": "--spec-ngram-simple-size-m", "ngram-map-k": "--spec-ngram-map-k-size-m",
                             "ngram-map-k4v": "--spec-ngram-map-k4v-size-m", "ngram-mod": "--spec-ngram-mod-n-max"}
SGLANG_GAMMA_FLAGS = ("--speculative-num-steps",)
#: bytes per KV element of llama.cpp's --cache-type-k / -v (block types: bytes per block / block size)
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
                 "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}
#: the flag that caps concurrency, per engine (the schedule's "serve plainly above" advice)
CONCURRENCY_FLAG = {"llama.cpp": "--parallel", "vllm": "--max-num-seqs", "sglang": "--max-running-requests"}
#: every spelling of those flags (an existing one is replaced, not repeated)
CONCURRENCY_ALIASES = {"--parallel": ("--parallel", "-np"), "--max-num-seqs": ("--max-num-seqs",),
                       "--max-running-requests": ("--max-running-requests",)}


# ------------------------------------------------------------------------------------------ parsing
@dataclass(frozen=True)
class Spec:
    """One speculative configuration: its name and the arguments ``{spec}`` becomes."""

    name: str
    args: tuple[str, ...]

    @property
    def is_baseline(self) -> bool:
        return self.name == BASELINE_SPEC


def parse_spec(text: str) -> Spec:
    """``NAME=ARGS`` (ARGS split as a shell would, may be empty) -> :class:`Spec`."""
    if "=" not in text:
        raise SpecLedgerError(f"--spec {text!r} is not NAME=ARGS; e.g. --spec off= --spec "
                              "'ngram=--spec-type ngram-simple'")
    name, args = text.split("=", 1)
    name = name.strip()
    if not _NAME.fullmatch(name):
        raise SpecLedgerError(f"--spec name {name!r} is not usable; give letters, digits, '.', '_' or '-' "
                              "(e.g. off, ngram, draft4)")
    try:
        argv = shlex.split(args)
    except ValueError as exc:
        raise SpecLedgerError(f"--spec {name}: cannot split its arguments ({exc}); check the quotes") from None
    return Spec(name, tuple(argv))


def parse_specs(texts: Sequence[str]) -> list[Spec]:
    """Every ``--spec``: names unique, one named ``off`` (the baseline), at least one other."""
    specs = [parse_spec(t) for t in texts]
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SpecLedgerError(f"--spec {twice[0]} is given twice; give every configuration its own name")
    if BASELINE_SPEC not in names:
        raise SpecLedgerError(f"--launch needs a baseline: --spec {BASELINE_SPEC}= (the engine without speculation)")
    if len(specs) < 2:
        raise SpecLedgerError("--launch needs a configuration to compare with off, e.g. "
                              "--spec 'ngram=--spec-type ngram-simple'")
    return specs


def run_order(specs: Sequence[Spec], repeat: int = 0) -> list[Spec]:
    """``off`` first, then the others in the order given; every other repeat the reverse (A B, B A, A B, ...),
    so that whatever drifts with time (the machine warming, a neighbour's load) falls on every configuration
    alike, as the local side-by-side alternates its turns."""
    order = [s for s in specs if s.is_baseline] + [s for s in specs if not s.is_baseline]
    return order if repeat % 2 == 0 else order[::-1]


def saved_name(spec: Spec, repeat: int) -> str:
    """``NAME.json`` for the first repeat, ``NAME.rep<R>.json`` after it."""
    return f"{spec.name}.json" if repeat == 0 else f"{spec.name}.rep{repeat}.json"


def check_template(template: str) -> list[str]:
    """The launch command as words; it must hold ``{port}``."""
    if "{port}" not in template:
        raise SpecLedgerError("--launch must contain {port} where the engine's port goes, e.g. "
                              "--launch 'llama-server -m MODEL --port {port} {spec}'")
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise SpecLedgerError(f"--launch: cannot split the command ({exc}); check the quotes") from None
    if not words or words[0] in ("{port}", "{spec}"):
        raise SpecLedgerError("--launch must start with the engine's program, e.g. llama-server or vllm")
    return words


def engine_argv(template: str, port: int | str, spec: Spec) -> list[str]:
    """The command of one configuration: a word ``{spec}`` becomes its arguments (several words), a
    ``{spec}`` inside a word its arguments joined, ``{port}`` the port; without ``{spec}`` they go last."""
    out: list[str] = []
    for word in check_template(template):
        if word == "{spec}":
            out += spec.args
            continue
        out.append(word.replace("{spec}", shlex.join(spec.args)).replace("{port}", str(port)))
    if "{spec}" not in template:
        out += spec.args
    return out


def engine_kind(argv: Sequence[str]) -> str:
    """``llama.cpp``, ``vllm``, ``sglang`` or ``engine`` (unknown), from the program and its first words."""
    head = " ".join(Path(w).name for w in argv[:4]).lower()
    if "llama-server" in head or "llama_cpp" in head:
        return "llama.cpp"
    if "sglang" in head:
        return "sglang"
    if "vllm" in head:
        return "vllm"
    return "engine"


def _flag_value(argv: Sequence[str], names: Sequence[str]) -> str | None:
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                return argv[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def _whole(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def llama_cpp_gamma_flag(args: Sequence[str]) -> str:
    """The llama.cpp flag that sets the draft length of the ``--spec-type`` in ``args``
    (:data:`LLAMA_CPP_TYPE_GAMMA_FLAG`; a draft model's ``--spec-draft-n-max`` otherwise)."""
    types = (_flag_value(args, ("--spec-type",)) or "").split(",")
    return next((LLAMA_CPP_TYPE_GAMMA_FLAG[t] for t in types if t in LLAMA_CPP_TYPE_GAMMA_FLAG),
                LLAMA_CPP_GAMMA_FLAGS[0])


@functools.lru_cache(maxsize=16)
def _help_text(program: str, timeout_s: float = 20.0) -> str:
    try:
        return subprocess.run([program, "--help"], capture_output=True, text=True, errors="replace",
                              timeout=timeout_s, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def help_default(program: str, flag: str) -> int | None:
    """The ``(default: N)`` that ``program --help`` states for ``flag`` (llama.cpp writes it on the flag's
    line or the next); None when the program, the flag or a whole-number default is not found."""
    lines = _help_text(program).splitlines()
    for i, line in enumerate(lines):
        if re.search(rf"(^|[\s,]){re.escape(flag)}([\s,]|$)", line):
            found = re.search(r"\(default: (\d+)\)", " ".join(lines[i:i + 3]))
            return int(found.group(1)) if found else None
    return None


def configured_gamma(args: Sequence[str], kind: str, program: str | None = None) -> int | None:
    """The draft length a configuration sets: llama.cpp the flag of its ``--spec-type``
    (:func:`llama_cpp_gamma_flag`: ``--spec-ngram-simple-size-m`` for ngram-simple, ``--spec-draft-n-max`` for a
    draft model), else, given the engine's ``program``, the default its ``--help`` states for that flag
    (:func:`help_default`: what that build runs with); vLLM ``num_speculative_tokens`` of the
    ``--speculative-config`` JSON; SGLang ``--speculative-num-steps`` (NGRAM: ``--speculative-num-draft-tokens``
    - 1). None when neither says: never the deepest position the counters happen to show."""
    if kind == "vllm":
        for word in args:
            text = word.split("=", 1)[1] if word.startswith("--speculative-config=") else word
            if text.lstrip().startswith("{"):
                try:
                    value = json.loads(text).get("num_speculative_tokens")
                except (ValueError, AttributeError):
                    continue
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return None
    if kind == "sglang":
        steps = _whole(_flag_value(args, SGLANG_GAMMA_FLAGS))
        tokens = _whole(_flag_value(args, ("--speculative-num-draft-tokens",)))
        return steps if steps else (tokens - 1 if tokens and tokens > 1 else None)
    flag = llama_cpp_gamma_flag(args)
    given = _whole(_flag_value(args, (flag,) if flag != LLAMA_CPP_GAMMA_FLAGS[0] else LLAMA_CPP_GAMMA_FLAGS))
    if given:
        return given
    return help_default(program, flag) if program and kind == "llama.cpp" else None


def setting_label(spec: Spec, kind: str) -> str:
    """The drafter label of a configuration's records: its name, or ``NAME@ENGINE`` for a name specledger
    uses for its own drafters (the schedule then writes no specledger-drafter config for this engine)."""
    if spec.is_baseline:
        return BASELINE_DRAFTER
    return f"{spec.name}@{kind}" if spec.name in RESERVED_LABELS else spec.name


# --------------------------------------------------------------------------------- the model file
def model_path(argv: Sequence[str]) -> Path | None:
    """The GGUF a llama.cpp command loads (``-m`` / ``--model``), if it names an existing ``.gguf``."""
    value = _flag_value(argv, ("-m", "--model"))
    path = Path(value).expanduser() if value else None
    return path if path is not None and path.suffix == ".gguf" and path.is_file() else None


def gguf_kv_facts(path: Path, argv: Sequence[str] = ()) -> dict[str, Any]:
    """m_KV from a GGUF's metadata: ``kv_bytes_per_token = block_count · head_count_kv · (key_length +
    value_length) · bytes per element`` (key/value length default ``embedding_length / head_count``; bytes
    per element from ``-ctk`` / ``-ctv`` in ``argv``, f16 by default, :data:`KV_TYPE_BYTES`), and the file's
    size as ``weight_bytes``. A file the ``gguf`` library cannot read is a one-line error."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
        values = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
        arch = str(values["general.architecture"])
        layers = int(values[f"{arch}.block_count"])
        heads = int(values[f"{arch}.attention.head_count"])
        kv_heads = int(values.get(f"{arch}.attention.head_count_kv", heads))
        head_dim = int(values[f"{arch}.embedding_length"]) // heads
        k_len = int(values.get(f"{arch}.attention.key_length", head_dim))
        v_len = int(values.get(f"{arch}.attention.value_length", head_dim))
    except Exception as exc:  # the reader raises KeyError, ValueError, struct errors ... on a bad file
        raise SpecLedgerError(f"cannot read the GGUF metadata of {path} ({type(exc).__name__}: {exc})") from None
    k_type = _flag_value(argv, ("-ctk", "--cache-type-k")) or "f16"
    v_type = _flag_value(argv, ("-ctv", "--cache-type-v")) or "f16"
    k_bytes, v_bytes = KV_TYPE_BYTES.get(k_type.lower()), KV_TYPE_BYTES.get(v_type.lower())
    facts: dict[str, Any] = {"kv_model_file": str(path), "kv_layers": layers, "kv_heads": kv_heads,
                             "kv_head_dims": [k_len, v_len], "kv_cache_types": [k_type, v_type],
                             "weight_bytes": path.stat().st_size}
    if k_bytes is not None and v_bytes is not None:
        facts["kv_bytes_per_token"] = int(round(layers * kv_heads * (k_len * k_bytes + v_len * v_bytes)))
    return facts


def machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# ------------------------------------------------------------------------------------------ servers
def port_taken(port: int, host: str = HOST) -> bool:
    """True when something accepts connections on ``host:port`` or the port cannot be bound."""
    with socket.socket() as probe:
        probe.settimeout(0.5)
        if probe.connect_ex((host, port)) == 0:
            return True
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EngineServer:
    """One engine process (its own process group, output to ``log_path``) serving on ``HOST:port``."""

    def __init__(self, name: str, argv: Sequence[str], port: int, log_path: Path) -> None:
        self.name, self.argv, self.port, self.log_path = name, list(argv), port, Path(log_path)
        self.url = f"http://{HOST}:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if port_taken(self.port):
            raise SpecLedgerError(f"port {self.port} is already taken on {HOST} (another server would answer the "
                                  "probe; the engine was not started, so it has no log); pass another --launch-port, "
                                  "or leave it out to pick a free one")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(f"$ {shlex.join(self.argv)}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                raise SpecLedgerError(f"cannot start the engine of spec {self.name!r} ({exc.strerror or exc}: "
                                      f"{self.argv[0]}); check the --launch command (log: {self.log_path})") from None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def died(self, when: str) -> SpecLedgerError:
        return SpecLedgerError(f"the engine of spec {self.name!r} exited with code {self.exit_code()} {when}; "
                               f"its log: {self.log_path}")

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ``GET /health`` answered 200 with the process alive; a one-line error otherwise."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.exit_code() is not None:
                raise self.died("before it was ready")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200 and self.exit_code() is None:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SpecLedgerError(f"the engine of spec {self.name!r} did not answer {self.url}/health within "
                              f"{timeout_s:.0f} s; its log: {self.log_path} (raise --launch-timeout?)")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


# ------------------------------------------------------------------------------- one configuration
@dataclass
class SpecRun:
    """One configuration's part of the run: every load's report and per-request results."""

    spec: Spec
    argv: list[str]
    log: str
    ready_s: float | None
    points: list[LoadPoint] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"name": self.spec.name, "args": list(self.spec.args), "argv": self.argv, "log": self.log,
                          "ready_s": self.ready_s,
                          "points": [{"load": p.load, "report": p.full["probe"]} for p in self.points]})

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> SpecRun:
        names = {f.name for f in fields(RequestResult)}
        points = [LoadPoint(int(p["load"]), {"probe": p["report"]},
                            [RequestResult(**{k: v for k, v in r.items() if k in names})
                             for r in p["report"].get("results") or []])
                  for p in doc["points"]]
        return cls(Spec(str(doc["name"]), tuple(doc["args"])), list(doc["argv"]), str(doc["log"]),
                   doc.get("ready_s"), points)


Progress = Callable[[str], None]


def probe_spec(template: str, spec: Spec, loads: Sequence[int], config: LoadConfig, items: list[Any], folder: Path,
               *, port: int | None, ready_timeout_s: float, tokenizer: Tokenizer | None,
               progress: Progress | None = None, repeat: int = 0) -> SpecRun:
    """Start the engine of ``spec``, probe it at every load, stop it; a death is a one-line error. Its log is
    ``logs/NAME.log`` (``logs/NAME.rep<R>.log`` for a later repeat)."""
    chosen = port if port is not None else free_port()
    argv = engine_argv(template, chosen, spec)
    log_name = Path(saved_name(spec, repeat)).with_suffix(".log").name
    server = EngineServer(spec.name, argv, chosen, folder / "logs" / log_name)
    say = progress or (lambda _: None)
    say(f"{spec.name}: starting {shlex.join(argv)} (log {server.log_path})")
    server.start()
    try:
        ready = server.wait_ready(ready_timeout_s)
        say(f"{spec.name}: ready after {ready:.1f} s")

        def check(load: int, _role: str) -> None:
            if server.exit_code() is not None:
                raise server.died(f"during the run (before load {load})")
            say(f"{spec.name}: load {load}")

        try:
            points = run_probe_loads(server.url, config, items, loads, metrics=True, tokenizer=tokenizer,
                                     progress=check)
        except SpecLedgerError:
            if server.exit_code() is not None:
                raise server.died("during the run") from None
            raise
        if server.exit_code() is not None:
            raise server.died("during the run")
    finally:
        server.stop()
    return SpecRun(spec, argv, str(server.log_path), round(ready, 3), points)


# ------------------------------------------------------------------------------------ the whole run
def plan_document(template: str, specs: Sequence[Spec], loads: Sequence[int], config: LoadConfig,
                  workload: ProbeWorkload, repeats: int = 1) -> dict[str, Any]:
    """What a resumed run must share with the saved configurations."""
    return {"launch": template, "specs": {s.name: list(s.args) for s in specs}, "loads": sorted(set(loads)),
            "prompts": [item.id for item in workload.items], "max_tokens": config.max_tokens,
            "temperature": config.temperature, "top_p": config.top_p, "seed": config.seed, "chat": config.chat,
            "requests": config.num_requests, "model": config.model, "repeats": repeats}


def _check_plan(folder: Path, plan: dict[str, Any]) -> None:
    path = folder / PLAN_NAME
    if path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            saved = None
        if saved != json_safe(plan):
            raise SpecLedgerError(f"{path.parent.parent} holds a launch with other settings ({path}); pass a new "
                                  "--out, or the same command to resume it")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        RunDir(folder).write(PLAN_NAME, plan)


def run_launch(template: str, specs: Sequence[Spec], loads: Sequence[int], config: LoadConfig,
               workload: ProbeWorkload, out: Path, *, port: int | None = None, ready_timeout_s: float = 600.0,
               tokenizer: Tokenizer | None = None, progress: Progress | None = None,
               repeats: int = 1) -> dict[str, SpecRun]:
    """Every configuration, ``repeats`` times, in :func:`run_order` of each repeat (alternating), each saved as
    it finishes (a saved one is read back, not run again); returns them by name, the repeats merged
    (:func:`merge_repeats`)."""
    check_template(template)
    if repeats < 1:
        raise SpecLedgerError(f"--repeats {repeats}: give 1 or more")
    folder = Path(out) / LAUNCH_DIR
    _check_plan(folder, plan_document(template, specs, loads, config, workload, repeats))
    done: dict[str, list[SpecRun]] = {s.name: [] for s in specs}
    for repeat in range(repeats):
        for spec in run_order(specs, repeat):
            saved = folder / saved_name(spec, repeat)
            if saved.is_file():
                done[spec.name].append(SpecRun.from_dict(RunDir(folder).read(saved.name)))
                if progress:
                    progress(f"{spec.name} (repeat {repeat + 1}): finished before, read from {saved}")
                continue
            if progress and repeats > 1:
                progress(f"{spec.name}: repeat {repeat + 1} of {repeats}")
            run = probe_spec(template, spec, loads, config, workload.items, folder, port=port,
                             ready_timeout_s=ready_timeout_s, tokenizer=tokenizer, progress=progress, repeat=repeat)
            RunDir(folder).write(saved.name, run.to_dict())
            done[spec.name].append(run)
    return {name: merge_repeats(runs) for name, runs in done.items()}


def point_windows(point: LoadPoint) -> list[tuple[Any, Any]]:
    """The server-counter windows (before, after) behind one load point: one per repeat (a merged point keeps
    them under ``windows``; a restarted server counts from zero, so windows are added, never spanned)."""
    report = point.full["probe"]
    if report.get("windows") is not None:
        return [(b, a) for b, a in report["windows"]]
    counters = report.get("spec_decode_counters") or {}
    return [(counters.get("before"), counters.get("after"))]


def merge_repeats(runs: Sequence[SpecRun]) -> SpecRun:
    """One configuration's repeats as one run: per load, every repeat's results together and the probe
    summary over them (:func:`specledger.probe.metrics.summarize`, the repeats' wall times added: throughput is
    Σ tokens / Σ time); the server-counter window of every (repeat, load) kept, since a restarted server counts
    from zero (:func:`counters_of` adds the windows' deltas)."""
    from specledger.probe.metrics import summarize

    first = runs[0]
    if len(runs) == 1:
        return first
    points = []
    for p in first.points:
        same = [q for run in runs for q in run.points if q.load == p.load]
        # each repeat's request numbers offset, so request ids (drafter|γ|prompt|index) stay unique
        results = [dataclasses.replace(r, index=k * REPEAT_INDEX_STRIDE + r.index)
                   for k, q in enumerate(same) for r in q.results]
        wall = sum(float(q.full["probe"]["summary"].get("wall_time_s") or 0.0) for q in same)
        report = {**p.full["probe"], "summary": summarize(results, wall), "repeats": len(same),
                  "windows": [w for q in same for w in point_windows(q)],
                  "results": [r.to_dict() for r in results],
                  "warnings": [w for q in same for w in q.full["probe"].get("warnings") or []],
                  # one server's window each: pooled over the repeats in launch.specs.NAME.ledger instead
                  "spec_decode": None, "spec_decode_counters": None, "server_histograms": {}, "server_rates": {},
                  "spec_decode_note": f"pooled over {len(same)} repeats: see launch.specs in run.json"}
        points.append(LoadPoint(p.load, {"probe": report}, results))
    return SpecRun(first.spec, first.argv, first.log, first.ready_s, points)


def _points_by_load(run: SpecRun) -> dict[int, LoadPoint]:
    return {p.load: p for p in run.points}


def paired_points(cand: SpecRun, base: SpecRun) -> list[LoadPoint]:
    """``cand`` against ``off`` at every load: the ``probe --baseline --loads`` shape (off ran first)."""
    base_at = _points_by_load(base)
    out = []
    for p in cand.points:
        b = base_at[p.load]
        full = {"probe": p.full["probe"], "baseline": b.full["probe"],
                "speedup": speedup(p.full["probe"]["summary"], b.full["probe"]["summary"])}
        out.append(LoadPoint(p.load, full, p.results, b.results, ("baseline", "probe")))
    return out


def launch_records(runs: Mapping[str, SpecRun], kind: str, workload: ProbeWorkload, tokenizer: Tokenizer | None,
                   config: LoadConfig) -> list[RequestRecord]:
    """Every configuration's records at every load (:func:`specledger.probe.loads.tag_load_point`), one drafter
    label each (:func:`setting_label`), γ from :func:`configured_gamma`."""
    records: list[RequestRecord] = []
    for name, run in runs.items():
        label = setting_label(run.spec, kind)
        gamma: int | str = (0 if run.spec.is_baseline
                            else configured_gamma(run.argv, kind, run.argv[0]) or UNKNOWN_GAMMA)
        for p in run.points:
            report = p.full["probe"]
            recs = records_from_probe(p.results, drafter=label, gamma=gamma, model=report["model"],
                                      endpoint=f"{report['url']} ({name})", temperature=config.temperature,
                                      top_p=config.top_p, seed=config.seed, category_of=workload.category_of,
                                      score_of=workload.score_of, tokenizer=tokenizer)
            records += tag_load_point(recs, p.load, label, gamma, report["summary"].get("wall_time_s"))
    return records


def counters_of(run: SpecRun) -> dict[str, Any]:
    """Σ per-request speculation figures over every load and repeat against the server's counter deltas added
    over the (repeat, load) windows (:func:`specledger.probe.counters.engine_counters_over`: nothing else
    reached the server inside a window; a restarted server counts from zero)."""
    return engine_counters_over([r for p in run.points for r in p.results],
                                [w for p in run.points for w in point_windows(p)])


def pooled_ledger(run: SpecRun | Sequence[LoadPoint], gamma: int | None) -> dict[str, Any]:
    """The acceptance ledger of one configuration over its whole run, from the server's counter windows (each
    load of each repeat): ``E[L] = 1 + accepted / drafts`` (bonus token counted), per-position rates
    ``Pr(K ≥ i) = Δaccepted_at_i / Δdrafts`` and their conditional chain
    (:func:`specledger.ledger.server_acceptance.acceptance_ledger`), ``gamma`` the configured draft length
    (not the number of positions the counters show). Every figure None when the server drafted nothing."""
    from specledger.ledger.server_acceptance import acceptance_ledger
    from specledger.probe.counters import windows_counts

    points = run.points if isinstance(run, SpecRun) else run
    windows = [(b or {}, a or {}) for p in points for b, a in point_windows(p)]
    totals = windows_counts(windows)[0]  # the same deltas engine_counters_over reconciles
    drafts, drafted, accepted = (float(totals[k] or 0) for k in ("drafts", "draft_tokens", "accepted"))

    def delta_at(position: str) -> float:
        return sum(float((a.get("accepted_per_pos") or {}).get(position) or 0)
                   - float((b.get("accepted_per_pos") or {}).get(position) or 0) for b, a in windows)

    positions = sorted({int(k) for _, a in windows for k in (a.get("accepted_per_pos") or {})})
    rates = [delta_at(str(i)) / drafts for i in positions] if drafts > 0 else []
    ledger = acceptance_ledger({"per_position_rates": rates,
                                "mean_acceptance_length": 1 + accepted / drafts if drafts > 0 else None})
    ledger.update(gamma=gamma, rounds=int(drafts), draft_tokens=int(drafted), accepted=int(accepted),
                  acceptance_rate=accepted / drafted if drafted > 0 else None,
                  positions_seen=len(rates))
    return ledger


def _on_loads(cells: Sequence[Mapping[str, Any]], label: str) -> list[int]:
    return sorted(int(v.get("load") or 1) for v in cells if v.get("decision") == "deploy" and v.get("drafter") == label)


def engine_flags(template: str, spec: Spec, kind: str, on_loads: Sequence[int], loads: Sequence[int]
                 ) -> tuple[list[str], str]:
    """(the engine command to deploy ``spec``, a note): ``{spec}`` filled with its measured arguments,
    ``{port}`` as ``PORT``; when it pays at the lowest loads only, the engine's concurrency cap
    (:data:`CONCURRENCY_FLAG`) at the largest load of that run."""
    argv = engine_argv(template, "PORT", spec)
    measured = sorted(set(loads))
    cap = 0
    for load in measured:
        if load not in on_loads:
            break
        cap = load
    flag = CONCURRENCY_FLAG.get(kind)
    shown = ", ".join(map(str, measured))
    if cap and cap < measured[-1] and flag:
        note = (f"pays at loads up to {cap} of those measured ({shown}): {flag} {cap} keeps the engine there; serve "
                "more traffic from a plain server")
        return with_flag(argv, CONCURRENCY_ALIASES.get(flag, (flag,)), str(cap)), note
    if cap and cap == measured[-1]:
        return argv, f"pays at every measured load ({shown}); above {cap} it was not measured"
    if cap:  # pays at the lowest loads, and this engine has no concurrency cap we know of
        return argv, f"pays at loads up to {cap} of those measured ({shown}); cap this engine's concurrency there"
    return argv, f"on at loads {', '.join(map(str, on_loads))} only, off at load {measured[0]}: one server cannot " \
                 "switch by load; run it only where the load stays there"


def with_flag(argv: Sequence[str], names: Sequence[str], value: str) -> list[str]:
    """``argv`` with the flag ``names[0]`` set to ``value``: an existing value of any of its spellings
    (``-np 4``, ``--parallel=4``) replaced, else the flag appended."""
    out, found = list(argv), False
    for i, word in enumerate(out):
        if word in names and i + 1 < len(out):
            out[i + 1], found = value, True
        elif any(word.startswith(n + "=") for n in names if n.startswith("--")):
            out[i], found = f"{word.split('=', 1)[0]}={value}", True
    return out if found else out + [names[0], value]


def patch_schedules(summary: dict[str, Any], template: str, specs: Sequence[Spec], kind: str,
                    loads: Sequence[int]) -> None:
    """In place: each schedule's engine snippets become the launched engine's command (``engine_flags``,
    under ``engine``), the other engines' are dropped (they were not what ran)."""
    by_label = {setting_label(s, kind): s for s in specs}
    for sch in summary.get("schedules") or []:
        cells = [v for v in summary.get("verdicts") or []
                 if v.get("category") == sch.get("category") and v.get("temperature") == sch.get("temperature")]
        deployed = [v.get("drafter") for v in cells if v.get("decision") == "deploy"]
        label = max(sorted(set(deployed)), key=deployed.count) if deployed else None  # ties: by name, reproducible
        for key in ("vllm", "trtllm", "sglang", "llama_cpp"):
            sch[key] = None
        sch["configs_note"] = ""
        if label in by_label:
            argv, note = engine_flags(template, by_label[label], kind, _on_loads(cells, label), loads)
            sch["engine"] = {"kind": kind, "spec": by_label[label].name, "argv": argv, "command": shlex.join(argv),
                             "note": note}
        else:
            sch["engine"] = {"kind": kind, "spec": BASELINE_SPEC, "argv": None, "command": None,
                             "note": "speculation pays at no measured load: serve with --spec off's command"}


def patch_launched_schedules(summary: dict[str, Any], launch: Mapping[str, Any], loads: Sequence[int]) -> None:
    """:func:`patch_schedules` from what run.json's ``launch`` records (the summary builder calls it, so a
    report rebuilt with ``specledger report`` keeps the engine's own command)."""
    specs = [Spec(str(name), tuple(d.get("args") or ())) for name, d in (launch.get("specs") or {}).items()]
    patch_schedules(summary, str(launch.get("command") or ""), specs, str(launch.get("engine") or "engine"), loads)


def write_launch_dir(out: Path, runs: Mapping[str, SpecRun], template: str, specs: Sequence[Spec],
                     loads: Sequence[int], config: LoadConfig, workload: ProbeWorkload, tokenizer: Tokenizer | None,
                     slo: Any = None, repeats: int = 1) -> dict[str, Any]:
    """traces.jsonl + run.json (with ``engine_counters`` and ``launch``) + probe.json, then the report; returns
    the summary, whose schedules' snippets are the engine's own command (:func:`patch_launched_schedules`)."""
    from specledger.report.build import build_report

    base = runs[BASELINE_SPEC]
    first_argv = base.argv
    kind = engine_kind(first_argv)
    cands = [s for s in run_order(specs) if not s.is_baseline]
    records = launch_records(runs, kind, workload, tokenizer, config)
    first = paired_points(runs[cands[0].name], base)
    gammas = {s.name: configured_gamma(runs[s.name].argv, kind, runs[s.name].argv[0]) for s in cands}
    meta = probe_run_meta(Path(out).name, first[0].full["probe"], first[0].full["baseline"],
                          drafter=setting_label(cands[0], kind), gamma=gammas[cands[0].name] or UNKNOWN_GAMMA,
                          workload=workload)
    counters = {name: counters_of(run) for name, run in runs.items()}
    gguf = model_path(first_argv)
    meta.update({
        "machine": f"launched {kind} engine on {HOST}",
        "loads": sorted(set(loads)),
        "load_order": {str(load): [s.name for r in range(repeats) for s in run_order(specs, r)]
                       for load in sorted(set(loads))},
        "engine_counters": counters,
        "launch": {"command": template, "engine": kind, "repeats": repeats,
                   "order": ("off first, then each --spec in the order given" if repeats == 1 else
                             f"{repeats} repeats, the order reversed every other repeat (off first, then last, ...)")
                            + "; each server serves every load in ascending order, then stops",
                   "specs": {s.name: {"args": list(s.args), "label": setting_label(s, kind),
                                      "gamma": 0 if s.is_baseline else (gammas[s.name] or UNKNOWN_GAMMA),
                                      "ledger": None if s.is_baseline else pooled_ledger(runs[s.name], gammas[s.name]),
                                      "log": runs[s.name].log, "ready_s": runs[s.name].ready_s} for s in specs}},
    })
    if gguf is not None:
        meta.update(gguf_kv_facts(gguf, first_argv))
        if kind == "llama.cpp":
            meta["memory_total_bytes"] = machine_memory()  # the CPU build's memory: this machine's
    document = probe_document(first)
    document["specs"] = {name: [{"load": p.load, **{k: v for k, v in p.full["probe"].items() if k != "results"}}
                                for p in run.points] for name, run in runs.items()}
    RunDir(out).write(PROBE_JSON, document)
    write_probe_run(out, records, meta)
    summary, _html = build_report(out, slo)  # the summary carries launch and engine_counters from run.json
    return summary


__all__ = ["BASELINE_SPEC", "EngineServer", "Spec", "SpecRun", "check_template", "configured_gamma", "counters_of",
           "engine_argv", "engine_flags", "engine_kind", "gguf_kv_facts", "launch_records", "paired_points",
           "merge_repeats", "parse_spec", "parse_specs", "patch_launched_schedules", "patch_schedules", "point_windows",
           "pooled_ledger", "port_taken", "probe_spec", "run_launch", "run_order",
           "setting_label", "write_launch_dir"]
