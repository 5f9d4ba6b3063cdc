"""The garbage collector of a process that makes and drops objects at the rate of events."""

from __future__ import annotations

import gc

GC_YOUNG_THRESHOLD = 50_000  # CPython's default is 700


def tune_garbage_collector() -> None:
    """Keep the collector's work in proportion to the events handled, not to the objects start-up made.

    A gateway relays, and a worker builds, objects at the rate of events. With CPython's default
    thresholds, at 10,000 events/s a gateway's collector ran hundreds of times a second and every
    full collection re-scanned the ~200,000 objects that importing the gateway made: a sixth of the
    process's CPU, in pauses that showed up as relay lag. A worker of 500 jobs spent 12 µs an event
    (a fifth of its CPU) collecting, and a full collection stopped every job's step for 80 ms.
    Start-up objects live as long as the process, so they leave the collector's view (`gc.freeze`),
    and young collections run once per `GC_YOUNG_THRESHOLD` new container objects.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
