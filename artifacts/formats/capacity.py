"""capacity.json: what `temper capacity` measured of a bundle behind `temper serve`, kept beside runtime.json.

    <bundle>/
      capacity.json   the latency target, the serving configuration chosen (max batch size, max queue delay,
                      instances), the highest request rate whose p99 stayed under the target with it (the knee)
                      and that knee's repeats with their interval, the queue time, requests in flight and memory
                      at the knee, every point measured, the host and the load generator
      capacity.png    the curve: p99 against the offered rate, per configuration measured

Kept out of runtime.json on purpose: runtime.json is what the gates and publishing wrote (its session settings
are what was gated), while a capacity figure belongs to one serving host and is measured again whenever the
host changes; re-measuring replaces one file and leaves the gated record alone. What reads it:
`temper serve` (the chosen batching and instance count, unless flags say otherwise), `temper export-triton`
(config.pbtxt's dynamic_batching and instance_group, and the thresholds of the alert rules and the autoscaler
beside the manifests). Imports nothing from pipeline/.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from temper.artifacts.core.host import HostProfile
from temper.artifacts.formats.bundle import ServingConfig

CAPACITY = "capacity.json"
PLOT = "capacity.png"


class Choice(BaseModel):
    """One serving configuration the search tried."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch_size: PositiveInt
    max_delay_ms: float = Field(ge=0)
    instances: NonNegativeInt = Field(description="temper serve --instances: worker processes (0: in the server's "
                                                  "process); Triton's instance_group count is at least 1")

    def label(self) -> str:
        return f"batch {self.max_batch_size}, delay {self.max_delay_ms:g} ms, {self.instances} instance(s)"


class Point(BaseModel):
    """One open-loop run at one offered rate against one configuration."""

    model_config = ConfigDict(extra="forbid")

    choice: Choice
    rate: PositiveFloat = Field(description="offered request rate, requests/s (perf_analyzer --request-rate-range)")
    sent: float = Field(ge=0, description="the rate requests were really sent at, requests/s")
    answered: float = Field(ge=0, description="requests answered per second of the run")
    p50_ms: float | None
    p99_ms: float | None = Field(description="the 99th percentile of the answered requests' latency, client side")
    mean_ms: float | None
    requests: NonNegativeInt
    errors: NonNegativeInt = Field(description="requests that got no answer")
    queue_us: float | None = Field(description="the server's average queue time per request (its statistics)")
    memory_bytes: int | None = Field(None, description="the server's and its workers' resident memory after the run")
    delayed_pct: float = Field(0.0, ge=0, description="requests perf_analyzer sent later than their schedule, %")
    under: bool = Field(description="p99 within the target, no request unanswered, and the rate really offered "
                                    "(at most 5% of the requests sent late)")
    round: NonNegativeInt = Field(0, description="0: the search; 1, 2, ...: the repeats of the chosen knee")


class Capacity(BaseModel):
    """What capacity.json holds."""

    model_config = ConfigDict(extra="forbid")

    target_p99_ms: PositiveFloat
    chosen: Choice = Field(description="the configuration of the highest rate measured under the target")
    rate: PositiveFloat = Field(description="requests/s: the median of the chosen configuration's knees (the "
                                            "search's and each repeat's)")
    knees: list[NonNegativeFloat] = Field(description="the chosen configuration's knee in each round, search first "
                                                      "(0: nothing in that round stayed under the target)")
    interval: tuple[float, float] = Field(description="95% t-interval of the knee's mean over the rounds")
    p99_ms: float = Field(description="p99 at the search's knee")
    queue_us: float | None = Field(description="the server's average queue time per request at the knee")
    in_flight: float = Field(description="requests in the server at the knee (Little's law: answered rate x mean "
                                         "latency)")
    queued: float = Field(description="requests waiting in the queue at the knee (answered rate x queue time)")
    memory_bytes: int | None = Field(description="the server's and its workers' resident memory at the knee, the "
                                                 "largest read")
    protocol: str
    tool: str = Field(description="the load generator and its version")
    measured_on: HostProfile
    measured_at: str
    points: list[Point]

    def serving(self, config: ServingConfig) -> ServingConfig:
        """`config` with the chosen batching."""
        return config.model_copy(update={"max_batch_size": self.chosen.max_batch_size,
                                         "max_delay_ms": self.chosen.max_delay_ms})


def read(folder: Path) -> Capacity | None:
    """The bundle's capacity.json, or None when it has none; ValueError naming the file when it is not one."""
    path = folder / CAPACITY
    if not path.is_file():
        return None
    try:
        return Capacity.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a capacity record temper wrote ({type(exc).__name__}): measure again "
                         "with `temper capacity`, or delete it") from exc


def write(folder: Path, capacity: Capacity) -> Path:
    path = folder / CAPACITY
    partial = path.with_name(f".{CAPACITY}.partial")
    partial.write_text(capacity.model_dump_json(indent=2) + "\n")
    partial.replace(path)
    return path
