"""``summary.json``'s decisions as types: a verdict (``verdicts``, ``mix``, a schedule's ``at_target``) is the
gates' own :class:`specledger.gates.decision.Verdict`, a plain dataclass, read through :data:`FileVerdict` and
:data:`MixVerdict`; the schedules over loads and context buckets, and the race's dropped settings, are
:class:`~specledger.report.summary_rows.FileModel` types (lenient to read, strict as a schema). Part of
:class:`specledger.report.summary_model.Summary`.

How pydantic reads and describes the gates' dataclasses (they import no pydantic):

- a plain dataclass is validated with the config of the model that holds it, FileModel's: each field's docstring
  is its key's description in the schema, and keys the type does not name are kept (``additionalProperties``);
- :func:`read_verdict`, a before-validator, reads what summaries written before a key existed lack as the report
  has always read it (:data:`LEGACY_VERDICT`, and a comparison without ``n``) rather than as the rule's default;
- :data:`FILE_KEYS` says what a file holds of each dataclass, as a FileModel's ``REQUIRED`` and ``NEVER_NULL``
  say it of a model, and :class:`Carries` the keys a verdict carries in one place of the file only (``load`` in
  ``verdicts``, ``weights`` in ``mix``); :func:`specledger.report.summary_model.summary_schema` applies both."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, GetJsonSchemaHandler, JsonValue
from pydantic.json_schema import JsonDict, JsonSchemaValue
from pydantic_core import CoreSchema

from specledger.gates.decision import OFF, Comparison, Verdict
from specledger.report.summary_rows import (
    Count,
    FileModel,
    Gamma,
    Keyed,
    Load,
    file_schema,
)

#: what the report reads for a verdict key a summary lacks, where the rule's own default would read otherwise
LEGACY_VERDICT: dict[str, Any] = {
    "category": "", "temperature": 0.0,  # every summary carries both; a hand-made one may not
    "decision": OFF,  # not the rule's "no-decision": a verdict that names no decision reads as off
    "resolution": None,  # summaries before it: the status is read from ``resolved`` (view.status_of)
    "resolved": None,  # missing too: the page reads resolved (no resolution says otherwise), the console open
}


def read_verdict(value: Any) -> Any:
    """A verdict as ``summary.json`` holds it, with the keys older summaries lack read as the report has always
    read them (:data:`LEGACY_VERDICT`; a comparison without ``n``: None, shown as "n/a"). A legacy ``dropped``
    needs nothing: :attr:`Verdict.dropped` reads it. Anything but a mapping passes as it is, to the type's own
    validation."""
    if not isinstance(value, Mapping):
        return value
    out = {**LEGACY_VERDICT, **value}
    comparisons = out.get("comparisons")
    if isinstance(comparisons, list):
        out["comparisons"] = [{"n": None, **c} if isinstance(c, Mapping) else c for c in comparisons]
    return out


@dataclass(frozen=True)
class Carries:
    """Where a verdict sits in the file, the keys it carries there beyond the ones every verdict carries: its
    JSON Schema is the verdict's ``$ref`` with these ``required`` beside it."""

    keys: tuple[str, ...]

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(schema), "required": list(self.keys)}


#: a verdict of ``verdicts`` (or a schedule's ``at_target``): decided at a load, measured or simulated
FileVerdict = Annotated[Verdict, BeforeValidator(read_verdict), Carries(("load", "simulated"))]
#: one setting for the traffic as a whole at one temperature (``mix``, :mod:`specledger.gates.mix`): a verdict
#: (category "all traffic", decided at the solo load) with the traffic's ``weights`` and every setting's figures
MixVerdict = Annotated[Verdict, BeforeValidator(read_verdict), Carries(("weights", "settings"))]


