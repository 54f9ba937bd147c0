"""The options of ``specledger probe``, checked before any request is sent or any engine starts: every
combination that cannot work is a one-line error; what passes becomes a :class:`ProbePlan` (the workload, the
tokenizer, the SLO, the load settings of each endpoint)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger.errors import SpecLedgerError
from specledger.load_points import is_load_range, parse_loads
from specledger.probe.endpoint import load_tokenizer
from specledger.probe.engine_command import Spec, check_template, parse_specs
from specledger.probe.fetch import parse_headers
from specledger.probe.loadgen import LoadConfig, Tokenizer
from specledger.probe.outputs import check_new_run_dir
from specledger.probe.records import check_label
from specledger.probe.workload import ProbeWorkload, select_workload, split_by_context

#: closed-loop concurrency when neither --concurrency nor --rate is given
DEFAULT_CONCURRENCY = 4


@dataclass
class ProbeOptions:
    """Every option of ``specledger probe``, as given (the command's parameters, same names)."""

    url: str | None
    concurrency: int | None
    rate: float | None
    requests: int
    duration: float | None
    workload: Path | None
    categories: str | None
    n: int
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: list[str] | None
    chat: bool
    model: str | None
    metrics: bool
    tokenizer: Path | None
    timeout: float
    baseline: str | None
    baseline_model: str | None
    label: str
    gamma: str | None
    out: Path | None
    loads: str | None
    slo: Path | None
    as_json: bool
    header: list[str] | None
    api_key: str | None
    launch: str | None
    spec: list[str] | None
    launch_port: int | None
    launch_timeout: float
    repeats: int
    budget: str | None = None
    mix: str | None = None
    verbose: bool = False
    deadline: float | None = None


@dataclass
class ProbePlan:
    """What the checked options give: ``specs`` with ``--launch`` (else None), ``loads`` with ``--loads``."""

    options: ProbeOptions
    specs: list[Spec] | None
    loads: list[int] | None
    label: str
    headers: dict[str, str]
    slo: Any
    workload: ProbeWorkload
    tokenizer: Tokenizer | None
    concurrency: int | None
    #: ``--loads A..B``: ``loads`` holds the ends (and the SLO's target load inside them), bisected where S changes
    locate_loads: bool = False

    def config(self, endpoint_model: str | None) -> LoadConfig:
        """A fresh load configuration for an endpoint serving ``endpoint_model`` (None: its first model)."""
        o = self.options
        return LoadConfig(
            base_url="",
            model=endpoint_model or "",
            chat=o.chat,
            max_tokens=o.max_tokens,
            temperature=o.temperature,
            top_p=o.top_p,
            seed=o.seed,
            stop=o.stop or None,
            concurrency=self.concurrency if o.rate is None else None,
            rate=o.rate,
            num_requests=o.requests,
            duration_s=o.duration,
            arrival_seed=o.seed,
            timeout_s=o.timeout,
            deadline_s=o.deadline,
            headers=dict(self.headers),
        )


def check_launch_options(url: str | None, launch: str | None, spec: list[str] | None, baseline: str | None,
                         concurrency: int | None, rate: float | None, out: Path | None,
                         launch_port: int | None, repeats: int = 1) -> list[Spec] | None:
    """The parsed ``--spec`` list with ``--launch`` (None without it); a one-line error for every combination
    that cannot work, before any engine starts."""
    if launch is None:
        if spec or launch_port is not None or repeats != 1:
            raise SpecLedgerError("--spec, --launch-port and --repeats go with --launch CMD (the engine's command "
                                  "line)")
        if url is None:
            raise SpecLedgerError("give the server's URL (e.g. http://127.0.0.1:8000), or --launch CMD to start it")
        return None
    if url is not None or baseline is not None:
        raise SpecLedgerError("--launch starts the engines itself: give no URL and no --baseline")
    if concurrency is not None or rate is not None:
        raise SpecLedgerError("--launch probes at --loads (e.g. --loads 1,4), not --concurrency / --rate")
    if out is None:
        raise SpecLedgerError("--launch needs --out DIR: the engines' logs and each finished configuration go there")
    if repeats < 1:
        raise SpecLedgerError(f"--repeats {repeats}: give 1 or more")
    if launch_port is not None and not 0 < launch_port < 65536:
        raise SpecLedgerError(f"--launch-port {launch_port} is not a port; give 1-65535")
    check_template(launch)
    return parse_specs(spec or [])


def plan_probe(o: ProbeOptions) -> ProbePlan:
    """Check ``o`` (a bad SLO file, a used --out folder, a missing tokenizer fail here, before any request is
    sent) and load what the probe needs."""
    from specledger.gates import check_target_load, load_slo

    specs = check_launch_options(o.url, o.launch, o.spec, o.baseline, o.concurrency, o.rate, o.out, o.launch_port,
                                 o.repeats)
    if o.concurrency is not None and o.rate is not None:
        raise SpecLedgerError("give either --concurrency or --rate, not both")
    loads = parse_loads(o.loads, allow_range=True)
    if loads is not None and (o.concurrency is not None or o.rate is not None):
        raise SpecLedgerError("give either --loads (every concurrency to probe) or --concurrency/--rate, not both")
    if o.workload is not None and o.categories:
        raise SpecLedgerError("give either --workload or --categories, not both")
    label = check_label(o.label)
    headers = parse_headers(o.header, o.api_key)
    slo = load_slo(o.slo)  # a bad SLO file fails before any request is sent
    if loads is not None and is_load_range(o.loads):
        from specledger.load_bisect import range_loads

        loads = range_loads(loads[0], loads[-1], [slo.target_load] if slo.target_load else [])
    if loads is not None:
        check_target_load(slo, loads)
    if o.out is not None:
        check_new_run_dir(o.out)
    tokenizer = load_tokenizer(o.tokenizer)
    workload = split_by_context(select_workload(o.workload, o.categories, o.n, o.seed), tokenizer)
    concurrency = DEFAULT_CONCURRENCY if o.concurrency is None and o.rate is None else o.concurrency
    plan = ProbePlan(o, specs, loads, label, headers, slo, workload, tokenizer, concurrency,
                     locate_loads=is_load_range(o.loads))
    plan.config(o.model).validate()
    return plan


__all__ = ["DEFAULT_CONCURRENCY", "ProbeOptions", "ProbePlan", "check_launch_options", "plan_probe"]
