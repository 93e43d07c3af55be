"""The timed rounds, audited at no extra forward: each timed run must do what the checked pass showed.

A timed run is traced by what the engine counts anyway (forwards by label and M; each slot's
captures, replays, fallbacks, invalidations, warm-ups and eager runs, held to the plan backend's own
count of the runs it executed), its tokens, its accepted counts, its clock stamps and the state it
ends in; nothing is added inside the timed loop. Greedy's loop counts its decodes itself, so its
slot's activity and the backend's count are what hold its forwards.

- greedy: n tokens equal to the reference; exactly one prefill and n - 1 decodes at M=1 on the
  Primary slot, replayed (at most a warm-up and a capture first), no fallback, no invalidation
  (one, the prefill's, when the decode plan is not retained; one, the first decode's, when the run before
  left Primary's plan at M > 1, a readvance-batched commit's), no other slot running; the state it
  ends in equals the lockstep reference's at that length (bitwise where the same M=1 kernels run on
  the same device).
- speculative: tokens equal to the reference; the same forwards, the same accepted-count sequence
  and, per slot, the same number of forwards and eager runs as the checked speculative run, no more
  forwards outside a plan (warm-ups, fallbacks) than it beyond SETUP_RUNS, and invalidations within
  one (where the previous run left a slot moves its set-up), or fewer where the slot began with another
  plan than in the checked run and replayed no more (a named warning); no slot gone eager for a
  recapture budget other than max_recaptures; the state it ends in bitwise equal to the checked run's.
- both: n - 1 counted tokens and a rate of counted / seconds; a timed window that opens after the
  run's untimed setup (prefill) and before its first forward, and closes after its last forward and
  before the call returns; the slots' counters equal what the plan backend itself ran, and no slot
  captures a plan without a cause (an invalidation, or no plan ready when the run began).

A difference is a problem (the point is a mismatch, the reason naming the round, the side and what
differed), except those a backend explains, which are named warnings: fallbacks where a plan
capture was declined (a CUDA graph-id budget spent), a state within the rule's tolerance but not
bitwise off the CPU (on the CPU the same computation gives the same bits: a problem), a clock
window that does not hold the run's forwards.

Before any of it, `engine_problems` holds the built engine to its config (threads, policy, slot
flags) and `mtplab.check.expected.checked_problems` holds the checked speculative run to what its config implies:
the forwards by (slot, M) that its schedule, drafter and commit strategy make for its accepted counts, and the K its
draft-length policy chooses for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mtplab.base.threads import thread_pool, threads_used
from mtplab.check.expected import forwards_diff, greedy_forwards
from mtplab.check.trace import Trace, off_plan, runs, slot_states
from mtplab.check.verdict import STATE_RTOL, StateRule, batch_rule, first_difference, state_rule, states_difference
from mtplab.runtime.executor import Slot

# The forwards a slot may spend setting its plan up again at the start of a run (a warm-up and a capture): the
# state the previous run left the slot in (another side, another plan size) moves them between runs.
SETUP_RUNS = 2


@dataclass
class Audit:
    """Checks every timed run of a point against the checked pass; collects problems and warnings."""

    engine: object
    n: int
    prompt_len: int
    reference: list[list[int]]  # per row, greedy's tokens
    spec_trace: Trace
    spec_state: list[dict]  # per row
    greedy_state: list[dict]  # per row, the reference's state where the timed greedy runs end
    greedy_rule: StateRule
    rtol: float  # the precision's relative tolerance (oracle.STATE_RTOL): beyond it a state difference is a problem
    spec_lengths: list[int] = field(default_factory=list)  # per row, where the checked speculative run left it
    first_greedy: list[dict] | None = None  # per row, the state the first timed greedy run ended in
    problems: list[str] = field(default_factory=list)
    warnings: dict[str, str] = field(default_factory=dict)  # name -> the first message of that kind
    warning_counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, engine, n: int, prompt_len: int, checked) -> Audit:
        """The audit of a point's timed runs against its checked pass (mtplab.check.lossless.Checked)."""
        rule = batch_rule(state_rule(None, engine.desc.precision, engine.device.name == "cpu"), engine.batch,
                          engine.desc.precision)
        return cls(engine, n, prompt_len, checked.greedy.tokens, checked.spec_trace, checked.spec_state,
                   checked.greedy_state, rule, STATE_RTOL[engine.desc.precision], checked.spec_lengths)

    def _row(self, b: int) -> str:
        return f"row {b}'s " if len(self.reference) > 1 else ""

    def _problem(self, r: int | None, side: str, text: str) -> None:
        self.problems.append(f"{side}: {text}" if r is None else f"timed round {r}, {side}: {text}")

    def _warn(self, name: str, r: int, side: str, text: str) -> None:
        self.warnings.setdefault(name, f"timed round {r}, {side}: {text}")
        self.warning_counts[name] = self.warning_counts.get(name, 0) + 1

    # -- the sides ---------------------------------------------------------------------------
    def greedy(self, r: int, trace: Trace, sample: dict, g, returned: float) -> None:
        """Audit one timed greedy run `g` (its trace ended right after the call returned at `returned`)."""
        side, n, P = "greedy", self.n, self.prompt_len
        started, seconds = g.started, g.seconds
        self._tokens(r, side, trace.tokens)
        margins, logits = sum(map(len, g.margins)), sum(map(len, g.logits))
        if margins or logits:
            self._problem(r, side, f"it computed {margins} top-2 margins and kept {logits} logits rows: "
                                   "work the decoder it measures does not do")
        for text in trace.honesty_problems():
            self._problem(r, side, text)
        want = greedy_forwards(P, n)
        if trace.forwards != want:
            self._problem(r, side, f"forwards {trace.forwards}, expected {want}")
        primary = self.engine.target.labels[Slot.PRIMARY]
        for slot, c in trace.activity.items():
            if slot != primary and runs(c):
                self._problem(r, side, f"the {slot} slot ran {nonzero(c)}: greedy runs only the Primary slot")
        for text in _budget_problems(self.engine):
            self._problem(r, side, text)
        c = trace.activity.get(primary, {})
        decodes = runs(c) - c.get("eager", 0)
        setup = c.get("warmups", 0) + c.get("captures", 0)
        # Without retain the prefill's eager run drops the plan; with it, a plan the run before left at M > 1 (a
        # commit's M=n forward on Primary) is replaced at the first decode.
        may_invalidate = 0 if self.engine.target.retain and trace.primary_tokens_before in (None, 1) else 1
        if c.get("eager", 0) != 1 or decodes != n - 1:
            self._problem(r, side, f"primary ran {c.get('eager', 0)} eager forwards and {decodes} through its plan "
                                   f"({nonzero(c)}), expected 1 (the prefill) and {n - 1}")
        elif c.get("fallbacks", 0):
            self._fallbacks(r, side, primary, f"{c['fallbacks']} of {n - 1} decodes fell back")
        elif setup > SETUP_RUNS or c.get("invalidations", 0) > may_invalidate:
            self._problem(r, side, f"primary {nonzero(c)}: expected {n - 1} decodes replayed after at most a "
                                   "warm-up and a capture")
        # each row's end state: against the lockstep reference under the precision's rule, and against the first timed
        # greedy run's bitwise (the same computation on the same device gives the same bits on the CPU)
        same = StateRule(True, 0.0, "every timed greedy run repeats the first one's computation")
        cpu, first = self.engine.device.name == "cpu", self.first_greedy
        for b, kept in enumerate(self.greedy_state):
            end = int(self.engine.state.lengths[b])
            if end != P + n - 1:
                self._problem(r, side, f"{self._row(b) or 'its '}state ends at length {end}, expected {P + n - 1} "
                                       f"(the prompt's {P} tokens and {n - 1} decodes)")
                continue
            got = self.engine.state.snapshot(copy=False, row=b)
            if kept is not None:
                self._state(r, side, got, kept, self.greedy_rule, "the lockstep reference's", row=b)
            if first is not None:
                self._state(r, side, got, first[b], same, "the first timed greedy run's", cpu, row=b)
        if first is None:
            self.first_greedy = [self.engine.state.snapshot(row=b) for b in range(len(self.greedy_state))]
        self._clock(r, side, sample, "greedy_", started, seconds, returned)

    def speculative(self, r: int, trace: Trace, sample: dict, spec, returned: float) -> None:
        """Audit one timed speculative run `spec` (mtplab.engine.speculative.SpeculativeRun) against the checked
        speculative run."""
        started, seconds = spec.started, spec.seconds
        side, checked = "speculative", self.spec_trace
        # a sampled run's tokens are its own (the same seed, the same tokens), not greedy's
        self._tokens(r, side, trace.tokens, checked.tokens if self.engine.acceptance.samples else None)
        for text in trace.honesty_problems():
            self._problem(r, side, text)
        for b, (ks, want) in enumerate(zip(trace.ks or [], checked.ks or [])):
            if ks != want:
                first = first_difference(ks, want)
                self._problem(r, side, f"{self._row(b)}draft lengths differ from the checked run's from step "
                                       f"{first + 1} (a draft-length policy must choose alike for the same tokens)")
        for b, (got, want) in enumerate(zip(trace.accepted, checked.accepted)):
            if got != want:
                first = first_difference(got, want)
                self._problem(r, side, f"{self._row(b)}accepted counts differ from the checked run's from step "
                                       f"{first + 1} ({len(got)} steps, checked {len(want)})")
        for b, t in enumerate(spec.finished):  # a row's tokens/s is timed to the end of the step it had its n tokens at
            at = len(spec.accepted[b])
            end = spec.step_ends[at - 1] if 0 < at <= len(spec.step_ends) else float("nan")
            if not 0 < t <= seconds:
                self._problem(r, side, f"row {b} had its tokens at {t * 1e3:.4g} ms, outside its run's "
                                       f"(0, {seconds * 1e3:.4g}] ms")
            elif t != end:
                self._problem(r, side, f"row {b} had its tokens at {t * 1e3:.4g} ms, where step {at}, its last, "
                                       f"ended at {end * 1e3:.4g} ms")
        if trace.forwards != checked.forwards:
            diff = forwards_diff(trace.forwards, checked.forwards)
            self._problem(r, side, f"forwards differ from the checked run's, (timed, checked): {diff}")
        for slot, want in checked.activity.items():
            got = trace.activity.get(slot, {})
            if runs(got) != runs(want) or got.get("eager", 0) != want.get("eager", 0):
                self._problem(r, side, f"the {slot} slot ran {runs(got)} forwards ({nonzero(got)}), the checked run "
                                       f"{runs(want)} ({nonzero(want)})")
            elif off_plan(got) > off_plan(want) + SETUP_RUNS:
                if got.get("fallbacks", 0) > want.get("fallbacks", 0) + SETUP_RUNS:
                    self._fallbacks(r, side, slot, f"{nonzero(got)}, the checked run {nonzero(want)}",
                                    self._budget_spent(got))
                else:
                    self._problem(r, side, f"the {slot} slot ran {off_plan(got)} forwards outside its plan "
                                           f"({nonzero(got)}), the checked run {off_plan(want)} ({nonzero(want)})")
            elif abs(got.get("invalidations", 0) - want.get("invalidations", 0)) > 1:
                text = f"the {slot} slot invalidated {got.get('invalidations', 0)} plans, the checked run " \
                       f"{want.get('invalidations', 0)}"
                # An unpinned workspace lands where the pool puts it, and a timed round starts from the plan the run
                # before it left: it may invalidate more than the checked run, which started fresh; fewer only as the
                # plan it began with explains, replaying no more (else a workspace held still, another policy's timing).
                primary = slot == self.engine.target.labels[Slot.PRIMARY]
                if not self.engine.policy.pin_workspace and got.get("invalidations", 0) > want.get("invalidations", 0):
                    self._warn("timed_invalidations", r, side, f"{text} (policy {self.engine.policy.name!r}: its "
                                                               "workspace moves as the pool places it)")
                elif budget := self._budget_spent(got):
                    self._warn("timed_invalidations", r, side, f"{text} ({budget})")
                elif start := _other_start(slot, primary, trace, checked, got, want):
                    self._warn("timed_invalidations", r, side, f"{text} ({start})")
                else:
                    self._problem(r, side, text)
        for text in _budget_problems(self.engine):
            self._problem(r, side, text)
        same = StateRule(True, 0.0, "the timed run repeats the checked run's computation")
        for b, ref in enumerate(self.spec_state):
            end = int(self.engine.state.lengths[b])
            if self.spec_lengths and end != self.spec_lengths[b]:
                self._problem(r, side, f"{self._row(b) or 'its '}state ends at length {end}, the checked run's at "
                                       f"{self.spec_lengths[b]}")
                continue
            self._state(r, side, self.engine.state.snapshot(copy=False, row=b), ref, same, "the checked run's",
                        bitwise_or_problem=self.engine.device.name == "cpu", row=b)
        self._clock(r, side, sample, "", started, seconds, returned)

    # -- pieces --------------------------------------------------------------------------------
    def _tokens(self, r: int, side: str, rows: list[list[int]], references: list[list[int]] | None = None) -> None:
        n, references = self.n, self.reference if references is None else references
        if len(rows) != len(references):
            self._problem(r, side, f"it decoded {len(rows)} rows, the batch has {len(references)}")
        for b, (tokens, reference) in enumerate(zip(rows, references)):
            where = f"row {b}: " if len(references) > 1 else ""
            if len(tokens) < n:
                self._problem(r, side, f"{where}made {len(tokens)} tokens, asked for {n}")
            elif tokens[:n] != reference[:n]:
                first = first_difference(tokens[:n], reference[:n])
                self._problem(r, side, f"{where}token {first} is {tokens[first]}, the reference has {reference[first]}")

    def _budget_spent(self, got: dict) -> str | None:
        """Why a timed run's slot may invalidate and fall back otherwise than the checked run's: the timed run spent
        its max_recaptures budget (a generation invalidates at most max_recaptures + 1 plans, then runs eager), at
        another step than the checked run, since a run starts from the plan the one before it left. That makes the
        timed run costlier, never cheaper; None when it did not (a timed run that avoided the checked run's
        invalidations or fallbacks stays a problem)."""
        limit = self.engine.spec.max_recaptures
        if limit < got.get("invalidations", 0) <= limit + 1:
            return (f"max_recaptures={limit} reached in the timed run, at another step: a run starts from the plan "
                    "the run before it left")
        return None

    def _fallbacks(self, r: int, side: str, slot: str, text: str, budget: str | None = None) -> None:
        reason = next((ex.state[s].reason for ex in (self.engine.target, self.engine.mtp) for s, lbl in ex.labels.items()
                       if lbl == slot), "")  # the state the slot ran last (its plan of the last shape it ran)
        if reason.startswith("capture declined"):
            self._warn("timed_fallbacks", r, side, f"the {slot} slot: {text} ({reason})")
        elif budget is not None:
            self._warn("timed_fallbacks", r, side, f"the {slot} slot: {text} ({budget})")
        else:
            self._problem(r, side, f"the {slot} slot: {text}, and no declined capture explains it")

    def _state(self, r: int, side: str, got: dict, ref: dict, rule: StateRule, whose: str,
               bitwise_or_problem: bool = False, row: int = 0) -> None:
        problem, warning = state_problem(got, ref, rule, self.rtol, whose, bitwise_or_problem)
        if len(self.reference) > 1:
            problem, warning = (None if t is None else f"row {row}: {t}" for t in (problem, warning))
        if problem:
            self._problem(r, side, problem)
        elif warning:
            self._warn("timed_state_not_bitwise", r, side, warning)

    def _clock(self, r: int, side: str, sample: dict, prefix: str, started: float, seconds: float,
               returned: float) -> None:
        B = len(self.reference)
        want = B * (self.n - 1)  # every row's tokens after its prefill's, up to the n-th
        counted = sample.get(f"{prefix}counted")
        if counted != want:
            self._problem(r, side, f"counted {counted} tokens, expected {want} (" + (f"{B} rows' " if B > 1 else "")
                          + "those after the prefill's token, up to the n-th)")
        rate = sample.get(f"{prefix}tokens_per_s")
        if want == 0:  # nothing is counted: the rate says nothing (NaN)
            pass
        elif not (seconds > 0 and rate is not None and abs(rate * seconds - want) <= 1e-9 * want):
            self._problem(r, side, f"tokens/s {rate} is not {want} tokens / {seconds:.6g} s")
        for text in clock_problems(self.engine, started, seconds, returned):
            self._problem(r, side, text)

    def summary(self) -> dict:
        """What the RunResult keeps: the problems, and each warning's first message and count."""
        return {
            "problems": self.problems[:8],
            "problem_count": len(self.problems),
            "warnings": {k: {"message": m, "count": self.warning_counts[k]} for k, m in self.warnings.items()},
        }


