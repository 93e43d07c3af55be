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

import operator
from collections.abc import Callable
from operator import attrgetter, is_

import numpy as np

from mtplab.engine.strategies import COMMITS
from mtplab.model.graph import rebuild_conv
from mtplab.model.per_position import CUDA_REFUSAL, per_position_form, per_position_problem
from mtplab.runtime.arena import to_numpy
from mtplab.runtime.plans import direct_runner


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
    own_verify_graph: bool = False  # its verify runs a form of the model of its own (form()): priced apart

    def refusal(self, desc) -> str | None:
        """Why this strategy cannot run on a model (a ModelDescription), or None."""
        return None

    def backend_refusal(self, backend: str) -> str | None:
        """Why this strategy cannot run on a backend ("cpu", "cuda"), or None."""
        return None

    def form(self, desc, decodes_apart: bool = False, batch: int = 1):
        """The model form its verify runs: desc itself, or a copy with outputs of its own (made before any session;
        an engine built so commits with this strategy alone). decodes_apart: the engine's decodes run in a session
        of their own (the form's decode_target, where it sets one); batch: the rows the engine decodes."""
        return desc

    def prepare(self, engine) -> Callable[[dict, list[int], int], None]:
        """A strategy of the user's own: its commit of one sequence, commit(verify outputs, consumed tokens, start)
        (mtplab's own commit every row at once: mtplab.engine.batch_commits).

        Called once per Engine. On entry the state's length is `start` (KV rollback is contents-only) and,
        when verify_in_place, the live recurrent state still holds the verify's advance; on return it must
        hold exactly the consumed tokens after `start` (the engine sets the length).
        """
        raise NotImplementedError

    def how(self, desc) -> str:
        """How it runs on a model, in words (`mtplab model inspect`)."""
        return self.summary

    def forwards(self, accepted: list[int]) -> dict[str, int]:
        """The target forwards its commits make for one sequence's accepted counts (one a step), by "slot/M=m" (the
        audit's expectation)."""
        out: dict[str, int] = {}
        for a in accepted:
            for key, n in self.step_forwards([a]).items():
                _add(out, key, n)
        return out

    def step_forwards(self, accepted: list[int]) -> dict[str, int]:
        """The target forwards one batch step's commit makes, given the accepted counts of the rows it commits."""
        return {}


