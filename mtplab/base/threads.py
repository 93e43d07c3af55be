"""The CPU threads every onnxruntime session of this process runs on.

By default each session has its own intra-op pool, spinning off (several sessions take turns on the
same cores: an idle pool must sleep). A process that runs one configuration (a sweep point, `mtplab
run`, a calibration, a benchmark) calls `use_global_pool` first: then every session of the process
(Primary, a Verify sibling, the MTP head, select's replay, the references) shares one onnxruntime
global pool with onnxruntime's default spinning, so a forward never waits for another pool's threads
to wake. onnxruntime allows one global pool per process, made before its first session, and then
refuses sessions with pools of their own: every session mtplab makes takes its options here.

A spinning pool's workers keep spinning for about 50 ms after a run ends. Where a process holds two pools (mtplab's
and onnxruntime-genai's, in a peer point) and their threads fill the cores, a run of one pool started inside the
other's spin shares its cores with it, and runs far slower than alone. `settle` waits for that spin to end before a timed run of the other pool.
"""

from __future__ import annotations

import os
import time

_global_pool: int | None = None  # the global pool's intra-op threads, once made
_sessions_made = False


def threads_used(threads: int) -> int:
    """The intra-op threads a session gets for a RunConfig's `threads` (0: onnxruntime's default, every core)."""
    return threads or os.cpu_count() or 1


def use_global_pool(threads: int) -> int:
    """Make every session of this process share one intra-op pool of threads_used(threads) threads; its size.

    Call it before the process's first session; a second call must ask for the same size (a run on other
    threads needs a process of its own).
    """
    global _global_pool
    size = threads_used(threads)
    if _global_pool is None:
        if _sessions_made:
            raise RuntimeError("use_global_pool: this process already made onnxruntime sessions with pools of their "
                               "own; call it before the first session")
        import onnxruntime as ort

        ort.set_global_thread_pool_sizes(size, 1)
        _global_pool = size
    elif _global_pool != size:
        raise ValueError(f"this process's sessions share a pool of {_global_pool} threads: a run on {size} threads "
                         "needs a process of its own")
    return size


def thread_pool() -> dict:
    """The pool this process's sessions use, as a result records it."""
    if _global_pool is not None:
        return {"kind": "global", "threads": _global_pool, "spinning": "onnxruntime's default (on)"}
    return {"kind": "per session", "spinning": "off"}


def session_options(threads: int = 0):
    """Options for a session of this process: the global pool where there is one, else `threads` intra-op threads
    of its own (0: onnxruntime's default), spinning off; one inter-op thread; warnings only."""
    global _sessions_made
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if _global_pool is not None:  # its one inter-op thread was set with the pool
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads or 0
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    _sessions_made = True
    return so


SETTLE_LIMIT = 0.5  # seconds settle waits at most; a wait this long means the threads never went idle


def settle(limit: float = SETTLE_LIMIT, window: float = 0.005, quiet: int = 3, busy: float = 0.1) -> float:
    """Wait until this process's other threads are idle (a pool's workers spinning after its last run), at most
    `limit` seconds; the seconds waited (`limit` or more: they never went idle).

    Idle: over `quiet` windows in a row, while this thread sleeps, the process used under `busy` of a core in each
    (one quiet window alone can be a spinning thread the OS left off the cores for a moment). Call it before a timed
    run that follows another pool's run, so that the two never share the cores.
    """
    start = last = time.perf_counter()
    cpu, calm = time.process_time(), 0
    while True:
        time.sleep(window)
        now, used = time.perf_counter(), time.process_time()
        calm = calm + 1 if used - cpu < busy * (now - last) else 0
        if calm >= quiet or now - start >= limit:
            return now - start
        last, cpu = now, used
