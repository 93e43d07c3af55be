"""The speculative engine: greedy baseline and MTP speculative decoding on the two-slot executor.

The Engine holds the sessions, slots, arenas and state of one run, and the strategies its config
names (mtplab.engine.strategies): a commit strategy, a drafter, a step schedule, an acceptance rule.
One speculative step (draft, verify on Slot.VERIFY, accept, commit the recurrent state for it) is a
short function per schedule (mtplab.engine.schedules) that calls the Engine's public methods.
KV rollback is contents-only: the logical length shrinks, buffers stay.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import numpy as np

from mtplab.engine import greedy, speculative
from mtplab.engine.batch_commits import commit_rows
from mtplab.engine.drafters import head_executor
from mtplab.engine.fit import check_spec_on_model
from mtplab.engine.forwards import PreparedForward, host_count
from mtplab.engine.greedy import Greedy
from mtplab.engine.k_policies import StepCosts
from mtplab.engine.models import model_for, own_weights
from mtplab.engine.spec import EngineSpec
from mtplab.engine.strategies import ACCEPTANCE, COMMITS
from mtplab.model.batch_form import batch_form
from mtplab.model.description import length_feeds
from mtplab.model.greedy_outputs import ACCEPTED, TOKENS
from mtplab.runtime.device import Device, device_for
from mtplab.runtime.executor import Executor, Slot
from mtplab.runtime.policy import policy, slot_memory
from mtplab.runtime.sessions import refused_run
from mtplab.runtime.state import MtpState, TargetState, checked_length, fixed_io, target_io


class Engine:
    """Sessions, arenas, executors and state for one EngineSpec on one model and device."""

    def __init__(self, spec, artifact=None, device: Device | None = None):
        """spec: an EngineSpec, or a run configuration that gives one (RunConfig.engine_spec())."""
        run = self.spec = spec if isinstance(spec, EngineSpec) else spec.engine_spec()
        dev = self.device = device or device_for(run.backend, run.max_recaptures, threads=run.threads,
                                                 plans=run.k if run.plan_per_shape else 1)
        self.art = artifact or model_for(run)
        # its states in place where the device's kernels allow it (the builder's LinearAttention state on the CPU)
        desc = self.art.description.on_provider(dev.provider_name)
        self.cfg = desc.config  # the built-in model's ModelConfig (None for other models)
        check_spec_on_model(run, desc)
        # a builder folder's graphs at batch > 1: mtplab's copies that take each row's query length
        desc = batch_form(desc) if run.batch > 1 else desc
        pol = self.policy = policy(run.policy)
        # a commit whose verify writes outputs of its own (decodes apart: Primary runs the form's decode_target)
        desc = self.desc = COMMITS.get(run.commit).form(desc, pol.sibling_session, run.batch)
        dev.check_model(desc)
        self.xp = dev.xp
        self.main = dev.arena("main")
        B = self.batch = run.batch  # rows decoded together (mtplab.engine.speculative decodes every batch size)
        self.state = TargetState.allocate(desc, self.main, batch=B)
        shared = dev.shared_weights(desc.target.path) if pol.sibling_session else None
        # With a session of its own, Primary runs the graph before mtplab's copy (own_graph): a user's graph at batch 1
        # (it runs no [B, M > 1] forward after a past, mtplab.model.batch_form), a form's decode_target at every batch.
        own = desc.own_graph() if pol.sibling_session and (B == 1 or desc.decode_target is not None) else None
        self.primary_desc = own or desc
        if pol.sibling_session:  # Primary's session of its own verifies nothing: its greedy tokens, no count
            self.primary_desc = dataclasses.replace(
                self.primary_desc, target=dataclasses.replace(self.primary_desc.target, counts=False))
        primary_session = dev.session(self.primary_desc.target, own_weights(shared, own))
        verify_session = dev.session(desc.target, shared) if pol.sibling_session else primary_session
        self._shared_weights = shared  # the sessions use these OrtValues in place: keep them alive
        # Largest I/O a slot binds: M=k+1, both recurrent modes, on the slot's graph.
        big = np.zeros((B, run.k + 1), dtype=np.int64)
        def largest(d):
            return [target_io(d, self.state, big, in_place) for in_place in (True, False)]

        memory, arenas = slot_memory(pol, dev, self.main, largest(desc), dev.host_inputs,
                                     frozenset({desc.target.logits, desc.target.hidden, TOKENS, ACCEPTED}),
                                     largest(self.primary_desc) if pol.sibling_session else None)
        self.arenas = {"main": self.main, **arenas}
        self.target = Executor(
            {Slot.PRIMARY: primary_session, Slot.VERIFY: verify_session},
            memory,
            backend=dev.backend,
            max_recaptures=run.max_recaptures,
            validate=run.validate,
            retain_decode_graph_across_spec=run.retain_decode_graph_across_spec,
            plan_per_shape=run.plan_per_shape,
        )
        self.mtp_state = MtpState.allocate(desc, self.main, batch=B)
        self.mtp, draft_io = head_executor(desc, dev, self.mtp_state, run, self.arenas)
        self.forwards: dict[str, int] = {}
        self.drafter_memory: dict = {}  # what a drafter keeps between this engine's runs (the mixture's target rows)
        self._keys: dict[tuple, str] = {}  # forward counter names by (slot, label, M)
        self._prepared_runs: dict[tuple, PreparedForward] = {}  # forward()'s prepared runs by (slot, M, in_place, label)
        io = desc.target
        self._roles = (io.logits, io.hidden) if (io.logits, io.hidden) != ("logits", "hidden") else ()
        self.watch = None  # the checked pass looks at every forward's outputs (lossless.Watch)
        self.opened = float("nan")  # perf_counter at the end of the last run's untimed setup (prefill)
        # perf_counter at the start of the first target forward after that setup, and at the end of the last one
        self.first_forward: float | None = None
        self.last_forward: float | None = None
        self.acceptance = ACCEPTANCE.get(run.acceptance).for_run(run, self.xp)
        self.k_costs: StepCosts | None = None  # what a draft-length policy prices a step at K with (the calibration's)
        self.snapshot = [
            self.main.reserve(f"snapshot.{i}", a.shape, a.dtype) for i, a in enumerate(self.state.recurrent_arrays())
        ]
        # each row's hidden state at its last committed position (the fused schedule drafts from it)
        self.last_hidden = self.main.reserve("last_hidden", (B, desc.hidden_size), np.float32)
        self._handoff = None  # the step's hidden-state block from the shared pool, given back at end_step
        self._handoff_views: dict = {}  # its [B, H] view, by block
        self._prepared: dict = {}  # each commit strategy's prepared commit, by name
        self.use_commit(run.commit)
        self._warm_up(draft_io)

    def _warm_up(self, draft_io: tuple) -> None:
        """Primary's and the MTP head's warm-ups (Status.NEEDS_WARMUP's run) now, each its session's first run, at
        the one token a decode or a draft runs (draft_io: mtp_io's one draft step at position 0); the state reset
        after them. onnxruntime's CPU memory keeps the layout of a session's first run: after a prefill's, decodes
        run slower for the session's life (benchmarks/forward_gap.py). A graph that does not run leaves its slot to
        warm up later: its prefill tells why in one line; a model whose head does not run still decodes greedily."""
        tokens = np.zeros((self.batch, 1) if self.batch > 1 else 1, dtype=np.int64)
        self.target.warm_up(Slot.PRIMARY, *target_io(self.primary_desc, self.state, tokens, False))
        self.mtp.warm_up(Slot.PRIMARY, *draft_io)
        self.new_generation()

    # -- the run's strategies ------------------------------------------------------------------
    @property
    def k(self) -> int:
        return self.spec.k

    def use_commit(self, name: str) -> None:
        """Commit with the registered strategy `name` from now on (the calibration times each in turn)."""
        strategy = COMMITS.get(name)
        if problem := strategy.refusal(self.desc):
            raise ValueError(problem)
        # prepared once per engine (select's replay graph is a session of its own)
        self.commit_strategy = strategy
        self.commit_rows = self.prepared(name, commit_rows)

    def prepared(self, key, build: Callable):
        """What build(self) makes, made once per engine under key (a commit strategy's prepared commit)."""
        if key not in self._prepared:
            self._prepared[key] = build(self)
        return self._prepared[key]

    @property
    def primary_runs_copy(self) -> bool:
        """The Primary slot runs mtplab's copy of the graph (one session for both slots): a builder graph's with
        select's outputs, or a commit's own (per-position's), not the graph before it."""
        copied = self.desc.original_target is not None or self.desc.decode_target is not None
        return copied and self.primary_desc.target.path == self.desc.target.path

    # -- forwards ------------------------------------------------------------------------------
    def forward(self, slot: Slot, tokens, in_place: bool = True, eager: bool = False, label: str | None = None) -> dict:
        """One target forward of `tokens` (an int, ints, or a host or device array) at the current length.

        Returns the outputs by role: "logits", "hidden", and the graph's own names for the rest (the arrays are the
        slot's buffers: the next forward may overwrite them). The caller advances the length. Host tokens outside an
        eager run take a path prepared once per slot, M and mode (PreparedForward); each run decides as Executor.run.
        """
        M = 0 if eager else host_count(tokens, self.batch)
        if M:  # host tokens, run from the slot's plan: the feeds and the replay prepared once
            hot = self._prepared_forward(slot, M, in_place, label)
            hot.ids[...] = tokens
            return self._run_prepared(hot)
        if self.first_forward is None:
            self.first_forward = time.perf_counter()
        if isinstance(tokens, (bool, np.bool_)):
            raise ValueError(f"a forward takes token ids (integers), got {tokens!r}")
        if isinstance(tokens, (list, tuple, int, np.integer)):
            tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim == 0:  # one token
            tokens = tokens.reshape(1)
        state = self.state
        feeds, outputs, bound = target_io(self.primary_desc if slot is Slot.PRIMARY else self.desc, state, tokens,
                                          in_place)
        run = self.target.run_eager if eager else self.target.run
        out = run(slot, feeds, outputs, bound)
        if in_place:
            state.carry()
        return self._after_forward(self.forward_key(slot, tokens.shape[-1], label), out)

    def _prepared_forward(self, slot: Slot, M: int, in_place: bool, label: str | None = None) -> PreparedForward:
        """The prepared forward of M host tokens on a slot and mode (made again when the state's buffers or the
        executor change): write its `ids`, then _run_prepared it. The forward starts here (first_forward)."""
        if self.first_forward is None:  # one clock read per forward on the common path (the end stamp in _after_forward)
            self.first_forward = time.perf_counter()
        state = self.state
        hot = self._prepared_runs.get((slot, M, in_place, label))
        if hot is None or hot.state is not state or hot.executor is not self.target or hot.layout != state.layout():
            hot = self._prepared_runs[(slot, M, in_place, label)] = self._make_forward(slot, M, in_place, label)
        return hot

    def _run_prepared(self, hot: PreparedForward) -> dict:
        """One run of a prepared forward whose token ids are written, at the current length: its length feeds, the
        slot's replayer (it decides as Executor.run does), the carries, and forward()'s bookkeeping; the outputs in a
        dict of their own, as Executor.run returns them."""
        length_feeds(hot.io, checked_length(self.desc, self.state, hot.M), hot.M, self.desc.capacity, hot.feeds)
        out = dict(hot.run())
        for committed, present in hot.carries:
            committed[...] = present
        return self._after_forward(hot.key, out)

    def _after_forward(self, key: str, out: dict) -> dict:
        """forward()'s bookkeeping after a run: the outputs by role, the counter, the watch, the end stamp."""
        if self._roles:  # the graph names its outputs otherwise
            out = self.by_role(out)
        self.forwards[key] = self.forwards.get(key, 0) + 1
        if self.watch is not None:  # the position: a batch's longest row
            self.watch(key, self.state.length if self.batch == 1 else int(self.state.lengths.max()), out)
        self.last_forward = time.perf_counter()
        return out

    def _make_forward(self, slot: Slot, M: int, in_place: bool, label: str | None) -> PreparedForward:
        """forward()'s run of M host tokens on a slot and mode: target_io's feeds and the slot's replayer on them,
        valid while the state's buffers stay."""
        desc = self.primary_desc if slot is Slot.PRIMARY else self.desc
        feeds, outputs, bound = fixed_io(desc, self.state, M, in_place)
        io = desc.target
        ids = feeds[io.input_ids]
        return PreparedForward(self.state, self.target, self.state.layout(), io, feeds, ids, M,
                               self.target.replayer(slot, feeds, outputs, bound),
                               tuple(self.state.carries()) if in_place else (), self.forward_key(slot, M, label))

    def one_sequence(self) -> None:
        """ValueError unless the engine holds one row: the calls that decode one sequence."""
        if self.batch > 1:
            raise ValueError(f"this engine holds batch={self.batch} rows: decode them with "
                             "mtplab.engine.greedy.decode_rows and mtplab.engine.speculative.generate (prompts [B, P]); "
                             "Engine.greedy and Engine.speculative decode one sequence")

    def start(self, prompt: list[int]) -> dict:
        """A new generation: state and plans reset, the prompt prefilled (eager, untimed); the prefill's outputs."""
        self.one_sequence()
        self.new_generation()
        out = self.prefill(prompt)
        self.state.length = len(prompt)
        self.setup_done()
        return out

    def prefill(self, tokens) -> dict:
        """The prompt's forward on Slot.PRIMARY, eager, at the current length: a generation's first forward, where a
        graph that does not run with the buffers its description gives (a head count that disagrees with its
        widths, say) is told in one line (ValueError), not an onnxruntime traceback."""
        try:
            return self.forward(Slot.PRIMARY, tokens, eager=True, label="prefill")
        except RuntimeError as err:  # onnxruntime's errors; mtplab's own are ValueErrors
            raise refused_run(f"{self.desc.name}'s prefill", err) from err

    def new_generation(self) -> None:
        """Every row's state, the head's KV and both executors' plans reset; the acceptance rule told."""
        self.state.reset()
        self.mtp_state.kv[0][...] = 0
        self.mtp_state.kv[1][...] = 0
        self.target.new_generation()
        self.mtp.new_generation()
        self.acceptance.new_generation()

    def setup_done(self) -> None:
        """The untimed setup (prefills) ends here, its queued work done (Device.sync): the audit holds timed windows
        to it; forward stamps start over."""
        self.device.sync()
        self.opened = time.perf_counter()
        self.first_forward = self.last_forward = None

    # -- greedy --------------------------------------------------------------------------------
    def greedy(
        self, prompt: list[int], n: int, eager: bool = False, keep_logits: int = 0, margins: bool = True
    ) -> Greedy:
        """Greedy decoding of n tokens at M=1 on Slot.PRIMARY (mtplab.engine.greedy.decode)."""
        return greedy.decode(self, prompt, n, eager, keep_logits, margins)

    def _decoder(self, eager: bool) -> tuple[Callable[[], dict], object, dict]:
        """Greedy's M=1 forward on Slot.PRIMARY as a call on fixed feeds: (run, the token ids [B, 1] the next
        tokens are written into, the feeds whose length entries the caller rewrites before each run).

        The same forward as forward(Slot.PRIMARY, [token]) (on the feeds target_io keeps for M=1), less its
        bookkeeping, which the caller does. On the device the ids are a device array of their own: the loop never
        waits for the device."""
        B = self.batch
        feeds, outputs, bound = target_io(self.primary_desc, self.state,
                                          np.zeros((B, 1) if B > 1 else 1, dtype=np.int64))
        name = self.primary_desc.target.input_ids
        ids = feeds[name]
        if self.xp is not np:
            ids = self.xp.zeros((B, 1), dtype=np.int64)
            feeds = {**feeds, name: ids}
        if eager:
            return functools.partial(self.target.run_eager, Slot.PRIMARY, feeds, outputs, bound), ids, feeds
        return self.target.replayer(Slot.PRIMARY, feeds, outputs, bound), ids, feeds

    def forward_key(self, slot: Slot, M: int, label: str | None = None) -> str:
        """The forward counter's name, "label/M=m"."""
        key = self._keys.get((slot, label, M))
        if key is None:
            key = self._keys[(slot, label, M)] = f"{label or self.target.labels[slot]}/M={M}"
        return key

    def by_role(self, out: dict) -> dict:
        """A forward's outputs, with "logits" and "hidden" too where the graph names them otherwise."""
        if not self._roles:
            return out
        return {**out, "logits": out[self._roles[0]], "hidden": out[self._roles[1]]}

    # -- speculative ---------------------------------------------------------------------------
    def speculative(
        self, prompt: list[int], n: int, reference: list[int] | None = None, on_commit: Callable | None = None
    ) -> dict:
        """Speculative decoding of one sequence until at least n tokens (mtplab.engine.speculative.generate, its batch
        of one): tokens, seconds, accepted counts and drafts per step ("k": what the draft-length policy chose, or
        fewer where the drafter stopped early), the phases' time split and when the timed window opened.
        on_commit(step, length, emitted, drafted), when given, is called after every commit (drafted: the drafts its
        verify judged)."""
        self.one_sequence()
        told = None if on_commit is None else (
            lambda step, rows, emitted, ks: on_commit(step, self.state.length, emitted[0], ks[0][-1]))
        out = speculative.generate(self, np.asarray([prompt], dtype=np.int64), n,
                                   None if reference is None else [reference], told)
        return {"tokens": out.tokens[0], "seconds": out.seconds, "accepted": out.accepted[0], "k": out.ks[0],
                "split": out.split, "started": out.started}

    def begin_step(self, hidden=None):
        """The step's hidden-state handoff buffer [B, H] (what its drafts start from), from the main arena's shared
        pool until end_step; `hidden` copied in if given."""
        block = self._handoff = self.main.acquire("decode-handoff", self.batch * self.desc.hidden_size * 4)
        buf = self._handoff_views.get(block)
        if buf is None:  # carved once per block: a block's memory never moves
            buf = self._handoff_views[block] = block.carve(
                {"hidden": ((self.batch, self.desc.hidden_size), np.float32)})["hidden"]
        if hidden is not None:
            buf[...] = hidden
        return buf

    def end_step(self) -> None:
        """Give the handoff buffer back and tell the executor the step is over."""
        if self._handoff is not None:
            self.main.release(self._handoff)
            self._handoff = None
        self.target.end_step()

    def commit(self, ver: dict | None, counts: np.ndarray, rows, ids: np.ndarray, start: np.ndarray) -> None:
        """Make each listed row's state hold its first counts[b] verify tokens (ids[b]) after position start[b], with
        the run's commit strategy (row by row: mtplab.engine.batch_commits); KV rollback is contents-only."""
        self.state.lengths[...] = start
        self.target.rollback(Slot.PRIMARY)
        self.commit_rows(ver, counts, rows, ids, start)
        self.state.lengths[...] = start + counts

    def save_state(self) -> None:
        """Snapshot the recurrent state (before a verify that advances it in place)."""
        for snap, live in zip(self.snapshot, self.state.recurrent_arrays()):
            snap[...] = live

    def restore_state(self) -> None:
        """Put back the recurrent state of the last save_state."""
        for snap, live in zip(self.snapshot, self.state.recurrent_arrays()):
            live[...] = snap
