"""select's compiled host update: bitwise the token-by-token arithmetic it replaces, for every count it is given."""

from __future__ import annotations

import numpy as np
import pytest

from mtplab.model.graph import TransitionLayout, rebuild_conv, replay_transitions, replay_transitions_xp
from mtplab.runtime import host_replay


def _transitions(layout: TransitionLayout, dtype, seed: int = 3):
    rng = np.random.default_rng(seed)
    flat = rng.standard_normal((1, layout.capacity * layout.width)).astype(dtype)
    decay, key, delta = layout.split(flat)
    decay[...] = rng.uniform(0.2, 1.0, decay.shape)
    start = rng.standard_normal((1, layout.value_heads, layout.value_dim, layout.key_dim)).astype(dtype)
    return flat, (decay, key, delta), start


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("heads", [(4, 2, 16, 8), (8, 8, 8, 16)])  # (Hv, Hk, Dk, Dv): grouped keys, and one per head
def test_the_compiled_replay_is_bitwise_the_token_by_token_update(heads, dtype):
    layout = TransitionLayout(8, *heads)
    flat, (decay, key, delta), start = _transitions(layout, dtype)
    for n in range(layout.capacity + 1):
        compiled, reference = start.copy(), start.copy()
        host_replay.replay_state(layout, compiled, flat, n)
        replay_transitions_xp(np, reference[0], decay, key, delta, n, layout.group)
        np.testing.assert_array_equal(compiled, reference)
        assert n == 0 or not np.array_equal(compiled, start)


def test_a_state_numba_cannot_compute_takes_numpys_form_and_a_strided_one_is_refused():
    layout = TransitionLayout(8, 4, 2, 16, 8)
    flat, _, start = _transitions(layout, np.float16)
    compiled, reference = start.copy(), start.copy()
    host_replay.replay_state(layout, compiled, flat, 3)
    replay_transitions(layout, reference, flat, 3)
    np.testing.assert_array_equal(compiled, reference)
    wide = np.zeros((1, layout.value_heads, layout.value_dim, 2 * layout.key_dim), np.float32)
    with pytest.raises(ValueError, match="must be C-contiguous to be replayed in place"):
        host_replay.replay_state(layout, wide[..., ::2], flat.astype(np.float32), 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("channels_first", [False, True])
def test_the_compiled_conv_rebuild_is_numpys_for_every_count(channels_first, dtype):
    rng = np.random.default_rng(5)
    B, width, M, C = 2, 3, 5, 6
    shape, inputs = ((B, C, width), (B, C, M)) if channels_first else ((B, width, C), (B, M, C))
    start, conv_input = rng.standard_normal(shape).astype(dtype), rng.standard_normal(inputs).astype(dtype)
    for n in range(M + 1):
        compiled, reference = start.copy(), start.copy()
        host_replay.rebuild_conv(compiled, conv_input, n, channels_first)
        rebuild_conv(reference, conv_input, n, channels_first)
        np.testing.assert_array_equal(compiled, reference)
        assert n == 0 or not np.array_equal(compiled, start)
