"""Commit strategies: how the recurrent state comes to hold exactly the accepted prefix after a verify.

- readvance-m1: restore the state from before the verify, re-advance the accepted tokens one M=1
  forward each on Slot.PRIMARY (the reference's own kernels: bitwise on the same device).
- readvance-batched: restore, re-advance them in one M=n forward.
- select (approach B): keep what the M=k+1 verify computed, rebuilt for the accepted prefix. Two
  forms, chosen by the model description's `select`: "transitions" (the built-in model: GatedDeltaNet
  emits, per token, compact transition factors (decay, key, delta) laid out struct-of-arrays over the
  capacity C; replaying the first n gives the state after n tokens, S = decay*S + outer(delta, key),
  mtplab.model.graph), and "replay-op" (builder models: mtplab's copy of the graph also outputs each
  LinearAttention's per-token inputs; the accepted prefix is replayed through that same op, in a
  graph of its own). The conv carry is the last (kernel-1) rows of [carry, conv inputs of the accepted tokens].

A strategy is an object in `mtplab.engine.strategies.COMMITS`; a new one subclasses CommitStrategy
and registers itself (tests/toy_strategies.py has one written outside mtplab).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mtplab.engine.strategies import COMMITS
from mtplab.model.graph import rebuild_conv
from mtplab.runtime.arena import to_numpy
from mtplab.runtime.executor import Slot


class CommitStrategy:
    """What a commit strategy owns: its verify mode, the commit itself, its guarantee, its forwards, its refusals.

    name: the RunConfig `commit` value; summary: what it does, one line.
    verify_in_place: the verify advances the live recurrent state (the engine snapshots it first and the
    commit restores it); else the verify writes to buffers of its own and the commit reads its outputs.
    primary_multi_token: its commits run M > 1 forwards on Slot.PRIMARY (invalidating its M=1 plan, by design).
    bitwise: the committed state equals the M=1 reference's bitwise on the reference's device; else
    `why` says where rounding legitimately differs (the checks then hold it to a relative tolerance).
    """

    name: str = ""
    summary: str = ""
    verify_in_place: bool = True
    bitwise: bool = False
    why: str = ""
    primary_multi_token: bool = False  # its commits run M > 1 forwards on Slot.PRIMARY (whose plan is M=1)

    def refusal(self, desc) -> str | None:
        """Why this strategy cannot run on a model (a ModelDescription), or None."""
        return None

    def prepare(self, engine) -> Callable[[dict, list[int], int], None]:
        """The engine's commit for this strategy: commit(verify outputs, consumed tokens, start).

        Called once per Engine. On entry the state's length is `start` (KV rollback is contents-only) and,
        when verify_in_place, the live recurrent state still holds the verify's advance; on return it must
        hold exactly the consumed tokens after `start` (the engine sets the length).
        """
        raise NotImplementedError

    def how(self, desc) -> str:
        """How it runs on a model, in words (`mtplab model inspect`)."""
        return self.summary

    def forwards(self, accepted: list[int]) -> dict[str, int]:
        """The target forwards its commits make for these accepted counts, by "slot/M=m" (the audit's expectation)."""
        return {}


def _add(counts: dict[str, int], key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


class ReadvanceM1(CommitStrategy):
    name = "readvance-m1"
    summary = "restore the state, re-advance the accepted tokens one M=1 forward each"
    bitwise = True
    why = "advances one token at a time with the reference's kernels"

    def prepare(self, engine):
        def commit(ver: dict, consumed: list[int], start: int) -> None:
            engine.restore_state()
            for j, tok in enumerate(consumed):
                engine.state.length = start + j
                engine.forward(Slot.PRIMARY, [tok])

        return commit

    def forwards(self, accepted):
        return {"primary/M=1": sum(a + 1 for a in accepted)} if accepted else {}


class ReadvanceBatched(CommitStrategy):
    name = "readvance-batched"
    summary = "restore the state, re-advance the accepted tokens in one M=n forward"
    why = "re-advances the accepted tokens in one M=n forward, whose products round differently from the reference's M=1"
    primary_multi_token = True

    def prepare(self, engine):
        def commit(ver: dict, consumed: list[int], start: int) -> None:
            engine.restore_state()
            engine.forward(Slot.PRIMARY, consumed)

        return commit

    def forwards(self, accepted):
        out: dict[str, int] = {}
        for a in accepted:
            _add(out, f"primary/M={a + 1}")
        return out


class Select(CommitStrategy):
    name = "select"
    verify_in_place = False
    why = ("keeps what the M=k+1 verify computed, whose products may round differently from the reference's M=1 "
           "(measured: bitwise on the fp32 builder fixture, within 5.9e-7 relative on tiny, 9.2e-7 on small, 2.6e-2 on the "
           "fp16 GatedDeltaNet builder export run on the CPU)")

    summary = "keep the verify's state for the accepted prefix (GatedDeltaNet transitions or LinearAttention replayed)"

    def refusal(self, desc):
        return None if desc.select else (f"commit='select' cannot run on {desc.name}: "
                                         f"{desc.select_refused or 'its graphs give select nothing to replay'}")

    def prepare(self, engine):
        apply = select_commit(engine.desc, engine.device)

        def commit(ver: dict, consumed: list[int], start: int) -> None:
            apply(engine.state, ver, len(consumed))

        return commit

    def how(self, desc) -> str:
        """select's form on a model, in words."""
        if desc.select == "transitions" and desc.original_target is not None:
            return ("replay GatedDeltaNet's per-token transitions (graph surgery on a cached copy of the target: "
                    f"state_update_capacity {desc.transition_capacity}, capture_count fed, state_update read)")
        return {"transitions": "replay GatedDeltaNet's per-token transitions",
                "replay-op": "replay LinearAttention on the accepted prefix's inputs (graph surgery on a cached copy "
                             "of the target)"}.get(desc.select, str(desc.select))


def select_commit(desc, device) -> Callable:
    """select's state update for this model on this device: apply(state, verify outputs, n accepted)."""
    if desc.select == "transitions":
        return transitions_update(desc, device)
    if desc.select == "replay-op":
        return OpReplay(desc, device)
    raise ValueError(SELECT.refusal(desc) or f"unknown select form {desc.select!r}")


def transitions_update(desc, device) -> Callable:
    """apply(state, verify outputs, n, row=None): every GatedDeltaNet layer's state advanced by its first n
    transitions and its conv carry rebuilt from the first n conv inputs, layer by layer (on the host one compiled
    call each, mtplab.runtime.host_replay; on the device one kernel per state); row=b: batch row b only."""
    io = desc.target
    replay = device.transition_replay(desc.transitions)
    if device.xp is np:
        from mtplab.runtime import host_replay

        rebuild = host_replay.rebuild_conv
    else:
        rebuild = rebuild_conv
    layers = [(s.layer, io.select_outputs[s.layer]["transitions"].name, io.select_outputs[s.layer]["conv_input"].name,
               "channels-first" in s.layout) for s in io.states if s.kind == "conv"]

    def apply(st, ver: dict, n: int, row: int | None = None) -> None:
        gdn, conv = st.gdn, st.conv
        if row is None:
            for i, t, c, first in layers:
                replay(gdn[i], ver[t], n)
                rebuild(conv[i], ver[c], n, first)
            return
        rows = slice(row, row + 1)
        for i, t, c, first in layers:
            replay(gdn[i][rows], ver[t][rows], n)
            rebuild(conv[i][rows], ver[c][rows], n, first)

    return apply


class OpReplay:
    """select on a builder model: LinearAttention replayed on the accepted prefix (mtplab.model.surgery), conv rebuilt."""

    def __init__(self, desc, device):
        import onnxruntime as ort

        from mtplab.base.threads import session_options
        from mtplab.model.surgery import replay_graph

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


READVANCE_M1 = COMMITS.register(ReadvanceM1())
READVANCE_BATCHED = COMMITS.register(ReadvanceBatched())
SELECT = COMMITS.register(Select())
