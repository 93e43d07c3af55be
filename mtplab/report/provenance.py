"""The report's header: where, when, with what and on which grid a sweep's numbers were measured."""

from __future__ import annotations

import html

import pandas as pd
import yaml

from mtplab.engine.strategies import DRAFTERS
from mtplab.experiment.config import drafter_params, fields
from mtplab.experiment.params import AUTO_ROUNDS
from mtplab.sweep import store

# Run parameters a sweep can vary or fix: RunConfig's fields (the model by its name, a preset's or a builder
# folder's: store.load's model_name); rounds and threads have rows of their own.
OWN_ROWS = ("rounds", "threads")
PARAMETERS = ("model_name", *(f.name for f in fields() if f.name != "model" and f.name not in OWN_ROWS))

# Parameters that mean nothing for a row: the peer engine has no mtplab policy, commit or schedule;
# alpha belongs to the oracle drafter.
PEER_ONLY_BLANK = ("policy", "commit", "schedule", "validate", "retain_decode_graph_across_spec", "max_recaptures")


def blank_inapplicable(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with cells that do not apply to their row set to NA (alpha off the oracle; mtplab's knobs on the peer;
    the auto rounds' target and budget beside a fixed count)."""
    out = df.copy()
    if "drafter" in out:  # a drafter's own parameters, on the rows of drafters that take them only
        for name in drafter_params():
            if name in out:
                takes = out.drafter.map(lambda d, n=name: (kind := DRAFTERS.find(d)) is not None and n in kind.params)
                out[name] = out[name].astype(object).where(takes, None)
    if "rounds" in out:  # the auto rounds' target and budget, on the rows that sized their rounds only
        auto = out.rounds.astype(str) == "auto"
        for c in AUTO_ROUNDS:
            if c in out:
                out[c] = out[c].astype(object).where(auto, None)
    if "engine" in out:
        peer = out.engine != "mtplab"
        for c in PEER_ONLY_BLANK:
            if c in out:
                out[c] = out[c].astype(object).where(~peer, None)
    return out


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def threads_text(per_point) -> str:
    """sweep.json's threads_per_point in words: one count, or the counts points of the sweep ran with."""
    return plural(per_point, "ORT thread") if isinstance(per_point, int) else f"{' or '.join(map(str, per_point))} ORT threads"


def fixed_and_varied(df: pd.DataFrame) -> tuple[dict, dict]:
    """Parameters with one value over every point (fixed) and those with several (varied, sorted values)."""
    fixed, varied = {}, {}
    df = blank_inapplicable(df)
    for p in PARAMETERS:
        if p not in df:
            continue
        values = sorted({v for v in df[p] if pd.notna(v)}, key=str)
        if len(values) == 1:
            fixed[p] = values[0]
        elif values:
            varied[p] = values
    return fixed, varied


def _shown(parameter: str) -> str:
    return "model" if parameter == "model_name" else parameter


def _row(name: str, value: str) -> str:
    return f"<tr><th>{html.escape(name)}</th><td>{value}</td></tr>"


def _rounds(df) -> str:
    """The paired rounds per point, as the results record them ("3", or "3-5")."""
    import json

    recorded = [v for v in df.round_samples if isinstance(v, (str, list))] if "round_samples" in df else []
    if not recorded:  # no point ran (a failed point records none)
        return "an unrecorded number of"
    counts = sorted({len(json.loads(v)) if isinstance(v, str) else len(v) for v in recorded})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def pages_text(pages: dict | None) -> str:
    """The pages the sweep's processes ran on (mtplab.base.memory.huge_pages), in a few words."""
    if not pages:
        return "pages not recorded"
    if pages.get("malloc_hugetlb") == "2":
        return "malloc's memory on reserved huge pages (glibc.malloc.hugetlb=2)"
    if pages.get("transparent") == "always":
        return "huge pages (the kernel's THP always)"
    if pages.get("malloc_hugetlb") == "1" and pages.get("transparent") == "madvise":
        return "malloc's memory on huge pages (glibc.malloc.hugetlb=1)"
    return "4 KiB pages"


def header_html(sweep: dict, df: pd.DataFrame) -> str:
    """The provenance block: counts, spec, fixed and varied parameters, repeats, threads, versions, machine, load."""
    env = sweep.get("env", {})
    spec = sweep.get("spec") or {}
    fixed, varied = fixed_and_varied(df)
    counts = store.status_counts(sweep)
    spec_name = spec.get("name", sweep["name"])
    title = f"mtplab sweep <code>{html.escape(sweep['name'])}</code>" + (
        f" (spec <code>{html.escape(str(spec_name))}</code>)" if spec_name != sweep["name"] else ""
    )
    load = f"{sweep.get('load_start', 'n/a')} at the start, {sweep.get('load_end', 'n/a')} at the end"
    versions = ", ".join(
        f"{name} {env.get(key) or 'not installed'}"
        for name, key in (
            ("mtplab", "mtplab"),
            ("onnxruntime", "onnxruntime"),
            ("onnxruntime-genai", "onnxruntime_genai"),
            ("numpy", "numpy"),
            ("Python", "python"),
        )
    )
    partial = len(df) < sweep.get("points", len(df))  # an interrupted sweep: the spec's other points never ran
    over = f" (over the {plural(len(df), 'point')} that finished; the spec has {sweep.get('points')})" if partial else ""
    rows = [
        _row("points", f"{plural(sweep['points'], 'point')}: {counts}" + (" (interrupted)" if sweep.get("interrupted") else "")),
        _row("fixed parameters",
             html.escape(", ".join(f"{_shown(k)}={v if v != '' else '(none)'}" for k, v in fixed.items()) or "none")
             + html.escape(over)),
        _row(
            "varied parameters",
            html.escape("; ".join(f"{_shown(k)}: {', '.join(str(x) if x != '' else 'none' for x in v)}"
                                  for k, v in varied.items()) or "none"),
        ),
        _row("repeats", f"{spec.get('repeats', 1)} per point (a repeat is a whole point again); each point ran "
                        f"{_rounds(df)} paired greedy/speculative rounds"),
        _row(
            "threads",
            f"{plural(sweep['workers'], 'point')} at a time x {threads_text(sweep['threads_per_point'])} each "
            f"({sweep.get('executor', 'local')} executor)",
        ),
        _row("versions", html.escape(versions) + f", git {html.escape(str(env.get('git_revision') or 'n/a'))}"),
        _row(
            "machine",
            html.escape(
                f"{env.get('device')} ({env.get('provider')}), {env.get('cpu_count')} cores, "
                f"{env.get('memory_gib', 'n/a')} GiB, {env.get('platform')}, {pages_text(env.get('huge_pages'))}"
            ),
        ),
        _row("load average (1 min)", load),
        _row("time", f"{sweep['started']} to {sweep['finished']} UTC, {sweep['wall_seconds']} s wall"),
    ]
    spec_text = html.escape(yaml.safe_dump(spec, sort_keys=False).strip())
    return (
        f"<h1>{title}</h1><table class='provenance'>{''.join(rows)}</table>"
        f"<details><summary>sweep spec</summary><pre>{spec_text}</pre></details>"
    )


HOW_TO_READ = """\
**How to read this report.** Each point is an untimed checked run, then paired timed rounds of
greedy and of speculative decoding on the same prompt, in one process (the header says how many);
*speedup* is the median over the rounds of speculative tokens/s over greedy tokens/s (above 1:
speculative is faster), with its 95% CI. The *oracle* drafter proposes the right token with a set probability alpha
per position, so it measures performance at a chosen acceptance and says nothing about accuracy;
the *MTP head* is the model's own drafter. *Acceptance length* = 1 + accepted drafts per step;
*draft acceptance* = accepted / drafted. *Theory* is Leviathan's formula priced with the sweep's
calibration (measured apart from every point: greedy's loop, the draft phase, the verify, the commit,
fallbacks at their eager cost, the run's length). The *slot counters* say, per run, how often the M=1 decode plan (primary slot) and the
M=k+1 verify plan (verify slot) were captured, replayed, fell back to eager, were invalidated, or
hit a hazard. *Lossless* means the speculative tokens equal greedy's, and, where the state check ran,
every committed recurrent state and KV row matches an independent reference, and every timed run
did what the checked one did. The header above says what was
fixed and what varied; the table at the end holds every point (download it as CSV there)."""