def engine_problems(engine) -> list[str]:
    """Where the built engine does not run what its RunConfig says (before any forward is judged)."""
    run, out = engine.spec, []
    sessions = [*engine.target.sessions.values(), *engine.mtp.sessions.values()]
    pool = thread_pool()
    if pool["kind"] == "global":  # the process's sessions share one pool
        own = sum(s.get_session_options().use_per_session_threads for s in sessions)
        if own:
            out.append(f"{own} of its sessions have intra-op pools of their own, the process shares one")
        if pool["threads"] != threads_used(run.threads):
            out.append(f"its sessions share a pool of {pool['threads']} threads, the config says {run.threads} "
                       f"({threads_used(run.threads)} threads)")
    else:
        threads = {s.get_session_options().intra_op_num_threads for s in sessions}
        if threads != {run.threads}:
            out.append(f"its sessions run {sorted(threads)} intra-op threads, the config says {run.threads}")
    if engine.policy.name != run.policy:
        out.append(f"its arena policy is {engine.policy.name!r}, the config says {run.policy!r}")
    sibling = engine.target.sessions[Slot.VERIFY] is not engine.target.sessions[Slot.PRIMARY]
    if sibling != engine.policy.sibling_session:
        out.append(f"the Verify slot {'has' if sibling else 'lacks'} a session of its own under policy {run.policy!r}")
    for name, want in (("retain", run.retain_decode_graph_across_spec), ("validate", run.validate),
                       ("max_recaptures", run.max_recaptures)):
        if getattr(engine.target, name) != want:
            out.append(f"its executor has {name}={getattr(engine.target, name)!r}, the config says {want!r}")
    return out


