"""Arena: stable named buffers, step-scoped blocks with epochs, and byte accounting."""

from __future__ import annotations

import numpy as np
import pytest

from mtplab.runtime.arena import Arena, BufferTooSmall, address


def test_named_buffer_keeps_its_address_and_serves_smaller_views():
    a = Arena("a")
    big = a.reserve("logits", (1, 4, 8), np.float32)
    view = a.view("logits", (1, 1, 8), np.float32)
    assert address(view) == address(big) and view.shape == (1, 1, 8)


def test_buffer_sized_on_first_use_cannot_grow():
    a = Arena("shared")
    a.view("logits", (1, 1, 8), np.float32)
    with pytest.raises(
        BufferTooSmall, match=r"logits: needs \[1, 4, 8\] float32 but the shared arena buffer holds \[1, 1, 8\]"
    ):
        a.view("logits", (1, 4, 8), np.float32)


def test_released_block_is_reissued_with_a_new_epoch_and_owner():
    a = Arena("pool")
    b = a.acquire("verify", 256)
    a.release(b)
    again = a.acquire("decode-handoff", 64)
    assert again is b and again.epoch == 1 and again.owner == "decode-handoff"


def test_double_release_is_an_error():
    a = Arena("pool")
    b = a.acquire("x", 64)
    a.release(b)
    with pytest.raises(ValueError, match="released twice"):
        a.release(b)


def test_bytes_held_now_and_at_peak():
    a = Arena("acct")
    a.reserve("x", (16,), np.float32)
    b = a.acquire("w", 128)
    assert a.bytes_held == 64 + 128 and a.peak_bytes == 192
    a.release(b)
    assert a.bytes_held == 192  # a free block is still held by the pool
    assert a.stats()["blocks"] == 1


def test_carve_gives_aligned_typed_views_inside_the_block():
    a = Arena("pool")
    b = a.acquire("w", 1024)
    v = b.carve({"x": ((3,), np.float32), "y": ((2, 2), np.float32)})
    assert address(v["y"]) - address(v["x"]) == 64 and v["y"].shape == (2, 2)
    with pytest.raises(BufferTooSmall):
        b.carve({"z": ((1024,), np.float32)})
