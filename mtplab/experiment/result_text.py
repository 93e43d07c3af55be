"""A point's RunResult in words: what `mtplab run` prints (throughput, acceptance, the timing floor, the slot
counters, the warnings and the one-line verdict)."""

from __future__ import annotations

from mtplab.check import verdict as oracle
from mtplab.engine.strategies import DRAFTERS
from mtplab.experiment import config
from mtplab.measure import floor
from mtplab.measure.result import RunResult, engine_steps


def k_histogram_text(ks: list[int]) -> str:
    """A run's drafts per step as counts: 'K=1 x3, K=4 x11'."""
    return ", ".join(f"K={j} x{ks.count(j)}" for j in sorted(set(ks)))


def drafter_text(c: dict) -> str:
    """A stored config's drafter with its parameters, in words (the name alone for a drafter not registered here)."""
    kind = DRAFTERS.find(c["drafter"])
    return kind.text(c) if kind is not None else c["drafter"]


def _ci(ci, fmt: str) -> str:
    lo, hi = (float("nan") if v is None else v for v in ci) if ci else (float("nan"), float("nan"))
    return f"[{lo:{fmt}}, {hi:{fmt}}]"


def rounds_outcome_text(plan: dict) -> str:
    """How an auto-sized point's rounds ended, in words."""
    width = plan.get("half_width")
    reached = f"{width:.1%}" if width is not None and width == width else "none (one round)"
    seconds = plan["seconds"]
    took = f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"
    more = plan.get("floor_rounds") or 0
    return (f"{plan['stopped']} after {plan['rounds']} rounds in {took} (speedup interval "
            f"half-width {reached}, target {plan['target']:.0%}, budget {plan['budget_s']:.0f} s)"
            + (f", then {more} more while a side was beyond its timing floor's band" if more else ""))


def _row_alpha(row: dict) -> str:
    return f" alpha {row['alpha']:g}" if row.get("alpha") is not None else ""


