"""Everything bench/results.json holds (pure, no I/O): each phase's figures, as RESULTS.md is rendered
from them. A run of every phase (`make bench`) fills the parts it measures; a phase run alone
(`python -m bench.fleet`, `bench.fair_share`, `bench.submit_index`, `bench.run --only-...`) replaces its
own part and leaves the others as they were."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ConfigDict

from bench.engine_figures import CancelSample, EngineRun, FirstToken, StepCost
from bench.fair_share_figures import FairShare
from bench.fleet_figures import FleetRun
from bench.peer_figures import SideBySide
from bench.scheduling_figures import Scheduling
from bench.stats import PhaseSummary
from bench.submit_index_figures import SubmitIndexCost


@dataclass
class Results:
    """The figures of the last run of every phase (`command`, in `mode`, `minutes` long, on `machine`),
    beside those of the phases run alone since, each with its own command. A part results.json has and
    this class does not is refused when read, rather than dropped when written again: a new phase adds
    its part here, with its section in `report.render`."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    command: str = ""
    mode: str = ""
    machine: dict[str, str] = field(default_factory=dict)
    max_tokens: int = 0  # of the full path's and the in-process engine's jobs
    minutes: float = 0.0
    notes: list[str] = field(default_factory=list)  # about the run of every phase: its logs, its processes
    in_process: list[EngineRun] = field(default_factory=list)  # before the system, and after it
    full_path: list[PhaseSummary] = field(default_factory=list)
    first_tokens: list[FirstToken] = field(default_factory=list)
    pickup: list[float] = field(default_factory=list)  # seconds
    cancels: list[CancelSample] = field(default_factory=list)
    step_costs: list[StepCost] = field(default_factory=list)
    relay: FleetRun | None = None  # one gateway process, every stream followed over SSE (section 4)
    peer: SideBySide | None = None  # vLLM's benchmark client on both servers (section 7)
    generate: SideBySide | None = None  # `/inference/v1/generate` on both servers (section 7b)
    fair_share: FairShare | None = None
    fleet: FleetRun | None = None
    fleet_cluster: FleetRun | None = None  # the streams on a Redis Cluster's masters (section 9b)
    submit_index: SubmitIndexCost | None = None
    scheduling: Scheduling | None = None  # prefix-aware claiming, fair shares by tokens (section 11)