def state_problem(got: dict, ref: dict, rule: StateRule, rtol: float, whose: str,
                  bitwise_or_problem: bool = False) -> tuple[str | None, str | None]:
    """(problem, warning) of the state a timed run ends in against `whose`: other tensors, or a difference beyond
    the precision's rtol, is a problem; not bitwise where the rule is, a problem where the same computation gives
    the same bits (bitwise_or_problem: the CPU), else a warning."""
    if set(got) != set(ref):
        return f"the committed state's tensors differ from {whose}: {sorted(set(got) ^ set(ref))}", None
    diff = states_difference(got, ref, StateRule(False, rtol, rule.why))
    if (bad := diff["first_bad"]) is not None:
        return (f"the state it ends in differs from {whose}: {bad['tensor']} max abs diff {bad['max_abs_diff']:.3g}, "
                f"relative {bad['max_rel_diff']:.3g}"), None
    if rule.bitwise and not diff["bitwise"]:
        text = f"the state it ends in is within {diff['max_rel_diff']:.2g} relative of {whose}, not bitwise"
        if bitwise_or_problem:  # the CPU kernels are deterministic
            return text + ": on the CPU the same computation gives the same bits", None
        return None, f"{text} ({rule.why})"
    return None, None


def clock_problems(engine, started: float, seconds: float, returned: float) -> list[str]:
    """Where a timed run's window does not hold exactly its own work: it opened before the untimed setup (the
    prefill) ended or after its first forward began, closed before its last forward ended, or counted more than
    the call took. Each moves a rate by time that is not the run's (perf_counter stamps the engine keeps)."""
    opened, first, last = engine.opened, engine.first_forward, engine.last_forward
    if started < opened:
        return [f"the timed window opened {1e3 * (opened - started):.3f} ms before the untimed setup (the prefill) "
                "ended"]
    if started + seconds > returned + 1e-6:
        return [f"{1e3 * (started + seconds - returned):.3f} ms more than the call took were counted"]
    if first is not None and started > first + 1e-9:
        return [f"the timed window opened {1e3 * (started - first):.3f} ms after its first forward began"]
    if last is not None and started + seconds < last - 1e-9:
        return [f"the timed window closed {1e3 * (last - started - seconds):.3f} ms before its last forward ended: "
                "time spent in the run went uncounted"]
    return []


