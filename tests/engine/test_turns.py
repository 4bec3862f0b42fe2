"""Turns: one engine's batch at a time, shared out fairly by each engine's share."""

from __future__ import annotations

import threading
import time

import pytest

from geoserve.engine.turns import Turns


def busy(turns: Turns, name: str, step_s: float, stop: threading.Event) -> None:
    """An engine that always has work: step after step of ``step_s``."""
    while not stop.is_set():
        with turns.turn(name):
            time.sleep(step_s)


def test_busy_engines_get_device_time_in_the_ratio_of_their_shares() -> None:
    turns = Turns({"a": 1.0, "b": 3.0})
    stop = threading.Event()
    threads = [threading.Thread(target=busy, args=(turns, n, 0.01, stop)) for n in "ab"]
    for t in threads:
        t.start()
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join()
    held = turns.held_seconds()
    assert 2.2 < held["b"] / held["a"] < 4.0, held


def test_one_turn_at_a_time() -> None:
    turns = Turns({"a": 1.0, "b": 1.0, "c": 1.0})
    inside = []
    most = [0]
    lock = threading.Lock()

    def step(name: str) -> None:
        for _ in range(20):
            with turns.turn(name):
                with lock:
                    inside.append(name)
                    most[0] = max(most[0], len(inside))
                time.sleep(0.001)
                with lock:
                    inside.remove(name)

    threads = [threading.Thread(target=step, args=(n,)) for n in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


def test_an_engine_with_a_little_work_waits_at_most_the_step_in_progress() -> None:
    turns = Turns({"flooded": 1.0, "light": 1.0})
    stop = threading.Event()
    flood = threading.Thread(target=busy, args=(turns, "flooded", 0.05, stop))
    flood.start()
    time.sleep(0.2)
    waits = []
    for _ in range(10):
        t0 = time.perf_counter()
        with turns.turn("light"):
            waits.append(time.perf_counter() - t0)
            time.sleep(0.005)
        time.sleep(0.03)  # (idle between its requests)
    stop.set()
    flood.join()
    assert max(waits) < 0.05 + 0.03, waits  # one flooded step, never two


def test_idling_banks_no_credit() -> None:
    """An engine back from a long idle spell shares from then on; it does not take over."""
    turns = Turns({"a": 1.0, "b": 1.0})
    stop = threading.Event()
    a = threading.Thread(target=busy, args=(turns, "a", 0.01, stop))
    a.start()
    time.sleep(0.5)  # a alone: b idles
    before = turns.held_seconds()
    b = threading.Thread(target=busy, args=(turns, "b", 0.01, stop))
    b.start()
    time.sleep(0.6)
    stop.set()
    a.join()
    b.join()
    after = turns.held_seconds()
    a_share = after["a"] - before["a"]
    assert a_share > 0.2, (before, after)  # a kept about half, not nothing
    assert 0.5 < a_share / after["b"] < 2.0, (before, after)


def test_a_share_must_be_positive() -> None:
    with pytest.raises(ValueError, match="shares must be > 0: b"):
        Turns({"a": 1.0, "b": 0.0})
