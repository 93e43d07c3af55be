"""What a run asks of a model, refused before any session: here, the memory a batch's state buffers take."""

from __future__ import annotations

import numpy as np

from mtplab.cli.main import main
from mtplab.engine.fit import graph_bytes, run_bytes, state_bytes
from mtplab.runtime.arena import Arena
from mtplab.runtime.state import MtpState, TargetState


def test_a_batchs_state_bytes_grow_with_its_rows_and_hold_every_state_buffer(tiny):
    desc = tiny.description
    assert state_bytes(desc, 6, 3) == 3 * state_bytes(desc, 2, 3)
    st, head = TargetState.allocate(desc, Arena("t"), batch=2), MtpState.allocate(desc, Arena("m"), batch=2)
    held = sum(a.nbytes for pair in (*st.kv.values(), head.kv) for a in pair)
    held += 2 * sum(st.array(s).nbytes for s in desc.target.states)  # each state and its verify snapshot
    held += sum(a.nbytes for a in st.present.values())
    assert held <= state_bytes(desc, 2, 3) <= held + 2 * 2 * 4 * desc.vocab_size * np.dtype(np.float32).itemsize


def test_a_runs_memory_counts_the_lossless_checks_reference_per_row(tiny):
    """The checked pass steps one reference session of the target per row: its weights, once per row (small at
    batch 16 grew by 5.0 GiB, its state buffers being 0.14 GiB)."""
    desc = tiny.description
    weights = graph_bytes(desc.target.path)
    assert weights >= desc.target.path.stat().st_size > 0
    assert run_bytes(desc, 4, 3) == state_bytes(desc, 4, 3) + 4 * weights


def test_a_batch_beyond_this_machines_memory_is_refused_before_any_work(tiny, capsys):
    assert main(["run", "--preset", "tiny", "--batch", str(10**9), "--tokens", "16"]) == 2
    err = capsys.readouterr().err
    assert f"batch={10**9} on tiny needs about" in err and "GiB this machine has available: at most about batch=" in err
    assert "calibration" not in err  # refused before the calibration is measured