def _budget_problems(engine) -> list[str]:
    """Slots whose run went eager for a recapture budget other than the config's: a generation invalidates
    max_recaptures + 1 plans before its slot runs eager."""
    limit, out = engine.spec.max_recaptures, []
    for label, st in slot_states(engine):
        if st.spent_budget is not None and (st.spent_budget != limit or st.generation_invalidations <= limit):
            out.append(f"the {label} slot ran eager for the rest of the run after {st.generation_invalidations} "
                       f"invalidations (a budget of max_recaptures={st.spent_budget}); the config's "
                       f"max_recaptures={limit} allows {limit + 1}")
    return out


def _other_start(slot: str, primary: bool, trace: Trace, checked: Trace, got: dict, want: dict) -> str | None:
    """Why a timed run's slot may invalidate fewer plans than the checked run's: it began with another plan (none,
    or one of another M), and a slot's invalidations count the plans it replaces, so they follow from where it
    starts (the same forwards then stay eager, warm-ups or captures). Only where it replayed no more plans than the
    checked run: a timed run that did cheaper work stays a problem. None otherwise."""
    if got.get("invalidations", 0) >= want.get("invalidations", 0) or got.get("replays", 0) > want.get("replays", 0):
        return None
    began, checked_began = _start_words(trace, slot, primary), _start_words(checked, slot, primary)
    if began == checked_began:
        return None
    return f"it began with {began}, the checked run with {checked_began}, and replayed no more plans than it"


def _start_words(trace: Trace, slot: str, primary: bool) -> str:
    """The plan a run's slot held when the run began, in words."""
    if not trace.ready_before.get(slot):
        return "no plan ready on that slot"
    m = trace.primary_tokens_before if primary else None
    return "a plan ready" if m is None else f"its plan at M={m} ready"


def nonzero(c: dict) -> str:
    """A counters dict's non-zero entries, `key=value` each ("nothing" when none)."""
    return " ".join(f"{k}={v}" for k, v in c.items() if v) or "nothing"
