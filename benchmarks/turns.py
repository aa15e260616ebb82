"""Timing in turns, shared by the benchmark scripts: in one process, or with every row in a process of its own."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator


def _counts(least: int):
    """An argparse type: an integer of at least `least` (argparse names it "count" in its messages)."""
    def count(text: str) -> int:
        value = int(text)  # a ValueError: argparse says "invalid count value"
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value
    return count


# --repeats and the like: at least 1 (a median of no timing failed with a traceback); --warmup and the like: at
# least 0 (-1 took the warm-up steps from the end of the data, or divided by zero).
count, count0 = _counts(1), _counts(0)


def json_file(text: str) -> str:
    """argparse type of --json: a file that can be written, checked before the run (it failed after it, and the
    figures of a five-minute run were lost)."""
    path = os.path.abspath(text)
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name, e.g. {os.path.join(text, 'x.json')}")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder {folder!r} does not exist; make it first or give another path")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"the folder {folder!r} cannot be written to; give another path")
    return text


def device_or_exit(parser: argparse.ArgumentParser, name: str):
    """The torch device `--device` names, or the parser's one-line error (exit 2) where this machine lacks it."""
    from attnlab.errors import ConfigError
    from attnlab.training.device import select_device

    try:
        return select_device(name)
    except ConfigError as e:
        parser.error(f"--device: {str(e).removeprefix('device: ')}")  # not "--device: device: ..."


def require_transformers(script: str):
    """HF transformers (the peer of the training and decoding rows), or a one-line message naming the extra that
    installs it and exit code 2."""
    try:
        import transformers
    except ImportError:
        print(f"{script}: HF transformers is missing; install the peer with: pip install -e '.[bench]'",
              file=sys.stderr)
        raise SystemExit(2) from None
    return transformers


def rounds(names: list[str], repeats: int) -> Iterator[tuple[int, str]]:
    """(round, name) in timing order: round i visits every name once, forward in even rounds and backward in odd
    ones, so that no name always follows the same neighbour (whose freed memory or warm caches it would inherit);
    and each pair of rounds starts one name further on, so that the name that ends a round and starts the next
    (following itself: its own caches still warm, its threads awake) is each name in turn, not always the first
    and the last (the reference row sat in the middle, never following itself)."""
    for i in range(repeats):
        k = (i // 2) % len(names) if names else 0
        order = names[k:] + names[:k]
        for name in (order if i % 2 == 0 else order[::-1]):
            yield i, name


def timed_call(fn: Callable[[int], object], i: int, sync: Callable[[], None]) -> float:
    """Seconds of fn(i), from an idle device to the end of its work (`sync` waits for the device: a GPU runs
    behind the host)."""
    sync()
    t0 = time.perf_counter()
    fn(i)
    sync()
    return time.perf_counter() - t0


def time_in_turns(fns: dict[str, Callable[[int], object]], repeats: int,
                  sync: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Median seconds of each function over `repeats` rounds (see `rounds`): each call is given its round, and a
    slower or faster spell of a shared machine touches every function alike. `sync` waits for the device (a GPU
    runs behind the host): called before each clock read, so a call is timed with its work."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i, name in rounds(list(fns), repeats):
        times[name].append(timed_call(fns[name], i, sync))
    return {name: statistics.median(ts) for name, ts in times.items()}


def _serve(conn, make: Callable[[], tuple[Callable[[int], object], Callable[[], None]]], threads: int) -> None:
    """A row's process: build the row with `make` (which returns its function and a device sync), then time one
    call per message (its round) until told to stop (None). It computes on the parent's number of threads (a
    spawned process starts with torch's default, whatever the parent set, so the results' count misdescribed it)."""
    import torch

    try:
        torch.set_num_threads(threads)
        fn, sync = make()
        conn.send(("ready", None))
        while (i := conn.recv()) is not None:
            conn.send(("time", timed_call(fn, i, sync)))
    except BaseException:  # noqa: BLE001 - whatever stopped the row is reported to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _receive(conn, name: str, expected: str):
    try:
        kind, value = conn.recv()
    except EOFError:
        raise RuntimeError(f"the process of row {name!r} ended without a word (killed, or out of memory?)") from None
    if kind == "error":
        raise RuntimeError(f"row {name!r} failed in its process:\n{value}")
    if kind != expected:
        raise RuntimeError(f"row {name!r} answered {kind!r}, expected {expected!r}")
    return value


def time_in_turns_apart(makers: dict[str, Callable[[], tuple[Callable[[int], object], Callable[[], None]]]],
                        repeats: int) -> dict[str, float]:
    """As `time_in_turns`, but every row lives in a process of its own, where its maker builds it (a picklable
    callable returning the row's function and a device sync; untimed: build and warm up there). One row runs at a
    time, in the same rounds. In one process the rows share a heap: the memory one row frees is what the next
    allocates, so a row's page faults, and with them its time, depend on its neighbours (an audit counted ~98,000
    minor faults a step for HF's fp32 row at shape B beside attnlab's rows against ~26,000 alone, and ~55,000
    for attnlab's default row alone against none beside HF's)."""
    import torch

    context = multiprocessing.get_context("spawn")  # a fork of a process whose thread pools run is not safe
    workers = {}
    try:
        for name, make in makers.items():
            here, there = context.Pipe()
            process = context.Process(target=_serve, args=(there, make, torch.get_num_threads()), daemon=True)
            process.start()
            there.close()
            workers[name] = (process, here)
        for name, (_, conn) in workers.items():  # the rows build in parallel; the timing starts once all are ready
            _receive(conn, name, "ready")
        times: dict[str, list[float]] = {name: [] for name in makers}
        for i, name in rounds(list(makers), repeats):
            conn = workers[name][1]
            conn.send(i)
            times[name].append(_receive(conn, name, "time"))
        return {name: statistics.median(ts) for name, ts in times.items()}
    finally:
        for _, conn in workers.values():
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process, conn in workers.values():
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join()
            conn.close()
