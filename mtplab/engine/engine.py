"""The speculative engine: greedy baseline and MTP speculative decoding on the two-slot executor.

The Engine holds the sessions, slots, arenas and state of one run, and the strategies its config
names (mtplab.engine.strategies): a commit strategy, a drafter, a step schedule, an acceptance rule.
One speculative step (draft, verify on Slot.VERIFY, accept, commit the recurrent state for it) is a
short function per schedule (mtplab.engine.schedules) that calls the Engine's public methods.
KV rollback is contents-only: the logical length shrinks, buffers stay.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from mtplab.engine.acceptance import accepts_by_argmax, chooses_argmax, top2_margin_xp
from mtplab.engine.drafters import Drafter, MtpDrafter
from mtplab.engine.fit import check_run_on_model
from mtplab.engine.schedules import Phases
from mtplab.engine.strategies import ACCEPTANCE, COMMITS, DRAFTERS, SCHEDULES
from mtplab.model import PRESETS, build_model, preset_config
from mtplab.model.description import GraphIO, beyond_capacity, length_feeds
from mtplab.runtime import held_meta, hot_loop
from mtplab.runtime.arena import to_numpy
from mtplab.runtime.device import Device, device_for
from mtplab.runtime.executor import Executor, Slot, SlotMemory, Status
from mtplab.runtime.policy import policy, presize, slot_memory
from mtplab.runtime.sessions import MtpState, TargetState, checked_length, fixed_io, mtp_io, refused_run, target_io

if TYPE_CHECKING:  # the config sits above the engine: the engine reads its fields only
    from mtplab.experiment.config import RunConfig


@dataclass
class Greedy:
    tokens: list[int]
    margins: list[float]
    seconds: float
    decodes: int
    logits: list[np.ndarray] = field(default_factory=list)
    started: float = float("nan")  # perf_counter when the timed window opened


class HotForward(NamedTuple):
    """A target forward of M host tokens on one slot and mode, prepared for one state and executor while the state's
    buffers stay (`layout`): the feeds target_io keeps (the token ids and the length feeds rewritten per run), the
    slot's replayer on them (it decides as Executor.run does), the carries an in-place run makes, the counter's name."""

    state: TargetState
    executor: Executor
    layout: int
    io: GraphIO
    feeds: dict
    ids: np.ndarray
    row: np.ndarray  # ids[0]: the first row's [M] (a view)
    M: int
    run: Callable[[], dict]
    carries: tuple
    key: str


def host_count(tokens, batch: int) -> int:
    """M for host tokens a forward writes straight into its token ids (an int, a list or tuple of ints at batch 1,
    a numpy array [M] at batch 1 or [batch, M]); 0 for anything else (a device array, a wrong count), which
    target_io takes or refuses."""
    kind = type(tokens)
    if kind is np.ndarray:
        if tokens.ndim == 2 and tokens.shape[0] == batch or tokens.ndim == 1 and batch == 1:
            return tokens.shape[-1]
        return 0
    if batch != 1:
        return 0
    if kind is list or kind is tuple:  # flat: a nested list is target_io's to read or refuse
        return len(tokens) if tokens and not any(map(_nested, tokens)) else 0
    return 1 if kind is int or isinstance(tokens, np.integer) else 0


def _nested(token) -> bool:
    return isinstance(token, (list, tuple, np.ndarray))


@functools.cache
def cpu_kernel_present() -> bool:
    """Whether this onnxruntime's CPU EP runs GatedDeltaNet (probed once per process)."""
    from mtplab.model.forms import cpu_runs_gated_delta_net

    return cpu_runs_gated_delta_net()