def _floor_text(side: str, f: dict) -> str:
    """One side against its timing floor's band (mtplab.measure.floor), in words."""
    us, unit = 1e6, f["unit"]
    if not floor.held(f):
        return (f"{side} {f['host_per_unit'] * us:.0f} us a {unit}, not held to its band (the floor priced "
                f"{f['priced_share']:.0%} of its forwards)")
    verdict = "within" if f["host_per_unit"] <= f["allowed_per_unit"] else "BEYOND"
    host = (f"{f['host_per_unit'] * us:.0f} us a {unit}" if f["host_per_unit"] >= 0 else
            f"none measurable ({f['host_per_unit'] * us:.0f} us a {unit}: its fastest round beat the bare replays)")
    return f"{side} {host}, {verdict} its band of {f['allowed_per_unit'] * us:.0f} us"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def result_text(r: RunResult, verbose: bool = False) -> str:
    """One RunResult as text: throughput, acceptance, per-slot counters in the seed's form, identity (verbose: the
    identity check's details under its one line)."""
    c = r.config
    # the baseline is what the target alone decodes: greedy, or plain sampling at the run's temperature
    baseline = f"sampling T={c['temperature']:g}" if c.get("temperature", 0) > 0 else "greedy"
    lines = [
        f"mtplab run  engine={c['engine']} model={r.model.get('name', config.upgrade(c)['model'])} k={c['k']} "
        + (f"k_policy={c['k_policy']} " if c.get("k_policy", "fixed") != "fixed" else "")
        + f"drafter={drafter_text(c)}"
        + (f" policy={c['policy']} commit={c['commit']} schedule={c['schedule']}" if c["engine"] == "mtplab" else "")
        + f" tokens={c['tokens']} backend={c['backend']}"
        + (f" batch={c['batch']}" if c.get("batch", 1) > 1 else "")
        + (f" acceptance={c['acceptance']} temperature={c['temperature']:g} top_k={c['top_k']} top_p={c['top_p']:g} "
           f"sample_seed={c['sample_seed']}" if c.get("temperature", 0) > 0 else ""),
        f"  {baseline:<16} {r.greedy_tokens_per_s:8.1f} tok/s {_ci(r.greedy_tokens_per_s_ci, '.1f')}",
        f"  {'speculative':<16} {r.tokens_per_s:8.1f} tok/s {_ci(r.tokens_per_s_ci, '.1f')}",
        f"  speedup {r.speedup:.2f}x {_ci(r.speedup_ci, '.2f')}   {len(r.round_samples)} paired "
        + ("round" if len(r.round_samples) == 1 else "rounds")
        + ("" if r.stable else "   no CI from one round" if len(r.round_samples) < 2
           else "   UNSTABLE (CI half-width > 5% of the median)"),
    ]
    if (plan := r.extra.get("rounds") or {}).get("mode") == "auto":
        lines.append(f"  rounds auto: {rounds_outcome_text(plan)}")
    elif plan.get("floor_rounds"):
        lines.append(f"  {plan['floor_rounds']} rounds more than asked, while a side was beyond its timing floor's band")
    if floors := {side: f for side, f in (r.extra.get("floor") or {}).items() if f}:
        lines.append("  timing floor, host time beyond the side's own forwards (its fastest round less the same plans "
                     "replayed bare): " + "; ".join(_floor_text(baseline if side == "greedy" else side, f)
                                                   for side, f in floors.items()))
    if why := r.theory.get("not_predicted"):
        lines.append(f"  not predicted (no efficiency): {why}")
    if r.predicted:
        when = r.extra.get("calibration_measured") or {}
        at_alpha = r.predicted.get("at_alpha")  # absent: a batch point's, priced at alpha alone
        source = r.theory.get("alpha_source", "its source unrecorded")
        alpha = r.predicted["alpha"]
        alpha = ",".join(f"{a:.2f}" for a in alpha) if isinstance(alpha, list) else f"{alpha:.2f}"
        lines.append(
            (f"  predicted {r.predicted['speedup']:.2f}x from the calibration for the steps it made ({at_alpha:.2f}x at "
             f"alpha {alpha}, {source})" if at_alpha is not None else
             f"  predicted {r.predicted['speedup']:.2f}x from the calibration at alpha {alpha} ({source})")
            + f"   efficiency {r.efficiency:.2f} {_ci(r.efficiency_ci, '.2f')}"
            + (f"   (calibration: {when.get('source', 'cached on this machine')}, measured {when.get('at')}, load "
               f"{when.get('load')})" if when else "")
        )
    lines += [
        f"  tokens/step {r.tokens_per_step:.2f}"
        + (f" (theory{' at K=k every step' if r.k_per_step else ''} {r.theory['tokens_per_step']:.2f}"
           + (", from the alpha fitted to this run" if "sampled_acceptance" in r.theory else "") + ")"
           if "tokens_per_step" in r.theory else "")
        + "   acceptance length "
        f"{r.acceptance_length:.2f}   draft acceptance {r.draft_acceptance:.1%}",
        "    (tokens/step: tokens emitted per step, a decode-verify step's decode included; acceptance length: 1 + the"
        " drafts a verify keeps, vLLM's measure; draft acceptance: drafts kept / drafted)",
    ]
    if r.acceptance_per_position:  # the peer reports neither
        deepest = max(r.k_per_step) if r.k_per_step else len(r.acceptance_per_position)  # "-": no step drafted it
        lines.append("  per position P(accepted>=i): " + " ".join(
            f"{p:.2f}" if i < deepest else "-" for i, p in enumerate(r.acceptance_per_position))
                     + (" (over the steps that drafted position i)" if r.k_per_step else ""))
    if r.k_per_step:
        lines.append(f"  drafts per step (k_policy {c.get('k_policy')}, last timed run): {k_histogram_text(r.k_per_step)};"
                     f" mean K {sum(r.k_per_step) / len(r.k_per_step):.2f}")
    if sa := r.theory.get("sampled_acceptance"):
        lines.append(f"  rejection sampling (checked run): kept {sa['kept']} of {sa['judged']} judged drafts (a draft is "
                     "judged when the ones before it were kept: the per-position rate), "
                     f"{_share(sa['measured'])} against an expected sum(min(p, q)) of {_share(sa['expected'])}; "
                     f"tokens/step {sa['measured_tokens_per_step']:.2f} against {sa['expected_tokens_per_step']:.2f} "
                     "from the expected per-position rates")
    if rows := (r.extra.get("batch") or {}).get("per_row"):
        lines.append(f"  batch of {len(rows)}: a step takes {r.extra['batch']['step_seconds'] * 1e3:.2f} ms; per row "
                     "(its own prompt seed, acceptance and commit; greedy's tokens/s above count every row):")
        lines += [f"    row {p['row']} seed {p['seed']}{_row_alpha(p)}: {p['tokens_per_s']:.1f} tok/s until it had its "
                  f"tokens, {p['steps']} steps, acceptance length {p['acceptance_length']:.2f}"
                  + ("" if p["lossless"] else "   NOT LOSSLESS") for p in rows]
        if (riding := r.extra["batch"].get("riding_share")) is not None:
            predicted = (r.predicted or {}).get("riding_share")
            lines.append(f"    the slowest row's cost: {riding:.0%} of the batch's row-steps ran rows that had their "
                         "tokens (riding along until the last row was done)"
                         + (f"; predicted {predicted:.0%}" if predicted is not None else ""))
    if r.time_split:
        steps = engine_steps(r)
        per_step = 1e3 / steps if steps else 1e3
        lines.append(f"  time split, ms per {'step' if steps else 'run'}: "
                     + " ".join(f"{k}={v * per_step:.3f}" for k, v in r.time_split.items()))
    if r.slots:
        lines.append("  slot counters of the checked speculative run (the greedy reference run before it had already "
                     "captured the Primary plan: primary captures=0):")
    for slot, counters in r.slots.items():
        lines.append(
            f"  {slot}: "
            + " ".join(f"{k}={v}" for k, v in counters.items())
            + (f"   [{r.slot_reasons[slot]}]" if r.slot_reasons.get(slot) else "")
        )
    for slot, plans in (r.extra.get("plans") or {}).items():
        if len(plans) > 1:  # a plan per M (a draft-length policy's Verify): what each holds
            lines.append(f"  {slot} plans: " + "; ".join(
                f"M={p['tokens']} {p['captures']} capture{'s' * (p['captures'] != 1)} {p['replays']} replays "
                f"{p['plan_bytes'] / 1024:.1f} KiB" for p in sorted(plans, key=lambda p: p["tokens"] or 0)))
    if pp := r.extra.get("per_position"):
        lines.append(f"  per-position states: {pp['states_per_verify']} per verify x {pp['layers']} recurrent layers x "
                     f"{pp['state_bytes'] / 1024:.1f} KiB = {pp['bytes'] / 1024:.1f} KiB written by a verify of k drafts"
                     + (f" ({r.extra['batch']['rows']} rows)" if r.extra.get("batch") else ""))
    for w in r.warnings:
        lines.append(f"  WARNING {w['name']}: {w['message']}")
    for why in r.suspect:
        lines.append(f"  SUSPECT TIMING (its speedup is not a finding): {why}")
    if r.suspect and (load := r.env.get("loadavg")):
        lines.append(f"    (load {load[0]:.2f} when it ended: a busy machine can hold a side beyond its band too; run it "
                     "again on a quiet one)")
    lines.append(("  OK: " if r.lossless else "  FAIL: ") + r.verdict)
    if verbose:
        lines += [f"    {line}" for line in oracle.details(r.identity)]
    return "\n".join(lines)