@dataclass(frozen=True)
class FileKeys:
    """What a file holds of one of the gates' dataclasses, as a FileModel's ``REQUIRED`` and ``NEVER_NULL`` say it
    of a model (:func:`~specledger.report.summary_rows.file_schema`; without ``required``, the fields without a
    default), and the lower bounds its schema states."""

    required: tuple[str, ...] = ()
    never_null: tuple[str, ...] = ()
    minimum: dict[str, int] = field(default_factory=dict)

    def apply(self, schema: JsonDict, cls: type[Any]) -> None:
        """``schema``, dataclass ``cls``'s generated JSON Schema, as the file holds it; a field whose default is
        made by a factory (an empty list) states that default, as any other field's does."""
        properties = schema["properties"]
        assert isinstance(properties, dict)
        for f in fields(cls):
            prop = properties.get(f.name)
            if isinstance(prop, dict) and f.default_factory is not MISSING:
                prop.setdefault("default", f.default_factory())
        file_schema(schema, self.required, self.never_null)
        for name, low in self.minimum.items():
            prop = properties[name]
            assert isinstance(prop, dict)
            prop["minimum"] = low


#: the gates' dataclasses whose file form differs from what their fields say (every other one: :class:`FileKeys`)
FILE_KEYS: dict[type, FileKeys] = {
    Verdict: FileKeys(
        required=("category", "temperature", "decision", "label", "speedup", "speedup_ci", "reason", "headline",
                  "resolved", "resolution"),
        never_null=("resolution", "resolved", "context_bucket", "shown_through", "needs_plain", "weights", "settings",
                    "load", "simulated", "race_dropped", "dropped"),
        minimum={"prompts": 0, "load": 1}),
    Comparison: FileKeys(required=("a", "b", "ratio", "ci", "verdict"), never_null=("n",)),
}


class DroppedSetting(FileModel):
    """A setting the race stopped running: ``race.dropped`` (a verdict's ``dropped`` of older summaries is the gates'
    :class:`~specledger.gates.decision.LegacyDrop`)."""

    category: str | None = None
    """The decision's category (``race.dropped``)."""
    temperature: float | None = None
    """Its temperature (``race.dropped``)."""
    label: str = ""
    """The setting ("ngram γ=2")."""
    after_prompts: int | None = None
    """The category's prompts when it was dropped."""
    after_s: float | None = None
    """Seconds into the race (``race.dropped``)."""
    why: str | None = None
    """Why: the paired comparison that put it out, or the plain reason."""


class ScheduleDecisionEntry(FileModel):
    """One load's decision in a schedule: the answer as keys, no text to parse."""

    REQUIRED = ("load", "decision", "setting", "drafter", "gamma", "simulated", "engine_gamma")
    load: Load = 1
    """Concurrent requests."""
    decision: str | None = None
    """The verdict's decision there: deploy, off, no-decision or control."""
    setting: str = "off"
    """"ngram γ=4" where deployed, else "off"."""
    drafter: str | None = None
    """The drafter deployed there; null when not deploy."""
    gamma: Gamma | None = None
    """Its γ (an integer, or a γ policy's name); null when not deploy."""
    simulated: bool = False
    """Decided by the simulator."""
    engine_gamma: Count = 0
    """The k the engine configs run at this load (0: off, or another drafter decided it)."""


class LaunchedEngine(FileModel):
    """probe --launch: the launched engine's own command for the schedule (its other engines' configs dropped)."""

    kind: str = ""
    """The engine (llama.cpp, vllm, sglang)."""
    command: str | None = None
    """The command line to deploy it; null where speculation pays at no measured load."""


#: an engine's paste-ready config: its JSON document, or its launch flags (argv words)
EngineConfig = dict[str, JsonValue] | list[str] | None


