"""What the job index costs a submission (pure, no I/O), as `bench.submit_index` measured it."""

from __future__ import annotations

from dataclasses import dataclass

INDEX_SIZE = 10_000  # entries of the index measured: full, so that each indexed submission trims one


@dataclass(frozen=True)
class SubmitIndexCost:
    measured: str  # when (UTC)
    command: str
    rounds: int
    submissions: int
    with_index: float  # Redis µs per submission
    without_index: float
    trip_with_us: float
    trip_without_us: float
    index_bytes: int  # the full index's MEMORY USAGE
    load: float  # the machine's load average over the minute before the run: others' work shares the cores

    @property
    def extra_us(self) -> float:
        return self.with_index - self.without_index

    @property
    def ratio(self) -> float:
        return self.with_index / self.without_index
