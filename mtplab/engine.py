"""The speculative engine: greedy baseline and MTP speculative decoding on the two-slot executor.

The Engine holds the sessions, slots, arenas and state of one run; one speculative step (draft,
verify on Slot.VERIFY, accept the longest greedy-match prefix plus a bonus token, commit the
recurrent state for it) is a short function per schedule in mtplab.schedule. KV rollback is
contents-only: the logical length shrinks, buffers stay.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import oracle
from .arena import to_numpy
from .commit import select_commit
from .config import RunConfig, capacity_problem, model_spec
from .device import Device, device_for
from .drafters import Drafter, MtpDrafter, OracleDrafter
from .executor import Executor, Slot, SlotMemory
from .model import PRESETS, build_model, preset
from .model.config import k_problem
from .policy import policy, presize, slot_memory
from .runtime import MtpState, TargetState, mtp_io, target_io
from .schedule import STEPS


@dataclass
class Greedy:
    tokens: list[int]
    margins: list[float]
    seconds: float
    decodes: int
    logits: list[np.ndarray] = field(default_factory=list)
    started: float = float("nan")  # perf_counter when the timed window opened


def accepted_count(xp, drafts, targets):
    """Longest prefix where drafts[i] equals the target's argmax at position i, on the device.

    xp is numpy or cupy; the result is a 0-d array, read with the step's tokens.
    """
    k = drafts.shape[0]
    match = (drafts == targets[:k]).astype(np.int32)
    return xp.cumprod(match).sum()


def prompt_tokens(vocab: int, length: int, seed: int) -> list[int]:
    """A deterministic prompt for a seed."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, length)]


@functools.cache
def cpu_kernel_present() -> bool:
    """Whether this onnxruntime's CPU EP runs GatedDeltaNet (probed once per process)."""
    from .model.forms import cpu_runs_gated_delta_net

    return cpu_runs_gated_delta_net()


def model_for(run: RunConfig):
    """The model a RunConfig runs: a preset's build (fp16 on CUDA: GroupQueryAttention there is fp16/bf16
    only), or the folder `run.model` names (builder output, or an mtplab artifact)."""
    spec = model_spec(run)
    if spec not in PRESETS:
        from .model.inspect import open_model

        return open_model(spec)
    if run.backend == "cpu" and not cpu_kernel_present():
        import onnxruntime

        raise ValueError(
            f"onnxruntime {onnxruntime.__version__} has no CPU GatedDeltaNet kernel, which the built-in model needs "
            "(the 1.30 and 1.31 CPU wheels hold its schema only): install onnxruntime>=1.32, or run --backend cuda "
            "with onnxruntime-gpu"
        )
    return build_model(
        preset(spec, weight_format="int4" if run.int4 else "fp32", dtype="fp16" if run.backend == "cuda" else "fp32")
    )


