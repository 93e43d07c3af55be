"""mtplab.base.threads.settle: a timed run waits for the threads of the run before it to go idle."""

import threading
import time

from mtplab.base.threads import settle


def _spin(seconds: float, stop: threading.Event | None = None) -> threading.Thread:
    """A thread that keeps a core busy for `seconds` (or until `stop`), as a pool's worker spins after a run."""
    def busy():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end and not (stop and stop.is_set()):
            pass

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    return t


def test_settle_waits_until_a_spinning_thread_stops():
    spinner = _spin(0.15)
    waited = settle(limit=5.0)
    assert waited >= 0.1
    spinner.join(timeout=0.05)
    assert not spinner.is_alive()


def test_settle_returns_before_its_limit_when_nothing_spins():
    assert settle(limit=2.0) < 1.0


def test_settle_gives_up_at_its_limit_and_says_so_by_the_time_it_waited():
    stop = threading.Event()
    spinner = _spin(30.0, stop)
    try:
        waited = settle(limit=0.2)
    finally:
        stop.set()
        spinner.join()
    assert 0.2 <= waited < 1.5
