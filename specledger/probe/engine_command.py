"""The launched engine's command line (``probe --launch CMD --spec NAME=ARGS``): the configurations, the
template's ``{port}`` / ``{spec}``, which engine it is, the draft length it configures and the drafter label
its records get. Nothing here starts a process but :func:`help_default` and :func:`binary_flags` (``PROGRAM
--help``, cached per binary)."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specledger.engine.drafters import catalog
from specledger.errors import SpecLedgerError
from specledger.probe.records import BASELINE_DRAFTER, ENDPOINT_DRAFTER

BASELINE_SPEC = "off"
UNKNOWN_GAMMA = "unknown"
#: specledger's own drafter names (and the two probe labels): a configuration named so gets ``NAME@ENGINE``
#: as its label, so the schedule never writes specledger's config for that drafter to another engine
RESERVED_LABELS = frozenset(catalog.names()) | {ENDPOINT_DRAFTER}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: the flags that set the draft length, per engine (first found wins)
LLAMA_CPP_GAMMA_FLAGS = ("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft")
#: llama.cpp's n-gram drafters take their draft length from their own flag (llama.cpp 0.3.36 sources)
LLAMA_CPP_TYPE_GAMMA_FLAG = {"ngram-simple": "--spec-ngram-simple-size-m", "ngram-map-k": "--spec-ngram-map-k-size-m",
                             "ngram-map-k4v": "--spec-ngram-map-k4v-size-m", "ngram-mod": "--spec-ngram-mod-n-max"}
SGLANG_GAMMA_FLAGS = ("--speculative-num-steps",)


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


def flag_value(argv: Sequence[str], names: Sequence[str]) -> str | None:
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
    types = (flag_value(args, ("--spec-type",)) or "").split(",")
    return next((LLAMA_CPP_TYPE_GAMMA_FLAG[t] for t in types if t in LLAMA_CPP_TYPE_GAMMA_FLAG),
                LLAMA_CPP_GAMMA_FLAGS[0])


@functools.lru_cache(maxsize=16)
def _help_text(program: str, timeout_s: float = 20.0) -> str:
    try:
        return subprocess.run([program, "--help"], capture_output=True, text=True, errors="replace",
                              timeout=timeout_s, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def binary_flags(program: str | Path) -> frozenset[str] | None:
    """The flags ``program --help`` offers (:func:`specledger.gates.engine_validators.help_flags`: removed
    ones left out), read once per binary (path, size and modification time); None when it cannot be run or
    prints no flags."""
    path = Path(program)
    try:
        stat = path.stat()
    except OSError:
        return None
    return _binary_flags(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _binary_flags(program: str, size: int, mtime_ns: int) -> frozenset[str] | None:
    from specledger.gates.engine_validators import help_flags

    flags = help_flags(_help_text.__wrapped__(program))  # uncached: this cache is keyed by the file itself
    return flags or None


#: the environment variable naming a llama-server binary (the tests and the schedules' flag check read it)
LLAMA_SERVER_ENV = "SPECLEDGER_LLAMA_SERVER"


def llama_flags_at_hand() -> frozenset[str] | None:
    """The flags of the llama-server ``$SPECLEDGER_LLAMA_SERVER`` names (:func:`binary_flags`), so the
    schedules' llama.cpp configs are checked against the binary that will run them; None when unset."""
    path = os.environ.get(LLAMA_SERVER_ENV)
    return binary_flags(Path(path).expanduser()) if path else None


def check_engine_command(engine: dict) -> None:
    """In place, for a ``probe --launch`` schedule's ``engine`` entry (kind, argv, command, note): a llama.cpp
    command whose flags its own binary's ``--help`` does not offer (:func:`binary_flags`) loses its
    ``argv`` / ``command`` and its note says which flags; any other engine, or no readable binary, is left."""
    argv = engine.get("argv")
    if engine.get("kind") != "llama.cpp" or not argv:
        return
    from specledger.gates.engine_validators import unknown_flags

    known = binary_flags(argv[0])
    missing = unknown_flags(argv[1:], known) if known else []
    if missing:
        engine.update(argv=None, command=None, note=f"{argv[0]} --help does not offer {', '.join(missing)}: "
                      f"not emitted (was: {engine.get('note')})")


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
        steps = _whole(flag_value(args, SGLANG_GAMMA_FLAGS))
        tokens = _whole(flag_value(args, ("--speculative-num-draft-tokens",)))
        return steps if steps else (tokens - 1 if tokens and tokens > 1 else None)
    flag = llama_cpp_gamma_flag(args)
    given = _whole(flag_value(args, (flag,) if flag != LLAMA_CPP_GAMMA_FLAGS[0] else LLAMA_CPP_GAMMA_FLAGS))
    if given:
        return given
    return help_default(program, flag) if program and kind == "llama.cpp" else None


def spec_drafter_label(spec: Spec, kind: str) -> str:
    """The drafter label of a configuration's records: its name, or ``NAME@ENGINE`` for a name specledger
    uses for its own drafters (the schedule then writes no specledger-drafter config for this engine)."""
    if spec.is_baseline:
        return BASELINE_DRAFTER
    return f"{spec.name}@{kind}" if spec.name in RESERVED_LABELS else spec.name