class Engine:
    """Sessions, arenas, executors and state for one RunConfig on one model and device."""

    def __init__(self, run: RunConfig, artifact=None, device: Device | None = None):
        self.run_cfg = run
        dev = self.device = device or device_for(run.backend, run.max_recaptures, threads=run.threads)
        self.art = artifact or model_for(run)
        desc = self.desc = self.art.description
        self.cfg = desc.config  # the built-in model's ModelConfig (None for other models)
        check_run_on_model(run, desc)
        dev.check_model(desc)
        self.xp = dev.xp
        pol = self.policy = policy(run.policy)
        self.main = dev.arena("main")
        self.state = TargetState.allocate(desc, self.main)
        shared = dev.shared_weights(self.art.target) if pol.sibling_session else None
        primary_session = dev.session(self.art.target, shared)
        verify_session = dev.session(self.art.target, shared) if pol.sibling_session else primary_session
        self._shared_weights = shared  # the sessions use these OrtValues in place: keep them alive
        # Largest I/O any slot binds: verify at M=k+1, both recurrent modes.
        big = np.zeros(run.k + 1, dtype=np.int64)
        specs = [target_io(desc, self.state, big, in_place) for in_place in (True, False)]
        memory, arenas = slot_memory(
            pol, dev, self.main, specs, dev.host_inputs, frozenset({desc.target.logits, desc.target.hidden})
        )
        self.arenas = {"main": self.main, **arenas}
        self.target = Executor(
            {Slot.PRIMARY: primary_session, Slot.VERIFY: verify_session},
            memory,
            backend=dev.backend,
            max_recaptures=run.max_recaptures,
            validate=run.validate,
            retain_decode_graph_across_spec=run.retain_decode_graph_across_spec,
        )
        self.mtp_state = MtpState.allocate(desc, self.main)
        mtp_arena = self.arenas["mtp"] = dev.arena("mtp")
        feeds, outputs, _ = mtp_io(desc, self.mtp_state, 0, np.zeros(desc.hidden_size), 0)
        presize(mtp_arena, feeds, outputs, skip=dev.host_inputs)
        self.mtp = Executor(
            {Slot.PRIMARY: dev.session(self.art.mtp)},
            {Slot.PRIMARY: SlotMemory(mtp_arena, host_inputs=dev.host_inputs)},
            labels={Slot.PRIMARY: "mtp"},
            backend=dev.backend,
            max_recaptures=run.max_recaptures,
            validate=run.validate,
        )
        self.forwards: dict[str, int] = {}
        self._keys: dict[tuple, str] = {}  # forward counter names by (slot, label, M)
        io = desc.target
        self._roles = (io.logits, io.hidden) if (io.logits, io.hidden) != ("logits", "hidden") else ()
        self.watch = None  # the checked pass looks at every forward's outputs (lossless.Watch)
        self.opened = float("nan")  # perf_counter at the end of the last run's untimed setup (prefill)
        # perf_counter at the start of the first target forward after that setup, and at the end of the last one
        self.first_forward: float | None = None
        self.last_forward: float | None = None
        self.head = MtpDrafter(desc, self.mtp, self.mtp_state, self.forwards)
        self.snapshot = [
            self.main.reserve(f"snapshot.{i}", a.shape, a.dtype) for i, a in enumerate(self.state.recurrent_arrays())
        ]
        self.handoff_bytes = desc.hidden_size * 4
        self.last_hidden = self.main.reserve("last_hidden", (desc.hidden_size,), np.float32)
        self.select = select_commit(desc, dev) if run.commit == "select" else None

    # -- forwards ------------------------------------------------------------------------------
    def forward(self, slot: Slot, tokens, in_place: bool = True, eager: bool = False, label: str | None = None) -> dict:
        """One target forward of `tokens` (ints, or a host or device array) at the current length.

        Returns the outputs by role: "logits", "hidden", and the graph's own names for the rest.
        The caller advances the length.
        """
        if self.first_forward is None:  # one clock read per forward on the common path (the end stamp below)
            self.first_forward = time.perf_counter()
        if isinstance(tokens, list):
            tokens = np.asarray(tokens, dtype=np.int64)
        feeds, outputs, bound = target_io(self.desc, self.state, tokens, in_place)
        run = self.target.run_eager if eager else self.target.run
        out = run(slot, feeds, outputs, bound)
        if in_place:
            self.state.carry()
        if self._roles:  # the graph names its outputs otherwise: add them under their roles
            out["logits"], out["hidden"] = out[self._roles[0]], out[self._roles[1]]
        key = self._keys.get((slot, label, tokens.size))
        if key is None:
            key = self._keys[(slot, label, tokens.size)] = f"{label or self.target.labels[slot]}/M={tokens.size}"
        self.forwards[key] = self.forwards.get(key, 0) + 1
        if self.watch is not None:
            self.watch(key, self.state.length, out)
        self.last_forward = time.perf_counter()
        return out

    def _start(self, prompt: list[int]) -> dict:
        self.state.reset()
        self.mtp_state.kv[0][...] = 0
        self.mtp_state.kv[1][...] = 0
        self.target.new_generation()
        self.mtp.new_generation()
        out = self.forward(Slot.PRIMARY, prompt, eager=True, label="prefill")
        self.state.length = len(prompt)
        self.opened = time.perf_counter()  # the untimed setup ends here (the audit holds timed windows to it)
        self.first_forward = self.last_forward = None
        return out

    # -- greedy --------------------------------------------------------------------------------
    def greedy(
        self, prompt: list[int], n: int, eager: bool = False, keep_logits: int = 0, margins: bool = True
    ) -> Greedy:
        """Greedy decoding of n tokens at M=1 on Slot.PRIMARY.

        Tokens and margins stay on the device until the end: the loop never waits for it (each
        argmax feeds the next decode directly). eager=True runs every decode outside the slot's plan.
        keep_logits=m keeps the first m logits rows (prefill's last, then each decode) for the anchor.
        margins=False skips the top-2 margins (a timed run: the decoder it measures computes none).
        Time starts after the prefill; `decodes` = n - 1 tokens are timed (the first is the prefill's).
        """
        xp, state, forward = self.xp, self.state, self.forward
        argmax = np.ndarray.argmax if xp is np else xp.argmax  # numpy: the method, without np.argmax's dispatch
        out = self._start(prompt)
        row = out["logits"][0, -1]
        tokens, rows = [argmax(row)], [row.copy()][:keep_logits]
        gaps = [oracle.top2_margin_xp(xp, row)] if margins else []
        t0 = time.perf_counter()
        while len(tokens) < n:
            out = forward(Slot.PRIMARY, tokens[-1].reshape(1), eager=eager)
            state.length += 1
            row = out["logits"][0, 0]
            if len(rows) < keep_logits:
                rows.append(row.copy())
            tokens.append(argmax(row))
            if margins:
                gaps.append(oracle.top2_margin_xp(xp, row))
        if margins:
            host = self.device.read(xp.stack([xp.stack(tokens).astype(np.float64), xp.stack(gaps)]))
        else:
            host = [self.device.read(xp.stack(tokens)), []]
        seconds = time.perf_counter() - t0
        logits = [to_numpy(r) for r in rows]
        return Greedy([int(t) for t in host[0]], [float(m) for m in host[1]], seconds, n - 1, logits, t0)

    # -- speculative ---------------------------------------------------------------------------
    def drafter(self, reference: list[int] | None) -> Drafter:
        """The run's drafter: the MTP head, or the oracle over the greedy reference (with or without the head)."""
        run = self.run_cfg
        if run.drafter != "oracle":
            return self.head
        if reference is None:
            raise ValueError("the oracle drafter needs the greedy reference tokens")
        head = None if run.oracle_free_drafts else self.head
        return OracleDrafter(reference, run.alpha, run.seed, self.desc.vocab_size, head, self.xp)

    def speculative(
        self, prompt: list[int], n: int, reference: list[int] | None = None, on_commit: Callable | None = None
    ) -> dict:
        """Speculative decoding until at least n tokens; returns tokens and per-step statistics.

        on_commit(step, length), when given, is called after every commit (the checked pass
        compares the committed state there; timed runs pass nothing). The schedule's step
        function (mtplab.schedule) does one draft-verify-accept-commit round.
        """
        drafter = self.drafter(reference)
        out = self._start(prompt)
        emitted = [int(self.device.read(self.xp.argmax(out["logits"][0, -1])))]
        drafter.prefill(prompt[1:] + emitted, out["hidden"][0])
        self.last_hidden[...] = out["hidden"][0, -1]
        self.opened = time.perf_counter()  # the head's prefill is untimed setup too
        self.first_forward = self.last_forward = None
        step = STEPS[self.run_cfg.schedule]
        split = dict.fromkeys(("decode", "draft", "verify", "commit"), 0.0)
        accepted: list[int] = []
        t_start = time.perf_counter()
        while len(emitted) < n:
            accepted.append(step(self, emitted, drafter, split))
            if on_commit is not None:
                on_commit(len(accepted), self.state.length)
        seconds = time.perf_counter() - t_start
        return {"tokens": emitted, "seconds": seconds, "accepted": accepted, "split": split, "started": t_start}

    def verify(self, first, drafts) -> tuple[int, list[int], int, dict]:
        """Verify [first, d1..dk] on Slot.VERIFY: (accepted count, consumed tokens, bonus token, outputs).

        consumed = [first, d1..dn]: the tokens whose state the commit keeps. The step's one host read.
        """
        xp, k = self.xp, int(drafts.shape[0])
        if self.select is None:
            for snap, live in zip(self.snapshot, self.state.recurrent_arrays()):
                snap[...] = live
        ids = xp.concatenate([xp.asarray(first, dtype=np.int64).reshape(1), drafts])
        ver = self.forward(Slot.VERIFY, ids, in_place=self.select is None)
        targets = xp.argmax(ver["logits"][0], axis=-1)
        n_dev = accepted_count(xp, drafts, targets)
        host = self.device.read(xp.concatenate([n_dev.reshape(1).astype(np.int64), ids, targets]))
        n = int(host[0])  # host = [n, first, d1..dk, t0..tk]
        return n, [int(t) for t in host[1 : 2 + n]], int(host[k + 2 + n]), ver

    def restore(self) -> None:
        """Put back the recurrent state snapshotted before the verify."""
        for snap, live in zip(self.snapshot, self.state.recurrent_arrays()):
            live[...] = snap

    def commit(self, ver: dict, consumed: list[int], start: int) -> None:
        """Make the state hold exactly `consumed` after position `start` (KV rollback is contents-only)."""
        strategy, n1 = self.run_cfg.commit, len(consumed)
        self.state.length = start
        self.target.rollback(Slot.PRIMARY)
        if strategy == "select":
            self.select(self.state, ver, n1)
        else:
            self.restore()
            if strategy == "readvance-batched":
                self.forward(Slot.PRIMARY, consumed)
            else:
                for j, tok in enumerate(consumed):
                    self.forward(Slot.PRIMARY, [tok])
                    self.state.length = start + j + 1
        self.state.length = start + n1


def check_run_on_model(run: RunConfig, desc) -> None:
    """ValueError, before any session is made, if the run asks what the model cannot do."""
    problems = [
        problem
        for problem in (
            k_problem(run.k, desc.transition_capacity) if desc.transition_capacity else None,
            desc.commit_problem(run.commit),
            capacity_problem(run.prompt_len, run.tokens, run.k, desc.capacity, f"{desc.name}'s KV capacity"),
        )
        if problem is not None
    ]
    if problems:
        raise ValueError("; ".join(problems))
