"""select's compiled host update: bitwise the token-by-token arithmetic it replaces, for every count it is given."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mtplab.model.graph import TransitionLayout, rebuild_conv, replay_transitions, replay_transitions_xp
from mtplab.runtime import host_replay, jit


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


def test_what_the_compiled_loop_would_read_past_is_refused_and_mixed_dtypes_take_numpys_form():
    layout = TransitionLayout(8, 4, 2, 16, 8)
    flat, (decay, key, delta), start = _transitions(layout, np.float32)
    for state, row, n in ((start, flat, 9), (start, flat, -1), (np.zeros((2, *start.shape[1:]), np.float32), flat, 1),
                          (start, flat[:, :-1], 1)):
        with pytest.raises(ValueError, match=r"select's replay takes one state of 4x8x16, its row of 8x\d+ transitions"):
            host_replay.replay_state(layout, state.copy(), row, n)
    mixed, reference = start.copy(), start.copy()  # float64 transitions on a float32 state: numpy's form, as before
    host_replay.replay_state(layout, mixed, flat.astype(np.float64), 3)
    replay_transitions(layout, reference, flat.astype(np.float64), 3)
    np.testing.assert_array_equal(mixed, reference)
    conv, conv_input = np.zeros((1, 3, 4), np.float32), np.ones((1, 5, 4), np.float16)
    host_replay.rebuild_conv(conv, conv_input, 2)
    np.testing.assert_array_equal(conv, [[[0] * 4, [1] * 4, [1] * 4]])
    conv_input = np.ones((1, 5, 4), np.float32)  # the compiled rebuild: counts and shapes it would misread refused
    for carry, inputs, n in ((conv, conv_input, 6), (conv, conv_input, -1), (conv, conv_input[:, :, :3], 2),
                             (np.zeros((2, 3, 4), np.float32), conv_input, 2)):
        with pytest.raises(ValueError, match=r"a conv carry rebuild takes n in 0\.\.\d+ and inputs of its rows"):
            host_replay.rebuild_conv(carry, inputs, n)


def test_where_numba_cannot_cache_the_update_compiles_per_process(monkeypatch):
    """A read-only install with no writable cache folder: numba refuses cache=True at decoration (a test double of
    that refusal here); the update is compiled without a disk cache and still runs."""
    real = jit.numba.njit

    def njit_that_cannot_cache(*args, **kwargs):
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function '_replay': no locator available for file 'host_replay.py'")
        return real(*args, **kwargs)

    monkeypatch.setattr(jit.numba, "njit", njit_that_cannot_cache)
    compiled = jit.compiled(host_replay._replay.py_func)
    layout = TransitionLayout(8, 4, 2, 16, 8)
    flat, (decay, key, delta), start = _transitions(layout, np.float32)
    got, reference = start.reshape(-1).copy(), start.copy()
    compiled(got, flat.reshape(-1), 3, 8, 4, 2, 16, 8)
    replay_transitions_xp(np, reference[0], decay, key, delta, 3, layout.group)
    np.testing.assert_array_equal(got, reference.reshape(-1))


def _layers(layout: TransitionLayout, dtype, channels_first: bool, M: int = 5, width: int = 3, C: int = 6):
    """Two GatedDeltaNet layers' states and a verify's outputs for them, as a batch-1 host state holds them."""
    rng = np.random.default_rng(11)
    carry, inputs = ((1, C, width), (1, C, M)) if channels_first else ((1, width, C), (1, M, C))
    st = SimpleNamespace(gdn={}, conv={})  # the two buffers dicts of a TargetState, nothing else
    ver, layers = {}, []
    for layer in (0, 2):
        flat, _, start = _transitions(layout, dtype, seed=layer)
        st.gdn[layer], st.conv[layer] = start, rng.standard_normal(carry).astype(dtype)
        ver[f"t.{layer}"], ver[f"c.{layer}"] = flat, rng.standard_normal(inputs).astype(dtype)
        layers.append((layer, f"t.{layer}", f"c.{layer}", channels_first))
    return st, ver, layers


def _layer_by_layer(layout, st, ver, layers, n):
    for layer, t, c, first in layers:
        host_replay.replay_state(layout, st.gdn[layer], ver[t], n)
        host_replay.rebuild_conv(st.conv[layer], ver[c], n, first)


def _copy(st):
    return SimpleNamespace(gdn={i: a.copy() for i, a in st.gdn.items()}, conv={i: a.copy() for i, a in st.conv.items()})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels_first", [False, True])
def test_every_layer_in_one_call_is_bitwise_the_layer_by_layer_update(channels_first, dtype):
    layout = TransitionLayout(8, 4, 2, 16, 8)
    st, ver, layers = _layers(layout, dtype, channels_first)
    at_once = host_replay.SelectLayers(layout, layers)
    for n in range(6):  # the verify's outputs hold 5 tokens
        one, each = _copy(st), _copy(st)
        assert at_once(one, ver, n) is True
        _layer_by_layer(layout, each, ver, layers, n)
        for kind in ("gdn", "conv"):
            for layer in (0, 2):
                np.testing.assert_array_equal(getattr(one, kind)[layer], getattr(each, kind)[layer])
                assert n == 0 or not np.array_equal(getattr(one, kind)[layer], getattr(st, kind)[layer])


def test_the_all_layers_call_refuses_what_it_does_not_take_and_writes_nothing():
    layout = TransitionLayout(8, 4, 2, 16, 8)
    st, ver, layers = _layers(layout, np.float32, False)
    at_once = host_replay.SelectLayers(layout, layers)
    before = _copy(st)

    def unchanged():
        return all(np.array_equal(a.ravel(), before.gdn[i].ravel()) for i, a in st.gdn.items()) and all(
            np.array_equal(a.ravel(), before.conv[i].ravel()) for i, a in st.conv.items())

    for n in (6, -1):  # beyond the verify's 5 tokens, or negative
        assert at_once(st, ver, n) is False and unchanged()
    st.conv[2].shape = (1, 18)  # reshaped in place: the same object, its size, a shape it does not take
    assert at_once(st, ver, 1) is False and unchanged()
    st.conv[2].shape = (1, 3, 6)
    readonly = ver["c.0"].copy()
    readonly.flags.writeable = False  # every array it holds must be writeable (it writes the states)
    for key, value in (("c.0", ver["c.0"][:, ::2]), ("c.0", readonly), ("t.2", ver["t.2"].astype(np.float64))):
        assert at_once(st, {**ver, key: value}, 1) is False and unchanged()
    half = SimpleNamespace(gdn={**st.gdn, 0: st.gdn[0].astype(np.float16)}, conv=st.conv)
    assert at_once(half, ver, 1) is False and unchanged()
    other = {**ver, "c.2": ver["c.2"].copy()}  # new arrays of the same kind: taken, and read where they are now
    other["c.2"][:, 0] = 7
    assert at_once(st, other, 1) is True
    np.testing.assert_array_equal(st.conv[2][0, -1], np.full(6, 7, np.float32))


def test_the_all_layers_call_reads_again_an_array_reshaped_or_given_new_memory_in_place():
    layout = TransitionLayout(8, 4, 2, 16, 8)
    st, ver, layers = _layers(layout, np.float32, False)
    memory = bytearray(ver["c.0"].tobytes())  # held here: memory given to the array later lands elsewhere
    ver["c.0"] = np.frombuffer(memory, np.float32).reshape(ver["c.0"].shape)
    at_once, one = host_replay.SelectLayers(layout, layers), _copy(st)
    assert at_once(one, ver, 1)  # made for these arrays: one's and ver's

    def same_as_layer_by_layer(outputs: dict) -> None:
        for kind in ("gdn", "conv"):  # one's arrays (the very objects it holds) back to the start, in place
            for layer in (0, 2):
                getattr(one, kind)[layer][...] = getattr(st, kind)[layer]
        each = _copy(st)
        assert at_once(one, ver, 3) is True
        _layer_by_layer(layout, each, outputs, layers, 3)
        for kind in ("gdn", "conv"):
            for layer in (0, 2):
                np.testing.assert_array_equal(getattr(one, kind)[layer], getattr(each, kind)[layer])

    moved = ver["c.0"]
    moved.__setstate__((1, moved.shape, moved.dtype, False, (moved + 1).tobytes()))  # new memory, the same object
    assert moved.ctypes.data != np.frombuffer(memory, np.float32).ctypes.data
    same_as_layer_by_layer(ver)
    rows = ver["t.2"]
    rows.shape = (2, rows.size // 2)  # the same object and size, another shape: taken as a row of C*width again
    same_as_layer_by_layer({**ver, "t.2": rows.reshape(1, -1)})
