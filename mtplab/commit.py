"""Rebuilding the recurrent state for an accepted prefix (approach B, `commit="select"`).

Two forms, chosen by the model description's `select`:
- "transitions" (the built-in model): GatedDeltaNet emits, per token, compact transition factors (decay, key, delta) laid out
struct-of-arrays over the capacity C: [C x Hv decays | C x Hk*Dk keys | C x Hv*Dv deltas].
Replaying the first n gives the state after n tokens: S = decay*S + outer(delta, key).
- "replay-op" (builder models): mtplab's copy of the graph also outputs each LinearAttention's
  per-token inputs; the accepted prefix is replayed through that same op, in a graph of its own.
The conv carry is the last (kernel-1) rows of [carry, conv inputs of the accepted tokens].
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .arena import array_module, to_numpy
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
    (A closed form, one einsum over the n tokens, measured no faster for n <= 4.)
    """
    if n <= 0:
        return
    keys = xp.repeat(key[:n], rep, axis=1)  # [n, Hv, Dk]: each key head repeated for its value heads, once
    for t in range(n):
        state *= decay[t][:, None, None]
        state += delta[t][:, :, None] * keys[t][:, None, :]


def rebuild_conv(conv_state: np.ndarray, conv_input: np.ndarray, n: int, channels_first: bool = False) -> None:
    """Set a conv carry [1, k-1, C] in place to its value after the first n of conv_input [1, M, C].

    channels_first: the carry is [1, C, k-1] and the input [1, C, M] (the builder's CausalConvWithState).
    """
    if channels_first:
        conv_state, conv_input = conv_state.transpose(0, 2, 1), conv_input.transpose(0, 2, 1)
    width = conv_state.shape[1]
    if n >= width:
        conv_state[0] = conv_input[0, n - width : n]
    elif n > 0:
        kept = conv_state[0, n:].copy()
        conv_state[0, : width - n] = kept
        conv_state[0, width - n :] = conv_input[0, :n]


def select_commit(desc, device) -> Callable:
    """select's state update for this model on this device: apply(state, verify outputs, n accepted)."""
    io = desc.target
    if desc.select == "transitions":
        cfg = desc.config
        replay = device.transition_replay(cfg)

        def apply(st, ver: dict, n: int) -> None:
            for i, roles in io.select_outputs.items():
                replay(st.gdn[i], ver[roles["transitions"].name], n)
                rebuild_conv(st.conv[i], ver[roles["conv_input"].name], n)

        return apply
    if desc.select == "replay-op":
        return OpReplay(desc, device)
    raise ValueError(desc.commit_problem("select"))


class OpReplay:
    """select on a builder model: LinearAttention replayed on the accepted prefix (mtplab.model.surgery), conv rebuilt."""

    def __init__(self, desc, device):
        import onnxruntime as ort

        from .model.surgery import replay_graph
        from .runtime import session_options

        self.desc, self.xp = desc, device.xp
        graph, self.layers = replay_graph(desc)
        self.session = ort.InferenceSession(graph, session_options(1), providers=["CPUExecutionProvider"])

    def __call__(self, st, ver: dict, n: int) -> None:
        io, feeds = self.desc.target, {}
        for s, roles in self.layers:
            feeds[f"past_state.{s.layer}"] = to_numpy(st.gdn[s.layer])
            for role in roles:
                prefix = to_numpy(ver[io.select_outputs[s.layer][role].name])[:, :n]
                feeds[f"{role}.{s.layer}"] = np.ascontiguousarray(prefix)
        names = [f"present.{s.layer}" for s, _ in self.layers]
        for (s, _), present in zip(self.layers, self.session.run(names, feeds)):
            st.gdn[s.layer][...] = self.xp.asarray(present)
        for s in io.states:
            if s.kind == "conv":
                conv_input = ver[io.select_outputs[s.layer]["conv_input"].name]
                rebuild_conv(st.conv[s.layer], conv_input, n, channels_first="channels-first" in s.layout)
