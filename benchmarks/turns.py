"""Timing in turns, shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def time_in_turns(fns: dict[str, Callable[[int], object]], repeats: int,
                  sync: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Median seconds of each function over `repeats` rounds; round i calls every function once, with i, in
    turn, so that a slower or faster spell of a shared machine touches every function alike, in the given order
    in even rounds and the reverse in odd ones, so that no function always follows the same neighbour (whose
    freed memory or warm caches it would inherit). `sync` waits for the device (a GPU runs behind the host):
    called before each clock read, so a call is timed with its work."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(repeats):
        for name, fn in (fns.items() if i % 2 == 0 else reversed(fns.items())):
            sync()
            t0 = time.perf_counter()
            fn(i)
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}
