"""Rebuilding the recurrent state for an accepted prefix (approach B, `commit="select"`).

GatedDeltaNet emits, per token, compact transition factors (decay, key, delta) laid out
struct-of-arrays over the capacity C: [C x Hv decays | C x Hk*Dk keys | C x Hv*Dv deltas].
Replaying the first n gives the state after n tokens: S = decay*S + outer(delta, key).
The conv carry is the last (kernel-1) rows of [carry, conv inputs of the accepted tokens].
"""

from __future__ import annotations

import numpy as np

from .arena import array_module
from .model import ModelConfig


def split_transitions(cfg: ModelConfig, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(decay [C, Hv], key [C, Hk, Dk], delta [C, Hv, Dv]) views of one layer's transitions row."""
    C, Hv, Hk = cfg.transition_capacity, cfg.gdn_value_heads, cfg.gdn_key_heads
    Dk, Dv = cfg.gdn_head_dim_k, cfg.gdn_head_dim_v
    flat = flat.reshape(-1)
    decay = flat[: C * Hv].reshape(C, Hv)
    key = flat[C * Hv : C * (Hv + Hk * Dk)].reshape(C, Hk, Dk)
    delta = flat[C * (Hv + Hk * Dk) : C * (Hv + Hk * Dk + Hv * Dv)].reshape(C, Hv, Dv)
    return decay, key, delta


def replay_transitions(cfg: ModelConfig, state: np.ndarray, flat: np.ndarray, n: int) -> None:
    """Advance a GatedDeltaNet state [1, Hv, Dv, Dk] (V-major) in place by the first n transitions."""
    decay, key, delta = split_transitions(cfg, flat)
    replay_transitions_xp(array_module(state), state[0], decay, key, delta, n, cfg.gdn_value_heads // cfg.gdn_key_heads)


def replay_transitions_xp(xp, state, decay, key, delta, n: int, rep: int) -> None:
    """S = decay*S + outer(delta, key), n times, with any array module (numpy here, CuPy on the device).

    state [Hv, Dv, Dk]; decay [C, Hv]; key [C, Hk, Dk]; delta [C, Hv, Dv]; rep = Hv // Hk.
    """
    if n <= 0:
        return
    keys = xp.repeat(key[:n], rep, axis=1)  # [n, Hv, Dk]: each key head repeated for its value heads, once
    for t in range(n):
        state *= decay[t][:, None, None]
        state += delta[t][:, :, None] * keys[t][:, None, :]


def rebuild_conv(conv_state: np.ndarray, conv_input: np.ndarray, n: int) -> None:
    """Set a conv carry [1, k-1, C] in place to its value after the first n of conv_input [1, M, C]."""
    width = conv_state.shape[1]
    if n >= width:
        conv_state[0] = conv_input[0, n - width : n]
    elif n > 0:
        kept = conv_state[0, n:].copy()
        conv_state[0, : width - n] = kept
        conv_state[0, width - n :] = conv_input[0, :n]