def _add(counts: dict[str, int], key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


class ReadvanceM1(CommitStrategy):
    name = "readvance-m1"
    summary = "restore the state, re-advance the accepted tokens one M=1 forward each"
    bitwise = True
    why = "advances one token at a time with the reference's kernels"

    def step_forwards(self, accepted):  # the longest row's count at [B, 1]; shorter rows ride along
        return {"primary/M=1": max(accepted) + 1} if accepted else {}


class ReadvanceBatched(CommitStrategy):
    name = "readvance-batched"
    summary = "restore the state, re-advance the accepted tokens in one M=n forward"
    why = "re-advances the accepted tokens in one M=n forward, whose products round differently from the reference's M=1"
    primary_multi_token = True

    def step_forwards(self, accepted):  # one [B, c] forward per distinct count c among the rows
        return {f"primary/M={a + 1}": 1 for a in set(accepted)}


class Select(CommitStrategy):
    name = "select"
    verify_in_place = False
    why = "keeps what the M=k+1 verify computed, whose products may round differently from the reference's M=1"

    summary = "keep the verify's state for the accepted prefix (GatedDeltaNet transitions or LinearAttention replayed)"

    def refusal(self, desc):
        return None if desc.select else (f"commit='select' cannot run on {desc.name}: "
                                         f"{desc.select_refused or 'its graphs give select nothing to replay'}")

    def how(self, desc) -> str:
        """select's form on a model, in words."""
        if desc.select == "transitions" and desc.original_target is not None:
            return ("replay GatedDeltaNet's per-token transitions (graph surgery on a cached copy of the target: "
                    f"state_update_capacity {desc.transition_capacity}, capture_count fed, state_update read)")
        return {"transitions": "replay GatedDeltaNet's per-token transitions",
                "replay-op": "replay LinearAttention on the accepted prefix's inputs (graph surgery on a cached copy "
                             "of the target)"}.get(desc.select, str(desc.select))


def select_commit(desc, device) -> Callable:
    """select's state update for this model on this device: apply(state, verify outputs, n accepted, row=None); row=b:
    batch row b only."""
    if desc.select == "transitions":
        return transitions_update(desc, device)
    if desc.select == "replay-op":
        return OpReplay(desc, device)
    raise ValueError(SELECT.refusal(desc) or f"unknown select form {desc.select!r}")


def transitions_update(desc, device) -> Callable:
    """apply(state, verify outputs, n, row=None): every GatedDeltaNet layer's state advanced by its first n
    transitions and its conv carry rebuilt from the first n conv inputs (one CuPy kernel per state on the device);
    row=b: batch row b only."""
    io = desc.target
    replay = device.transition_replay(desc.transitions)
    layers = [(s.layer, io.select_outputs[s.layer]["transitions"].name, io.select_outputs[s.layer]["conv_input"].name,
               "channels-first" in s.layout) for s in io.states if s.kind == "conv"]

    def apply(st, ver: dict, n: int, row: int | None = None) -> None:
        gdn, conv = st.gdn, st.conv
        rows = slice(None) if row is None else slice(row, row + 1)
        for i, t, c, first in layers:
            replay(gdn[i][rows], ver[t][rows], n)
            rebuild_conv(conv[i][rows], ver[c][rows], n, first)

    return apply


class OpReplay:
    """select on a builder model: LinearAttention replayed on the accepted prefix (mtplab.model.surgery), conv rebuilt.

    On the host the replay graph runs on an IOBinding: each state bound by address, each role's prefix bound in
    place (the verify's output [1, M, ...] read as [1, n, ...]: a C-contiguous prefix), the presents into buffers of
    their own, copied into the states after the run. One binding per n, for the very arrays it binds (checked by
    identity, dtype, shape and strides at every commit); it is made once the same arrays come back from one commit
    to the next. Arrays new at every commit (a policy whose verify runs into temporaries) are fed as copies, as
    before: a binding made per commit would cost more than it saves. On a device the graph runs on the host too: each
    state and role is copied over (Device.read: every copy a counted wait for the device) and the presents back."""

    def __init__(self, desc, device):
        import onnxruntime as ort

        from mtplab.base.threads import session_options
        from mtplab.model.surgery import replay_graph

        self.desc, self.xp = desc, device.xp
        self.to_host = to_numpy if device.xp is np else device.read  # a device's copy to the host waits for it
        graph, self.layers = replay_graph(desc)
        self.session = ort.InferenceSession(graph, session_options(1), providers=["CPUExecutionProvider"])
        io = desc.target
        self.roles = [(s, [(role, io.select_outputs[s.layer][role].name) for role in roles]) for s, roles in self.layers]
        self.convs = [(s.layer, io.select_outputs[s.layer]["conv_input"].name, "channels-first" in s.layout)
                      for s in io.states if s.kind == "conv"]
        # the replay session is the CPU's: its LinearAttention writes present onto the state's own buffer where that
        # kernel allows it (mtplab.model.description.ALIASED), else into a buffer copied into the state after the run
        self.aliased = {s.layer for s, _ in self.layers if s.in_place_on("CPUExecutionProvider")}
        self.presents = {s.layer: np.empty((1, *s.shape[1:]), s.np_dtype) for s, _ in self.layers}
        self.layer_ids = list(self.presents)
        self.copied = [layer for layer in self.layer_ids if layer not in self.aliased]
        self.role_names = [name for _, roles in self.roles for _, name in roles]  # in _bind's order
        self.plans: dict[int, tuple] = {}  # n -> (its run, the arrays it binds, their dtype, shape and strides)
        self.last: list = []  # the arrays of the last commit

    def __call__(self, st, ver: dict, n: int, row: int | None = None) -> None:
        n = operator.index(n)  # a count of tokens (a float would key a binding and then fail the conv rebuild)
        held = ver[self.role_names[0]].shape[1] if self.role_names else n
        if not 0 <= n <= held:  # refused before any state changes
            raise ValueError(f"select's replay of {n} tokens: the verify's outputs hold {held}")
        rows = slice(None) if row is None else slice(row, row + 1)  # a batch's row b: its own n, as a batch of one
        if self.xp is np and st.batch == 1:
            self._replay_bound(st, ver, n)
        else:
            self._replay_fed(st, ver, n, rows)
        for layer, name, first in self.convs:
            rebuild_conv(st.conv[layer][rows], ver[name][rows], n, first)

    def _replay_fed(self, st, ver: dict, n: int, rows: slice = slice(None)) -> None:
        feeds = {}
        to_host = self.to_host
        for s, roles in self.roles:
            feeds[f"past_state.{s.layer}"] = np.ascontiguousarray(to_host(st.gdn[s.layer][rows]))
            for role, name in roles:
                feeds[f"{role}.{s.layer}"] = np.ascontiguousarray(to_host(ver[name][rows])[:, :n])
        names = [f"present.{s.layer}" for s, _ in self.layers]
        for (s, _), present in zip(self.layers, self.session.run(names, feeds)):
            st.gdn[s.layer][rows] = self.xp.asarray(present)

    def _replay_bound(self, st, ver: dict, n: int) -> None:
        gdn = st.gdn
        arrays = [gdn[layer] for layer in self.layer_ids] + [ver[name] for name in self.role_names]
        again, self.last = len(arrays) == len(self.last) and all(map(is_, arrays, self.last)), arrays
        plan = self.plans.get(n)
        if plan is None or not all(map(is_, arrays, plan[1])) or list(map(_META, arrays)) != plan[2]:
            if not again or not all(a.flags.c_contiguous and a.shape[0] == 1 for a in arrays):
                return self._replay_fed(st, ver, n)  # new arrays, or not bindable in place
            tokens = {a.shape[1] for a in arrays[len(self.layer_ids):]}
            if not 0 <= n <= min(tokens):  # a binding past a buffer's end would read beyond it
                raise ValueError(f"select's replay of {n} tokens: the verify's outputs hold {sorted(tokens)}")
            plan = self.plans[n] = (direct_runner(self.session, self._bind(st, ver, n)), arrays,
                                    list(map(_META, arrays)))
        plan[0]()
        for layer in self.copied:
            gdn[layer][...] = self.presents[layer]

    def _bind(self, st, ver: dict, n: int):
        from mtplab.runtime.arena import address

        binding = self.session.io_binding()
        for s, roles in self.roles:
            state = st.gdn[s.layer]
            binding.bind_input(f"past_state.{s.layer}", "cpu", 0, state.dtype, list(state.shape), address(state))
            for role, name in roles:
                a = ver[name]
                binding.bind_input(f"{role}.{s.layer}", "cpu", 0, a.dtype, [1, n, *a.shape[2:]], address(a))
            present = state if s.layer in self.aliased else self.presents[s.layer]
            binding.bind_output(f"present.{s.layer}", "cpu", 0, present.dtype, list(present.shape), address(present))
        return binding


_META = attrgetter("dtype", "shape", "strides")


class PerPosition(CommitStrategy):
    name = "per-position"
    verify_in_place = False
    own_verify_graph = True
    summary = "the verify writes the recurrent state after each of its tokens; commit takes the n-th (no replay)"
    why = ("its states come from the decode's kernel at M=1 on the verify's per-token inputs, which the M=k+1 "
           "projections may round differently from the reference's M=1")

    def refusal(self, desc):
        return per_position_problem(desc)

    def backend_refusal(self, backend):
        return CUDA_REFUSAL if backend == "cuda" else None

    def form(self, desc, decodes_apart=False, batch=1):
        return per_position_form(desc, decodes_apart, batch)

    def how(self, desc) -> str:
        ops = sorted({s.op for s in desc.target.states if s.kind == "recurrent"})
        return (f"each {'/'.join(ops)} runs one token at a time in a Loop over the verify's tokens, writing the state "
                "after each (graph surgery on a cached copy of the target; a decode runs the op itself); commit takes "
                "the n-th, the conv carry rebuilt from the first n conv inputs")


def position_update(desc) -> Callable:
    """apply(state, verify outputs, n, row=None): each recurrent state set to the verify's state after its n-th
    token (its present after the last), each conv carry rebuilt from the first n conv inputs; row=b: batch row b
    only."""
    io = desc.target
    presents = {s.layer: s.present for s in io.states if s.kind == "recurrent"}
    states = [(layer, name, presents[layer]) for layer, name in io.position_states.items()]
    convs = [(s.layer, io.select_outputs[s.layer]["conv_input"].name, "channels-first" in s.layout)
             for s in io.states if s.kind == "conv"]

    def apply(st, ver: dict, n: int, row: int | None = None) -> None:
        if n < 1:
            return
        rows = slice(None) if row is None else slice(row, row + 1)
        for layer, name, present in states:
            after = ver[name]
            st.gdn[layer][rows] = after[n - 1, rows] if n <= len(after) else ver[present][rows]
        for layer, name, first in convs:
            rebuild_conv(st.conv[layer][rows], ver[name][rows], n, first)

    return apply


READVANCE_M1 = COMMITS.register(ReadvanceM1())
READVANCE_BATCHED = COMMITS.register(ReadvanceBatched())
SELECT = COMMITS.register(Select())
PER_POSITION = COMMITS.register(PerPosition())