class ScheduleEntry(Keyed):
    """One (category, temperature)'s decisions over loads, and the engine configs that deploy them."""

    REQUIRED = ("category", "temperature", "text")
    NEVER_NULL = ("control", "gamma", "note", "configs_note", "engine")
    control: bool | None = None
    """A control category: never deployed."""
    text: str = ""
    """The schedule as one line, e.g. "ngram γ=4 at 1, off from 16" ("(sim)": decided by the simulator)."""
    at_target: FileVerdict | None = None
    """The verdict at slo.target_load, when one is set."""
    drafter: str | None = None
    """The deployment's one drafter (the target load's, else the lowest deploying load's); null when speculation is
    off at every load."""
    gamma: Annotated[int, Field(ge=0)] | None = None
    """The draft length a one-γ server runs (SGLang, llama.cpp): the first on-range's; 0 when off."""
    decisions: list[ScheduleDecisionEntry] = []
    """The decision at every decided load, load-sorted."""
    versions: dict[str, str] | None = None
    """The engine version (and source) each config's schema follows, by key (vllm, trtllm, sglang, llama_cpp); null
    for a control."""
    vllm: dict[str, JsonValue] | None = None
    """The JSON value `vllm serve --speculative-config` takes (method, num_speculative_tokens,
    num_speculative_tokens_per_batch_size as [[start, end, k], …]; not wrapped); null where vLLM cannot run it.
    Schema: `versions.vllm`."""
    trtllm: dict[str, JsonValue] | None = None
    """TensorRT-LLM `{"speculative_config": {…}}` as its --extra_llm_api_options file holds it (decoding_type,
    max_draft_len, draft_len_schedule); null where it cannot run it."""
    sglang: EngineConfig = None
    """SGLang launch flags (argv words); null where it cannot run it."""
    llama_cpp: EngineConfig = None
    """llama-server flags (argv words) of the llama.cpp in `versions.llama_cpp`; null where it cannot run it, or
    where the llama-server $SPECLEDGER_LLAMA_SERVER names lacks one of them."""
    ranges: list[list[JsonValue]] | None = None
    """[[start, end, γ], …]: the γ per load range, covering 1..the largest load."""
    note: str | None = None
    """Another drafter decided some loads, and which."""
    configs_note: str | None = None
    """The engines' notes: what is missing, what to replace."""
    engine: LaunchedEngine | None = None
    """probe --launch: the launched engine's command, in place of the other engines' configs."""

    def config(self, kind: str) -> EngineConfig:
        """The config of engine ``kind`` (vllm, trtllm, sglang, llama_cpp); None where there is none."""
        return {"vllm": self.vllm, "trtllm": self.trtllm, "sglang": self.sglang, "llama_cpp": self.llama_cpp}[kind]


class BucketEntry(FileModel):
    """One context bucket's decision in a context schedule."""

    REQUIRED = ("bucket", "decision", "resolved")
    NEVER_NULL = ("bucket",)
    bucket: str | None = None
    """The bucket ("1-2k")."""
    decision: str | None = None
    """The verdict's decision there."""
    setting: str | None = None
    """The setting it reports."""
    speedup: float | None = None
    """Its S against plain."""
    mean_committed: float | None = None
    """E[L]."""
    resolved: bool = False
    """The decision stands."""


class ContextScheduleEntry(FileModel):
    """A category decided in two or more context buckets: its buckets in length order and where speculation stops
    (or starts) paying, counting resolved decisions only (specledger.gates.context_schedule)."""

    REQUIRED = ("category", "temperature", "load", "buckets", "stops_at_tokens", "starts_at_tokens", "engine_note")
    category: str = ""
    """Workload category."""
    temperature: float = 0.0
    """Sampling temperature."""
    load: int = 1
    """The load the buckets were decided at."""
    buckets: list[BucketEntry] = []
    """Its buckets in length order."""
    stops_at_tokens: int | None = None
    """The first bucket edge where a resolved deploy turns resolved off."""
    starts_at_tokens: int | None = None
    """The first bucket edge where resolved off turns a resolved deploy."""
    engine_note: str | None = None
    """How to deploy the turn (route by length)."""


__all__ = ["FILE_KEYS", "LEGACY_VERDICT", "BucketEntry", "Carries", "ContextScheduleEntry", "DroppedSetting",
           "EngineConfig", "FileKeys", "FileVerdict", "LaunchedEngine", "MixVerdict", "ScheduleDecisionEntry",
           "ScheduleEntry", "read_verdict"]