def model_for(run: RunConfig):
    """The model a RunConfig runs: a preset's build (fp16 on CUDA: GroupQueryAttention there is fp16/bf16
    only), or the folder `run.model` names (builder output, or an mtplab artifact)."""
    spec = run.model
    if spec not in PRESETS:
        from mtplab.model.folders import open_model

        return open_model(spec)
    if run.backend == "cpu" and not cpu_kernel_present():
        import onnxruntime

        raise ValueError(
            f"onnxruntime {onnxruntime.__version__} has no CPU GatedDeltaNet kernel, which the built-in model needs "
            "(the 1.30 and 1.31 CPU wheels hold its schema only): install onnxruntime>=1.32, or run --backend cuda "
            "with onnxruntime-gpu"
        )
    return build_model(preset_config(spec, run.int4, dtype="fp16" if run.backend == "cuda" else "fp32"))


class Engine:
    """Sessions, arenas, executors and state for one RunConfig on one model and device."""

    def __init__(self, run: RunConfig, artifact=None, device: Device | None = None):
        self.run_cfg = run
        dev = self.device = device or device_for(run.backend, run.max_recaptures, threads=run.threads)
        self.art = artifact or model_for(run)
        # its states in place where the device's kernels allow it (the builder's LinearAttention state on the CPU)
        desc = self.desc = self.art.description.on_provider(dev.provider_name)
        self.cfg = desc.config  # the built-in model's ModelConfig (None for other models)
        check_run_on_model(run, desc)
        dev.check_model(desc)
        self.xp = dev.xp
        pol = self.policy = policy(run.policy)
        self.main = dev.arena("main")
        B = self.batch = run.batch  # rows decoded together (mtplab.engine.batch runs B > 1)
        self.state = TargetState.allocate(desc, self.main, batch=B)
        shared = dev.shared_weights(self.art.target) if pol.sibling_session else None
        # With a session of its own, Primary runs the user's graph where the target is mtplab's copy (own_graph).
        own = desc.own_graph() if pol.sibling_session else None
        self.primary_desc = own or desc
        primary_session = dev.session(self.primary_desc.target.path, own_weights(shared, own))
        verify_session = dev.session(self.art.target, shared) if pol.sibling_session else primary_session
        self._shared_weights = shared  # the sessions use these OrtValues in place: keep them alive
        # Largest I/O a slot binds: M=k+1, both recurrent modes, on the slot's graph.
        big = np.zeros((B, run.k + 1), dtype=np.int64)
        def largest(d):
            return [target_io(d, self.state, big, in_place) for in_place in (True, False)]

        memory, arenas = slot_memory(pol, dev, self.main, largest(desc), dev.host_inputs,
                                     frozenset({desc.target.logits, desc.target.hidden}), own and largest(own))
        self.arenas = {"main": self.main, **arenas}
        self.target = Executor(
            {Slot.PRIMARY: primary_session, Slot.VERIFY: verify_session},
            memory,
            backend=dev.backend,
            max_recaptures=run.max_recaptures,
            validate=run.validate,
            retain_decode_graph_across_spec=run.retain_decode_graph_across_spec,
        )
        self.mtp_state = MtpState.allocate(desc, self.main, batch=B)
        mtp_arena = self.arenas["mtp"] = dev.arena("mtp")
        position = 0 if B == 1 else np.zeros(B, dtype=np.int64)
        draft_io = mtp_io(desc, self.mtp_state, np.zeros(B, np.int64), np.zeros((B, desc.hidden_size)), position)
        presize(mtp_arena, draft_io[0], draft_io[1], skip=dev.host_inputs)
        # the head's commit (M=k+1: its KV rows for the verified tokens) on a slot and arena of its own
        commit_arena = self.arenas["mtp-commit"] = dev.arena("mtp-commit")
        commit_io = mtp_io(desc, self.mtp_state, np.zeros((B, run.k + 1), np.int64),
                           np.zeros((B, run.k + 1, desc.hidden_size)), position)
        presize(commit_arena, commit_io[0], commit_io[1], skip=dev.host_inputs)
        head_session = dev.session(self.art.mtp)
        self.mtp = Executor(
            {Slot.PRIMARY: head_session, Slot.VERIFY: head_session},
            {Slot.PRIMARY: SlotMemory(mtp_arena, host_inputs=dev.host_inputs),
             Slot.VERIFY: SlotMemory(commit_arena, host_inputs=dev.host_inputs)},
            labels={Slot.PRIMARY: "mtp", Slot.VERIFY: "mtp-commit"},
            backend=dev.backend,
            max_recaptures=run.max_recaptures,
            validate=run.validate,
        )
        self.forwards: dict[str, int] = {}
        self.drafter_memory: dict = {}  # what a drafter keeps between this engine's runs (the mixture's target rows)
        self.prompt: list[int] = []  # the speculative generation in progress: its prompt and emitted tokens so far
        self.emitted: list[int] = []
        self._keys: dict[tuple, str] = {}  # forward counter names by (slot, label, M)
        self._hot: dict[tuple, HotForward] = {}  # forward()'s prepared runs by (slot, M, in_place, label)
        io = desc.target
        self._roles = (io.logits, io.hidden) if (io.logits, io.hidden) != ("logits", "hidden") else ()
        self.watch = None  # the checked pass looks at every forward's outputs (lossless.Watch)
        self.opened = float("nan")  # perf_counter at the end of the last run's untimed setup (prefill)
        # perf_counter at the start of the first target forward after that setup, and at the end of the last one
        self.first_forward: float | None = None
        self.last_forward: float | None = None
        self.acceptance = ACCEPTANCE.get(run.acceptance).for_run(run, self.xp)
        self.head = MtpDrafter(desc, self.mtp, self.mtp_state, self.forwards, self.acceptance.draft_token)
        self.snapshot = [
            self.main.reserve(f"snapshot.{i}", a.shape, a.dtype) for i, a in enumerate(self.state.recurrent_arrays())
        ]
        self._handoff_bytes = desc.hidden_size * 4
        self._handoff = None  # the step's hidden-state block from the shared pool, given back at end_step
        self._handoff_views: dict = {}  # its hidden-state view, by block
        self.last_hidden = self.main.reserve("last_hidden", (desc.hidden_size,) if B == 1 else (B, desc.hidden_size),
                                             np.float32)
        self._verify_start = 0
        self._verify_buffers: dict = {}  # by k: the verify's token ids (a device's) and the step's packed read
        self._prepared: dict = {}  # each commit strategy's prepared commit, by name
        self._programs: dict = {}  # compiled loops' programs (mtplab.runtime.hot_loop), with the check they read
        self.compiled_loops = True  # sets _compiled_loops and _accepts_argmax
        self.use_commit(run.commit)
        self._warm_up(draft_io)

    def _warm_up(self, draft_io: tuple) -> None:
        """Primary's and the MTP head's warm-ups (Status.NEEDS_WARMUP's run) now, each its session's first run, at
        the one token a decode or a draft runs (draft_io: mtp_io's one draft step at position 0); the state reset
        after them.

        onnxruntime's CPU memory keeps the layout of a session's first run: where that was a prompt's prefill, the
        builder fixture's decodes ran 4-6% slower for the session's life (benchmarks/forward_gap.py). A graph that
        does not run leaves its slot to warm up later: its prefill tells why in one line, and a model whose head
        does not run still decodes greedily.
        """
        tokens = np.zeros((self.batch, 1) if self.batch > 1 else 1, dtype=np.int64)
        self.target.warm_up(Slot.PRIMARY, *target_io(self.primary_desc, self.state, tokens, False))
        self.mtp.warm_up(Slot.PRIMARY, *draft_io)
        self.new_generation()

    # -- the run's strategies ------------------------------------------------------------------
    @property
    def k(self) -> int:
        return self.run_cfg.k

    @property
    def compiled_loops(self) -> bool:
        """Whether greedy's timed decodes and the MTP head's drafts may run compiled between replays
        (mtplab.runtime.hot_loop); False keeps them in Python (a benchmark's side by side), the head's included."""
        return self._compiled_loops

    @compiled_loops.setter
    def compiled_loops(self, on: bool) -> None:
        self._compiled_loops = self.head.compiled = on
        # greedy-match's own accept on host arrays: the verify's verdict compiled too (held_meta.accept_argmax)
        self._accepts_argmax = on and self.xp is np and accepts_by_argmax(self.acceptance.accept)

    @property
    def length(self) -> int:
        """Tokens the target's state holds."""
        return self.state.length

    def use_commit(self, name: str) -> None:
        """Commit with the registered strategy `name` from now on (the calibration times each in turn)."""
        strategy = COMMITS.get(name)
        if problem := strategy.refusal(self.desc):
            raise ValueError(problem)
        # prepared once per engine (select's replay graph is a session of its own)
        self.commit_strategy, self._commit = strategy, self.prepared(name, strategy.prepare)

    def prepared(self, key, build: Callable):
        """What build(self) makes, made once per engine under key (a commit strategy's prepared commit)."""
        if key not in self._prepared:
            self._prepared[key] = build(self)
        return self._prepared[key]

    @property
    def primary_runs_copy(self) -> bool:
        """The Primary slot runs mtplab's copy of a builder graph (one session for both slots), not the user's."""
        return self.desc.original_target is not None and self.primary_desc is self.desc

    # -- forwards ------------------------------------------------------------------------------
    def forward(self, slot: Slot, tokens, in_place: bool = True, eager: bool = False, label: str | None = None) -> dict:
        """One target forward of `tokens` (an int, ints, or a host or device array) at the current length.

        Returns the outputs by role: "logits", "hidden", and the graph's own names for the rest (the arrays are the
        slot's buffers: the next forward may overwrite them). The caller advances the length. Host tokens outside an
        eager run take a path prepared once per slot, M and mode (HotForward); each run decides as Executor.run.
        """
        M = 0 if eager else host_count(tokens, self.batch)
        if M:  # host tokens, run from the slot's plan: the feeds and the replay prepared once
            hot = self._hot_forward(slot, M, in_place, label)
            hot.ids[...] = tokens
            return self._run_hot(hot)
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
        return self._ran(self._key(slot, tokens.shape[-1], label), out)

    def _hot_forward(self, slot: Slot, M: int, in_place: bool, label: str | None = None) -> HotForward:
        """The prepared forward of M host tokens on a slot and mode (made again when the state's buffers or the
        executor change): write its `ids`, then _run_hot it. The forward starts here (first_forward)."""
        if self.first_forward is None:  # one clock read per forward on the common path (the end stamp in _ran)
            self.first_forward = time.perf_counter()
        state = self.state
        hot = self._hot.get((slot, M, in_place, label))
        if hot is None or hot.state is not state or hot.executor is not self.target or hot.layout != state.layout():
            hot = self._hot[(slot, M, in_place, label)] = self._prepare_forward(slot, M, in_place, label)
        return hot

    def _run_hot(self, hot: HotForward, own: bool = True) -> dict:
        """One run of a prepared forward whose token ids are written, at the current length: its length feeds, the
        slot's replayer (it decides as Executor.run does), the carries, and forward()'s bookkeeping. own: the
        outputs in a dict of their own, as Executor.run returns them; else a replay's is the slot's (read it, never
        change it)."""
        length_feeds(hot.io, checked_length(self.desc, self.state, hot.M), hot.M, self.desc.capacity, hot.feeds)
        out = dict(hot.run()) if own else hot.run()
        for committed, present in hot.carries:
            committed[...] = present
        return self._ran(hot.key, out)

    def _ran(self, key: str, out: dict) -> dict:
        """forward()'s bookkeeping after a run: the outputs by role, the counter, the watch, the end stamp."""
        if self._roles:  # the graph names its outputs otherwise
            out = self._by_role(out)
        self.forwards[key] = self.forwards.get(key, 0) + 1
        if self.watch is not None:  # the position: a batch's longest row
            self.watch(key, self.state.length if self.batch == 1 else int(self.state.lengths.max()), out)
        self.last_forward = time.perf_counter()
        return out

    def _prepare_forward(self, slot: Slot, M: int, in_place: bool, label: str | None) -> HotForward:
        """forward()'s run of M host tokens on a slot and mode: target_io's feeds and the slot's replayer on them,
        valid while the state's buffers stay."""
        desc = self.primary_desc if slot is Slot.PRIMARY else self.desc
        feeds, outputs, bound = fixed_io(desc, self.state, M, in_place)
        io = desc.target
        ids = feeds[io.input_ids]
        return HotForward(self.state, self.target, self.state.layout(), io, feeds, ids, ids[0], M,
                          self.target.replayer(slot, feeds, outputs, bound),
                          tuple(self.state.carries()) if in_place else (), self._key(slot, M, label))

    def start(self, prompt: list[int]) -> dict:
        """A new generation: state and plans reset, the prompt prefilled (eager, untimed); the prefill's outputs."""
        if self.batch > 1:
            raise ValueError(f"this engine holds batch={self.batch} rows: decode them with mtplab.engine.batch "
                             "(greedy, speculative); Engine.greedy and Engine.speculative decode one sequence")
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
        """Greedy decoding of n tokens at M=1 on Slot.PRIMARY.

        Tokens and margins stay on the device until the end: the loop never waits for it (each
        argmax feeds the next decode directly). eager=True runs every decode outside the slot's plan.
        keep_logits=m keeps the first m logits rows (prefill's last, then each decode) for the anchor.
        margins=False skips the top-2 margins (a timed run: the decoder it measures computes none).
        Time starts after the prefill; `decodes` = n - 1 tokens are timed (the first is the prefill's).
        """
        xp, capacity = self.xp, self.desc.capacity
        if len(prompt) + n - 1 > capacity:
            raise beyond_capacity(len(prompt) + n - 1, capacity)
        out = self.start(prompt)
        row = out["logits"][0, -1]
        tokens, rows = [self.acceptance.token(xp, row)], [row.copy()][:keep_logits]
        gaps = [top2_margin_xp(xp, row)] if margins else []
        decoder = self._decoder(eager) if n > 1 else None
        t0 = time.perf_counter()
        if decoder is not None:
            self._decode_greedily(decoder, tokens, rows, gaps, n, keep_logits, margins)
        if xp is np:  # host scalars: one array from the list (np.stack makes an array of each first)
            host = [self.device.read(np.array(tokens)), np.array(gaps)]
        elif margins:
            host = self.device.read(xp.stack([xp.stack(tokens).astype(np.float64), xp.stack(gaps)]))
        else:
            host = [self.device.read(xp.stack(tokens)), []]
        seconds = time.perf_counter() - t0
        logits = [to_numpy(r) for r in rows]
        return Greedy([int(t) for t in host[0]], [float(m) for m in host[1]], seconds, n - 1, logits, t0)

    def _decode_greedily(self, decoder, tokens: list, rows: list, gaps: list, n: int, keep_logits: int,
                         margins: bool) -> None:
        """Greedy's timed decodes, on a _decoder: each token decoded at M=1 and the next chosen, until there are n
        (the kept logits rows and the margins too); the forward stamps and counts as Engine.forward keeps them."""
        xp, state, choose, watch = self.xp, self.state, self.acceptance.token, self.watch
        decode, ids, feeds = decoder
        io, capacity, key = self.primary_desc.target, self.desc.capacity, self._key(Slot.PRIMARY, 1)
        logits, carries, done = io.logits, state.carries(), 0
        # the timed loop's decodes, compiled between two replays (mtplab.runtime.hot_loop) where nothing else looks,
        # tried once the plan is captured (READY), twice at most
        plain = self.compiled_loops and getattr(decode, "plain", False) and watch is None and not margins and (
            chooses_argmax(choose) and len(rows) >= keep_logits)
        tries = 2 if plain else 0
        slot = self.target.state[Slot.PRIMARY]
        self.first_forward = time.perf_counter()
        try:
            while len(tokens) < n:
                if tries and slot.status is Status.READY:
                    before, length = slot.replays, state.length
                    try:
                        self._chain_greedily(tokens, n)
                    finally:  # its decodes are its replays, each one token longer (kept true when a replay raises)
                        done += slot.replays - before
                        state.length = length + slot.replays - before
                    tries = 0 if slot.replays > before else tries - 1  # where a chain ran and stopped, Python goes on
                    if len(tokens) >= n:
                        break
                ids[...] = tokens[-1]
                length_feeds(io, state.length, 1, capacity, feeds)
                out = decode()
                done += 1
                for committed, present in carries:  # state.carry(), its pairs looked up once
                    committed[...] = present
                if watch is not None:
                    watch(key, state.length, self._by_role(out))
                state.length += 1
                row = out[logits][0, 0]
                if len(rows) < keep_logits:
                    rows.append(row.copy())
                tokens.append(choose(xp, row))
                if margins:
                    gaps.append(top2_margin_xp(xp, row))
        finally:  # counted once, and kept true when a decode raises
            self.last_forward = time.perf_counter()
            self.forwards[key] = self.forwards.get(key, 0) + done

    def _chain_greedily(self, tokens: list, n: int) -> None:
        """Greedy's M=1 decodes compiled between replays (mtplab.runtime.hot_loop.chain) from where the Python loop
        stands (its last token chosen, the state carried), while the replay check's table allows, until there are n
        tokens or the loop stops: then the last run's carry and token here, and the Python loop goes on."""
        io, state = self.primary_desc.target, self.state
        feeds, outputs, bound = fixed_io(self.primary_desc, state, 1, True)  # the decoder's very objects
        check = self.target.held_check(Slot.PRIMARY, feeds, outputs, bound)
        if check is None:
            return
        program = hot_loop.held_program(self._programs, "greedy", check, feeds, lambda: hot_loop.program(
            check, feeds, io, self.desc.capacity, check.result[io.logits],
            [(present, committed) for committed, present in state.layer_carries()]))
        if program is None:
            return
        out = np.empty(n, dtype=np.int64)
        out[: len(tokens)] = tokens
        replay = self.target.held_replayer(Slot.PRIMARY)
        i, _, _, pending = hot_loop.chain(check.table, check.copies, program, out, len(tokens), n, state.length,
                                          replay)  # the caller advances the length by the replays made
        tokens += out[len(tokens) : i].tolist()
        if pending:  # the last run's after-work, as the Python loop does it
            state.carry()
            tokens.append(self.acceptance.token(np, check.result[io.logits][0, 0]))

    def _decoder(self, eager: bool) -> tuple[Callable[[], dict], object, dict]:
        """Greedy's M=1 forward on Slot.PRIMARY as a call on fixed feeds: (run, the token ids [1, 1] the next
        token is written into, the feeds whose length entries the caller rewrites before each run).

        The same forward as forward(Slot.PRIMARY, [token]) (on the feeds target_io keeps for M=1), less its
        bookkeeping, which the caller does. On the device the ids are a device array of their own: the loop never
        waits for the device.
        """
        feeds, outputs, bound = target_io(self.primary_desc, self.state, np.zeros(1, dtype=np.int64))
        name = self.primary_desc.target.input_ids
        ids = feeds[name]
        if self.xp is not np:
            ids = self.xp.zeros((1, 1), dtype=np.int64)
            feeds = {**feeds, name: ids}
        if eager:
            return functools.partial(self.target.run_eager, Slot.PRIMARY, feeds, outputs, bound), ids, feeds
        run = self.target.replayer(Slot.PRIMARY, feeds, outputs, bound)
        run.plain = self.xp is np and self.batch == 1  # greedy may compile its decodes (a wrapped decoder may not)
        return run, ids, feeds

    def _key(self, slot: Slot, M: int, label: str | None = None) -> str:
        """The forward counter's name, "label/M=m"."""
        key = self._keys.get((slot, label, M))
        if key is None:
            key = self._keys[(slot, label, M)] = f"{label or self.target.labels[slot]}/M={M}"
        return key

    def _by_role(self, out: dict) -> dict:
        """A forward's outputs, with "logits" and "hidden" too where the graph names them otherwise."""
        if not self._roles:
            return out
        return {**out, "logits": out[self._roles[0]], "hidden": out[self._roles[1]]}

    # -- speculative ---------------------------------------------------------------------------
    def drafter(self, reference: list[int] | None) -> Drafter:
        """The run's drafter (its registered kind builds it; the oracle drafts from the greedy reference)."""
        kind = DRAFTERS.get(self.run_cfg.drafter)
        if kind.reads_reference(self.run_cfg) and reference is None:
            raise ValueError(f"the {kind.name} drafter needs the greedy reference tokens")
        return kind.build(self, reference)

    def _check_reference(self, reference: list[int] | None, n: int) -> None:
        """A reference-reading drafter reads up to k + 1 tokens past the n a run makes (its last step's drafts)."""
        need = n + self.k + 1
        if DRAFTERS.get(self.run_cfg.drafter).reads_reference(self.run_cfg) and reference is not None and len(reference) < need:
            raise ValueError(f"the {self.run_cfg.drafter} drafter drafts from the greedy reference: a run of {n} tokens "
                             f"at k={self.k} needs its first {need} tokens (n + k + 1), got {len(reference)}")

    def speculative(
        self, prompt: list[int], n: int, reference: list[int] | None = None, on_commit: Callable | None = None
    ) -> dict:
        """Speculative decoding until at least n tokens; returns tokens and per-step statistics.

        on_commit(step, length, emitted), when given, is called after every commit (the checked pass
        compares the committed state there; timed runs pass nothing). The schedule's step
        function (mtplab.engine.schedules) does one draft-verify-accept-commit round.
        """
        self._check_reference(reference, n)
        if len(prompt) + n + self.k > self.desc.capacity:  # its last verify's reach, at most (the head's is less)
            raise beyond_capacity(len(prompt) + n + self.k, self.desc.capacity)
        drafter = self.drafter(reference)
        out = self.start(prompt)
        emitted = [int(self.device.read(self.acceptance.token(self.xp, out["logits"][0, -1])))]
        self.prompt, self.emitted = list(prompt), emitted
        drafter.prefill(prompt[1:] + emitted, out["hidden"][0])
        self.last_hidden[...] = out["hidden"][0, -1]
        self.setup_done()  # the head's prefill is untimed setup too
        step, phases = SCHEDULES.get(self.run_cfg.schedule).step, Phases()
        accepted: list[int] = []
        t_start = time.perf_counter()
        while len(emitted) < n:
            accepted.append(step(self, emitted, drafter, phases))
            if on_commit is not None:
                on_commit(len(accepted), self.state.length, emitted)
        seconds = time.perf_counter() - t_start
        return {"tokens": emitted, "seconds": seconds, "accepted": accepted, "split": phases.seconds,
                "started": t_start}

    # -- one step's parts (mtplab.engine.schedules) ----------------------------------------------
    def begin_step(self, hidden=None):
        """The step's hidden-state handoff buffer, from the shared pool until end_step; `hidden` copied in if given."""
        block = self._handoff = self.main.acquire("decode-handoff", self._handoff_bytes)
        buf = self._handoff_views.get(block)
        if buf is None:  # carved once per block: a block's memory never moves
            buf = self._handoff_views[block] = block.carve({"hidden": ((self.desc.hidden_size,), np.float32)})["hidden"]
        if hidden is not None:
            buf[...] = hidden
        return buf

    def decode(self, token, hidden):
        """One M=1 decode of `token` on Slot.PRIMARY; its hidden state into `hidden`; its token (on the device)."""
        if self.xp is np and self.batch == 1:  # a host token: straight into the decode's prepared feeds
            hot = self._hot_forward(Slot.PRIMARY, 1, True)
            hot.ids[...] = token
            out = self._run_hot(hot, own=False)  # read here, before any other forward
        else:
            out = self.forward(Slot.PRIMARY, token)
        self.state.length += 1
        hidden[...] = out["hidden"][0, 0]
        return self.acceptance.token(self.xp, out["logits"][0, 0])

    def keep_hidden(self, ver: dict, n: int) -> None:
        """Keep the verify's hidden state at the last committed position (the fused schedule drafts from it)."""
        self.last_hidden[...] = ver["hidden"][0, n]

    def end_step(self) -> None:
        """Give the handoff buffer back and tell the executor the step is over."""
        if self._handoff is not None:
            self.main.release(self._handoff)
            self._handoff = None
        self.target.end_step()

    def verify(self, first, drafts) -> tuple[int, list[int], int, dict]:
        """Verify [first, d1..dk] on Slot.VERIFY: (accepted count, consumed tokens, bonus token, outputs).

        consumed = [first, d1..dn]: the tokens whose state the commit keeps. The step's one host read.
        """
        xp, k, in_place = self.xp, int(drafts.shape[0]), self.commit_strategy.verify_in_place
        if in_place:
            self.save_state()
        self._verify_start = self.state.length
        on_host = xp is np and self.batch == 1  # host tokens: written straight into the verify's prepared feeds
        buffers = self._verify_buffers.get(k)
        if buffers is None:
            buffers = self._verify_buffers[k] = (None if on_host else xp.empty(k + 1, dtype=np.int64),
                                                 xp.empty(2 * k + 3, dtype=np.int64))
        ids, packed = buffers
        hot = self._hot_forward(Slot.VERIFY, k + 1, in_place) if on_host else None
        if hot is not None:
            ids = hot.row
        ids[0] = first
        ids[1:] = drafts
        ver = self._run_hot(hot) if hot is not None else self.forward(Slot.VERIFY, ids, in_place=in_place)
        logits = ver["logits"][0]
        # packed = [n, first, d1..dk, t0..tk]: the step's one read; greedy-match on the host, in one compiled call
        if not (self._accepts_argmax and held_meta.accept_argmax(logits, ids, packed) is not None):
            n_dev, targets = self.acceptance.accept(xp, drafts, logits)
            packed[0] = n_dev
            packed[1 : k + 2] = ids
            packed[k + 2 :] = targets
        packed = self.device.read(packed).tolist()
        n = packed[0]
        return n, packed[1 : 2 + n], packed[k + 2 + n], ver

    def save_state(self) -> None:
        """Snapshot the recurrent state (before a verify that advances it in place)."""
        for snap, live in zip(self.snapshot, self.state.recurrent_arrays()):
            snap[...] = live

    def restore_state(self) -> None:
        """Put back the recurrent state of the last save_state."""
        for snap, live in zip(self.snapshot, self.state.recurrent_arrays()):
            live[...] = snap

    def commit(self, ver: dict | None, consumed: list[int], start: int | None = None) -> None:
        """Make the state hold exactly `consumed` after position `start` (default: where the last verify began),
        with the run's commit strategy; KV rollback is contents-only."""
        start = self._verify_start if start is None else start
        self.state.length = start
        self.target.rollback(Slot.PRIMARY)
        self._commit(ver, consumed, start)
        self.state.length = start + len(consumed)


def own_weights(shared: dict | None, own) -> dict | None:
    """The shared weights the user's own graph takes: the copy's, less the constants the copy added."""
    if shared is None or own is None:
        return shared
    from mtplab.model.surgery import ADDED

    return {name: value for name, value in shared.items() if not name.startswith(ADDED)}
