"""The speculative engine: greedy baseline and MTP speculative decoding on the two-slot executor.

Each speculative step: (1) decode the pending token at M=1 on Slot.PRIMARY -> guaranteed token g;
(2) draft k tokens from (g, hidden); (3) verify [g, d1..dk] at M=k+1 on Slot.VERIFY; (4) accept
the longest exact greedy-match prefix plus one bonus token; (5) commit the recurrent state for
the accepted prefix. KV rollback is contents-only: the logical length shrinks, buffers stay.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import commit as commit_ops
from . import oracle
from .arena import Arena, to_numpy
from .config import RunConfig
from .device import Device, device_for
from .drafters import MtpDrafter, OracleDrafter
from .executor import Executor, Slot, SlotMemory
from .model import Artifact, build_model, preset
from .policy import policy
from .runtime import MtpState, TargetState, mtp_io, target_io


@dataclass
class Greedy:
    tokens: list[int]
    margins: list[float]
    seconds: float
    decodes: int
    logits: list[np.ndarray] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.decodes / self.seconds if self.seconds > 0 else float("nan")


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


def _presize(arena: Arena, feeds, outputs, skip=frozenset()) -> None:
    for name, value in feeds.items():
        if name not in skip:
            arena.reserve(f"feed.{name}", value.shape, value.dtype)
    for name, (shape, dtype) in outputs.items():
        if name not in skip:
            arena.reserve(name, shape, dtype)


def model_for(run: RunConfig) -> Artifact:
    """The built-in model a RunConfig runs: fp16 on CUDA (GroupQueryAttention there is fp16/bf16 only)."""
    return build_model(
        preset(
            run.preset,
            weight_format="int4" if run.int4 else "fp32",
            dtype="fp16" if run.backend == "cuda" else "fp32",
        )
    )


class Engine:
    """Sessions, arenas, executors and state for one RunConfig on one model artifact and device."""

    def __init__(self, run: RunConfig, artifact: Artifact | None = None, device: Device | None = None):
        self.run_cfg = run
        dev = self.device = device or device_for(run.backend, run.max_recaptures, threads=run.threads)
        self.art = artifact or model_for(run)
        self.xp = dev.xp
        cfg = self.cfg = self.art.config
        cfg.check_k(run.k)
        if dev.name == "cuda" and cfg.dtype != "fp16":
            raise ValueError(
                f"{cfg.name} is a {cfg.dtype} build: the CUDA backend needs the fp16 build "
                "(GroupQueryAttention on CUDA is fp16/bf16 only): mtplab model build --dtype fp16"
            )
        pol = self.policy = policy(run.policy)
        self.main = dev.arena("main")
        self.state = TargetState.allocate(cfg, self.main)
        shared = dev.shared_weights(self.art.target) if pol.sibling_session else None
        primary_session = dev.session(self.art.target, shared)
        verify_session = dev.session(self.art.target, shared) if pol.sibling_session else primary_session
        self._shared_weights = shared  # the sessions use these OrtValues in place: keep them alive
        # Largest I/O any slot binds: verify at M=k+1, both recurrent modes.
        big = np.zeros(run.k + 1, dtype=np.int64)
        specs = [target_io(cfg, self.state, big, in_place) for in_place in (True, False)]
        host = dev.host_inputs
        if pol.shared_arena:
            arena = dev.arena("shared")
            if pol.presize:
                for feeds, outputs, _ in specs:
                    _presize(arena, feeds, outputs, skip=host)
            memory = {
                Slot.PRIMARY: SlotMemory(arena, host_inputs=host),
                Slot.VERIFY: SlotMemory(arena, host_inputs=host),
            }
            self.arenas = {"main": self.main, "shared": arena}
        else:
            primary, private = dev.arena("primary"), dev.arena("verify", private=True)
            scoped = frozenset({"logits", "hidden"})
            for feeds, outputs, _ in specs:
                _presize(primary, feeds, outputs, skip=host)
                _presize(private, feeds, outputs, skip=scoped | host)
            memory = {
                Slot.PRIMARY: SlotMemory(primary, host_inputs=host),
                Slot.VERIFY: SlotMemory(
                    private,
                    pool=self.main,
                    step_scoped=scoped,
                    pinned=pol.pin_workspace,
                    owner="verify",
                    host_inputs=host,
                ),
            }
            self.arenas = {"main": self.main, "primary": primary, "verify": private}
        self.target = Executor(
            {Slot.PRIMARY: primary_session, Slot.VERIFY: verify_session},
            memory,
            backend=dev.backend,
            max_recaptures=run.max_recaptures,
            validate=run.validate,
            retain_decode_graph_across_spec=run.retain_decode_graph_across_spec,
        )
        self.mtp_state = MtpState.allocate(cfg, self.main)
        mtp_arena = dev.arena("mtp")
        feeds, outputs, _ = mtp_io(cfg, self.mtp_state, 0, np.zeros(cfg.hidden_size), 0)
        _presize(mtp_arena, feeds, outputs, skip=host)
        self.arenas["mtp"] = mtp_arena
        self.mtp = Executor(
            {Slot.PRIMARY: dev.session(self.art.mtp)},
            {Slot.PRIMARY: SlotMemory(mtp_arena, host_inputs=host)},
            labels={Slot.PRIMARY: "mtp"},
            backend=dev.backend,
            max_recaptures=run.max_recaptures,
            validate=run.validate,
        )
        self.forwards: dict[str, int] = {}
        self.watch = None  # the checked pass looks at every forward's outputs (lossless.Watch)
        self.head = MtpDrafter(cfg, self.mtp, self.mtp_state, self.forwards)
        self.snapshot = [
            self.main.reserve(f"snapshot.{i}", a.shape, a.dtype) for i, a in enumerate(self.state.recurrent_arrays())
        ]
        self.handoff_bytes = cfg.hidden_size * 4
        self.last_hidden = self.main.reserve("last_hidden", (cfg.hidden_size,), np.float32)
        if dev.name == "cuda":
            from .cuda import DeviceReplay

            self.replay_state = DeviceReplay(cfg)
        else:
            self.replay_state = lambda state, flat, n: commit_ops.replay_transitions(cfg, state, flat, n)

    # -- forwards ------------------------------------------------------------------------------
    def forward(self, slot: Slot, tokens, in_place: bool = True, eager: bool = False, label: str | None = None) -> dict:
        """One target forward of `tokens` (ints, or a host or device array) at the current length.

        The caller advances the length.
        """
        if isinstance(tokens, list):
            tokens = np.asarray(tokens, dtype=np.int64)
        feeds, outputs, bound = target_io(self.cfg, self.state, tokens, in_place)
        run = self.target.run_eager if eager else self.target.run
        out = run(slot, feeds, outputs, bound)
        if in_place:
            self.state.carry_conv()
        key = f"{label or self.target.labels[slot]}/M={tokens.size}"
        self.forwards[key] = self.forwards.get(key, 0) + 1
        if self.watch is not None:
            self.watch(key, self.state.length, out)
        return out

    def _start(self, prompt: list[int]) -> dict:
        self.state.reset()
        self.mtp_state.kv[0][...] = 0
        self.mtp_state.kv[1][...] = 0
        self.target.new_generation()
        self.mtp.new_generation()
        out = self.forward(Slot.PRIMARY, prompt, eager=True, label="prefill")
        self.state.length = len(prompt)
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
        xp = self.xp
        out = self._start(prompt)
        row = out["logits"][0, -1]
        tokens, rows = [xp.argmax(row)], [row.copy()][:keep_logits]
        gaps = [oracle.top2_margin_xp(xp, row)] if margins else []
        t0 = time.perf_counter()
        while len(tokens) < n:
            out = self.forward(Slot.PRIMARY, tokens[-1].reshape(1), eager=eager)
            self.state.length += 1
            row = out["logits"][0, 0]
            if len(rows) < keep_logits:
                rows.append(row.copy())
            tokens.append(xp.argmax(row))
            if margins:
                gaps.append(oracle.top2_margin_xp(xp, row))
        if margins:
            host = self.device.read(xp.stack([xp.stack(tokens).astype(np.float64), xp.stack(gaps)]))
        else:
            host = [self.device.read(xp.stack(tokens)), []]
        seconds = time.perf_counter() - t0
        logits = [to_numpy(r) for r in rows]
        return Greedy([int(t) for t in host[0]], [float(m) for m in host[1]], seconds, n - 1, logits)

    # -- speculative ---------------------------------------------------------------------------
    def speculative(
        self, prompt: list[int], n: int, reference: list[int] | None = None, on_commit: Callable | None = None
    ) -> dict:
        """Speculative decoding until at least n tokens; returns tokens and per-step statistics.

        on_commit(step, length), when given, is called after every commit (the checked pass
        compares the committed state there; timed runs pass nothing).

        schedule="decode-verify" (the seed's): each step decodes the pending token at M=1 on
        Primary, drafts from that decode, then verifies [g, d1..dk]. schedule="fused" (vLLM,
        SGLang): no decode; drafts start from the pending token and the hidden state of the last
        committed position, and the verify [pending, d1..dk] yields the next step's hidden state.
        """
        run, cfg, k, xp, dev = self.run_cfg, self.cfg, self.run_cfg.k, self.xp, self.device
        out = self._start(prompt)
        emitted = [int(dev.read(xp.argmax(out["logits"][0, -1])))]
        if run.drafter == "oracle":
            if reference is None:
                raise ValueError("the oracle drafter needs the greedy reference tokens")
            drafter = OracleDrafter(
                reference, run.alpha, run.seed, cfg.vocab_size, None if run.oracle_free_drafts else self.head
            )
        else:
            drafter = self.head
        if run.drafter == "mtp" or not run.oracle_free_drafts:
            drafter.prefill(prompt[1:] + emitted, out["hidden"][0])
        fused = run.schedule == "fused"
        self.last_hidden[...] = out["hidden"][0, -1]
        split = {"decode": 0.0, "draft": 0.0, "verify": 0.0, "commit": 0.0}
        accepted_counts: list[int] = []
        select = run.commit == "select"
        t_start = time.perf_counter()
        while len(emitted) < n:
            t0 = time.perf_counter()
            handoff = self.main.acquire("decode-handoff", self.handoff_bytes)
            view = handoff.carve({"hidden": ((cfg.hidden_size,), np.float32)})
            # Until the step's one read, `first`, the drafts and the targets stay on the device.
            if fused:
                first, position = emitted[-1], self.state.length - 1
                view["hidden"][...] = self.last_hidden
            else:
                L = self.state.length
                dec = self.forward(Slot.PRIMARY, [emitted[-1]])
                self.state.length = L + 1
                view["hidden"][...] = dec["hidden"][0, 0]
                first, position = xp.argmax(dec["logits"][0, 0]), L
            t1 = time.perf_counter()
            if run.drafter == "oracle":
                index = len(emitted) - 1 if fused else len(emitted)  # where `first` is emitted
                drafts = xp.asarray(np.asarray(drafter.draft_at(index, first, view["hidden"], position, k), np.int64))
            else:
                drafts = drafter.draft(first, view["hidden"], position, k)
            t2 = time.perf_counter()
            if not select:
                for snap, live in zip(self.snapshot, self.state.recurrent_arrays()):
                    snap[...] = live
            start = self.state.length
            verify_ids = xp.concatenate([xp.asarray(first, dtype=np.int64).reshape(1), drafts])
            ver = self.forward(Slot.VERIFY, verify_ids, in_place=not select)
            targets = xp.argmax(ver["logits"][0], axis=-1)
            n_dev = accepted_count(xp, drafts, targets)
            host = dev.read(xp.concatenate([n_dev.reshape(1).astype(np.int64), verify_ids, targets]))
            n_acc = int(host[0])  # host = [n_acc, first, d1..dk, t0..tk]
            consumed = [int(t) for t in host[1 : 2 + n_acc]]
            if not fused:
                emitted.append(consumed[0])
            emitted += consumed[1:] + [int(host[k + 2 + n_acc])]
            accepted_counts.append(n_acc)
            if fused:  # the next step drafts from the last committed position's hidden state
                self.last_hidden[...] = ver["hidden"][0, n_acc]
            t3 = time.perf_counter()
            self.commit(ver, consumed, start)
            self.main.release(handoff)
            self.target.end_step()
            t4 = time.perf_counter()
            if on_commit is not None:
                on_commit(len(accepted_counts), self.state.length)
            for name, a, b in (("decode", t0, t1), ("draft", t1, t2), ("verify", t2, t3), ("commit", t3, t4)):
                split[name] += b - a
        return {
            "tokens": emitted,
            "seconds": time.perf_counter() - t_start,
            "accepted": accepted_counts,
            "split": split,
        }

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
            for i in self.cfg.gdn_layer_ids:
                self.replay_state(self.state.gdn[i], ver[f"gdn_transitions.{i}"], n1)
                commit_ops.rebuild_conv(self.state.conv[i], ver[f"conv_input.{i}"], n1)
        else:
            self.restore()
            if strategy == "readvance-batched":
                self.forward(Slot.PRIMARY, consumed)
            else:
                for j, tok in enumerate(consumed):
                    self.forward(Slot.PRIMARY, [tok])
                    self.state.length = start + j + 1
        self.state.length = start + n1
