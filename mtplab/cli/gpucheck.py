"""`mtplab doctor --gpu-check`: the device check of the CUDA backend, in one command.

On a CUDA machine: builds the presets (fp16), checks the capture protocol (greedy with graphs ==
greedy eager) and the device select-replay kernel, then runs greedy + speculative for every arena
policy and commit at k = 1..3, prints per-slot counters, tokens/s, speedups and identity, checks
what the CUDA backend must show, and writes everything to one JSON file. A time budget keeps it
short: points that would start after it are listed as skipped, never silently dropped.
`--backend cpu` runs the same check on the CPU EP (how it is tested without a GPU). A failure (a
capture refused, a kernel missing) is reported with the op it names; no device input is ever moved
to host memory to get past one.
"""

from __future__ import annotations

import gc
import itertools
import json
import time
from pathlib import Path

import numpy as np

from mtplab.engine.strategies import COMMITS, SCHEDULES
from mtplab.experiment import config
from mtplab.experiment.config import RunConfig
from mtplab.experiment.params import BACKENDS
from mtplab.measure import rounds as measure
from mtplab.model.config import MAX_TRANSITION_CAPACITY
from mtplab.runtime.policy import POLICIES

DEFAULT = config.defaults()
FULL_GRID_PRESETS = ("tiny", "small")  # every policy x commit x k; larger presets: every policy x select


def plan(presets: list[str], ks: list[int]) -> list[tuple[str, str, str, int, str]]:
    """(preset, policy, commit, k, schedule) of every run, smallest preset first."""
    runs = []
    for name in presets:
        commits = (tuple(c for c in COMMITS if COMMITS.get(c).backend_refusal("cuda") is None)
                   if name in FULL_GRID_PRESETS else (DEFAULT["commit"],))
        runs += [(name, pol, com, k, DEFAULT["schedule"]) for pol, com, k in itertools.product(POLICIES, commits, ks)]
        runs += [(name, DEFAULT["policy"], DEFAULT["commit"], k, s) for s in SCHEDULES if s != DEFAULT["schedule"]
                 for k in ks]
    return runs


def _release(backend: str) -> None:
    gc.collect()
    if backend == "cuda":
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()


def capture_check(art, backend: str, tokens: int) -> dict:
    """Greedy replaying the Primary plan must equal greedy run eager: capture did not disturb in-place state."""
    from mtplab.engine.engine import Engine
    from mtplab.model.prompts import prompt_tokens
    from mtplab.runtime.executor import Slot

    eng = Engine(RunConfig(model=art.config.name, backend=backend, tokens=tokens), art)
    prompt = prompt_tokens(art.config.vocab_size, 8, 0)
    eng.greedy(prompt, tokens)  # warm-up and capture
    planned = eng.greedy(prompt, tokens)
    eager = eng.greedy(prompt, tokens, eager=True)
    st = eng.target.state[Slot.PRIMARY]
    queued, done = replay_queue_time(eng)
    return {
        "identical": planned.tokens == eager.tokens,
        "tokens": tokens,
        "replay_tok_s": measure.tokens_per_s(planned.tokens, tokens, planned.seconds),
        "eager_tok_s": measure.tokens_per_s(eager.tokens, tokens, eager.seconds),
        "captures": st.captures,
        "replays": st.replays,
        "graphs": eng.device.graph_stats(),
        "replays_queued_us": queued,
        "replays_done_us": done,
    }


def replay_queue_time(eng, replays: int = 8, repeats: int = 9) -> tuple[float, float]:
    """Microseconds to hand `replays` replays of the Primary plan over, back to back, and until the device has done
    them (medians): near equal on a device means each replay waits for the device (an onnxruntime whose graph replay
    synchronizes its stream), and the engine's host cannot run ahead of it. Run last: it advances the state."""
    from mtplab.runtime.executor import Slot

    plan, session, backend, sync = (eng.target.state[Slot.PRIMARY].plan, eng.target.sessions[Slot.PRIMARY],
                                    eng.target.backend, eng.device.sync)
    queued, done = [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(replays):
            backend.replay(session, plan)
        t1 = time.perf_counter()
        sync()
        queued.append(t1 - t0)
        done.append(time.perf_counter() - t0)
    return float(np.median(queued) * 1e6), float(np.median(done) * 1e6)


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"


def checked_capture(art, backend: str, tokens: int) -> dict:
    """The capture check, or its failure and the op that failed. Nothing is moved to host memory to get past
    a failure: a host-bound device input is copied once at bind time and a graph would replay that copy forever."""
    from mtplab.model.onnx_read import failing_op

    try:
        return capture_check(art, backend, tokens)
    except Exception as err:  # noqa: BLE001 - reported, and the check goes on to its other parts
        return {"identical": False, "error": _first_line(err), "op": failing_op(err), "replays": 0}


def kernel_check(cfg, backend: str) -> dict:
    """select's replay kernel against the array-module replay, on the same device data."""
    if backend != "cuda":
        return {"checked": False, "why": "the replay kernel is CUDA only; the CPU runs the numpy replay"}
    import cupy

    from mtplab.model.graph import replay_transitions_xp, transition_layout
    from mtplab.runtime.cuda import DeviceReplay

    t = transition_layout(cfg)
    rng = np.random.default_rng(0)
    flat = cupy.asarray(rng.random((1, t.capacity * t.width), dtype=np.float32))
    state = cupy.asarray(rng.standard_normal((1, t.value_heads, t.value_dim, t.key_dim)).astype(np.float32))
    worst, kernel = 0.0, DeviceReplay(t)
    for n in range(1, t.capacity + 1):
        a, b = state.copy(), state.copy()
        kernel(a, flat, n)
        replay_transitions_xp(cupy, b[0], *t.split(flat), n, t.group)
        worst = max(worst, float(cupy.abs(a - b).max()))
    return {"checked": True, "max_abs_diff": worst, "ok": worst <= 1e-5}


def negative_control(art, backend: str, tokens: int) -> dict:
    """The unpinned policy with the signature check off: replays must be counted as hazards."""
    from mtplab.experiment.point import run_point

    run = RunConfig(model=art.config.name, k=3, policy="sibling", validate=False, tokens=tokens, backend=backend)
    try:
        r = run_point(run, art)
    except Exception as err:  # noqa: BLE001 - a crash here is reported, the check still writes its JSON
        return {"hazards": 0, "identical": False, "error": _first_line(err)}
    finally:
        _release(backend)
    return {"hazards": r.slots["verify"]["hazards"], "identical": r.lossless, "verdict": r.verdict}


def _free_bytes(backend: str) -> int | None:
    if backend != "cuda":
        return None
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    return int(cupy.cuda.runtime.memGetInfo()[0])


def k_changing_check(art, backend: str, tokens: int, k: int) -> dict:
    """K changing from step to step (the MTP head's confidence policy) under each Verify plan setting: a plan per M
    must capture once per M used and never invalidate, one padded plan must capture once; both lossless. Each
    setting's plans, their bound bytes, and the device memory its run left taken (its graphs' pools, on CUDA)."""
    from mtplab.experiment.point import run_point

    out = {}
    for plans in ("per-length", "padded"):
        run = RunConfig(model=art.config.name, k=max(k, 2), drafter="mtp", k_policy="confidence", k_confidence=0.9,
                        verify_plans=plans, tokens=tokens, backend=backend, rounds=1)
        before = _free_bytes(backend)
        try:
            r = run_point(run, art)
        except Exception as err:  # noqa: BLE001 - reported; the check goes on
            out[plans] = {"error": _first_line(err), "ok": False}
            continue
        after = _free_bytes(backend)
        verify = r.slots["verify"]
        used = sorted({j + 1 for j in r.k_per_step}) or [run.k + 1]
        want = 1 if plans == "padded" else len(used)
        out[plans] = {"m_used": used, "captures": verify["captures"], "invalidations": verify["invalidations"],
                      "fallbacks": verify["fallbacks"], "identical": r.lossless, "plans": r.extra["plans"]["verify"],
                      "device_bytes_taken": None if before is None else before - after,
                      "ok": bool(r.lossless and verify["captures"] == want and verify["invalidations"] == 0
                                 and verify["fallbacks"] == 0)}
        _release(backend)
    return out


def _row(spec: tuple, r=None, error: BaseException | None = None) -> dict:
    """One run of the check: from its RunResult, or the error that stopped it (and the op it names)."""
    from mtplab.model.onnx_read import failing_op

    preset_name, pol, com, k, schedule = spec
    row = {"preset": preset_name, "policy": pol, "commit": com, "k": k, "schedule": schedule}
    if r is None:
        return row | {
            "error": _first_line(error),
            "op": failing_op(error),
            "identical": False,
            "slots": {},
            "reasons": {},
        }
    return row | {
        "greedy_tok_s": r.greedy_tokens_per_s,
        "spec_tok_s": r.tokens_per_s,
        "speedup": r.speedup,
        "acceptance_length": r.acceptance_length,
        "identical": r.lossless,
        "verdict": r.verdict,
        "slots": r.slots,
        "reasons": r.slot_reasons,
        "graphs": r.arena.get("cuda_graphs", {}),
    }


def _c(c: dict) -> str:
    return f"{c['captures']}/{c['replays']}/{c['fallbacks']}/{c['invalidations']}"


def checks(rows: list[dict]) -> dict[str, bool]:
    """What the CUDA backend must show, from the rows that ran."""
    dv = [r for r in rows if r["schedule"] == DEFAULT["schedule"]]

    def replaying(r):
        s = r["slots"]
        return bool(s) and all(s[x]["replays"] > 0 and s[x]["fallbacks"] == 0 for x in ("primary", "verify"))

    # A commit that re-advances at M=n on Primary invalidates its plan by design (Blocker B).
    pinned = [r for r in dv if r["policy"] in ("sibling-pinned", "shared-max")
              and not COMMITS.get(r["commit"]).primary_multi_token]
    jit = [r for r in dv if r["policy"] == "shared-jit"]
    return {
        "sibling-pinned and shared-max (select, readvance-m1): both slots replay, fallbacks=0": bool(pinned)
        and all(map(replaying, pinned)),
        "shared-jit: the verify capture is declined": bool(jit)
        and all(
            r["slots"] and r["slots"]["verify"]["replays"] == 0 and "declined" in r["reasons"]["verify"] for r in jit
        ),
        "identity true everywhere": bool(rows) and all(r["identical"] for r in rows),
    }


HEADER = (
    "preset  policy          commit             k  sched  greedy tok/s  spec tok/s  speedup  identical  "
    "primary c/r/f/i  verify c/r/f/i  mtp c/r/f/i"
)


def _format(row: dict) -> str:
    head = f"{row['preset']:7} {row['policy']:15} {row['commit']:18} {row['k']}  "
    if "error" in row:
        return head + f"ERROR in op {row['op'] or '(not named)'}: {row['error']}"
    s = row["slots"]
    return head + (
        f"{row['schedule'][:5]:5} "
        f"{row['greedy_tok_s']:12.1f} {row['spec_tok_s']:11.1f} {row['speedup']:7.2f}x  {str(row['identical']):9}  "
        f"{_c(s['primary']):15}  {_c(s['verify']):14}  {_c(s['mtp'])}"
    )


def _run(spec: tuple, art, backend: str, tokens: int) -> dict:
    """One greedy + speculative run of the check; a failure becomes a row with its error."""
    from mtplab.experiment.point import run_point

    name, pol, com, k, schedule = spec
    run = RunConfig(
        model=name, k=k, drafter="mtp", policy=pol, commit=com, schedule=schedule, tokens=tokens, backend=backend
    )
    try:
        return _row(spec, run_point(run, art))
    except Exception as err:  # noqa: BLE001 - one failed run is a result, not the end of the check
        return _row(spec, error=err)
    finally:
        _release(backend)


def _prepare(name: str, backend: str, tokens: int) -> tuple:
    """Build one preset, check the capture protocol and the replay kernel; (artifact, build s, capture, kernel)."""
    from mtplab.engine.models import model_for

    tb = time.perf_counter()
    art = model_for(RunConfig(model=name, backend=backend, tokens=tokens))
    built = time.perf_counter() - tb
    capture = checked_capture(art, backend, min(tokens, 32))
    kernel = kernel_check(art.config, backend)
    if "error" in capture:
        how = f"FAILED in op {capture['op'] or '(not named)'}: {capture['error']}"
    else:
        how = (
            f"{'OK' if capture['identical'] else 'FAIL'} (greedy with graphs == eager, {capture['replays']} replays; "
            f"greedy {capture['replay_tok_s']:.0f} tok/s replayed vs {capture['eager_tok_s']:.0f} eager; "
            f"8 replays queued in {capture['replays_queued_us']:.0f} us, done in {capture['replays_done_us']:.0f} us)"
        )
    print(
        f"{name}: built {art.config.dtype} ({art.config.graph_form} form) in {built:.1f} s; capture check {how}; "
        "select kernel " + (f"max |diff| {kernel['max_abs_diff']:.2e}" if kernel["checked"] else "n/a (CPU)")
    )
    _release(backend)
    return art, built, capture, kernel


def _print_best(rows: list[dict]) -> None:
    best = {}
    for r in (r for r in rows if "error" not in r):
        key = (r["preset"], r["k"])
        if key not in best or r["spec_tok_s"] > best[key]["spec_tok_s"]:
            best[key] = r
    print("\nbest per preset and k (greedy -> spec tok/s):")
    for (name, k), r in sorted(best.items()):
        print(
            f"  {name} k={k}: {r['greedy_tok_s']:.1f} -> {r['spec_tok_s']:.1f} tok/s ({r['speedup']:.2f}x, "
            f"{r['policy']}, {r['commit']}, {r['schedule']})"
        )


def gpu_check(
    presets: list[str], ks: list[int], tokens: int, out: Path, backend: str = "cuda", budget_s: float = 270.0
) -> int:
    """Run the device check; print as it goes; write the JSON; 0 when every check holds."""
    from tqdm import tqdm

    from mtplab.base.files import write_atomic
    from mtplab.cli.doctor import report
    from mtplab.measure.env import environment
    from mtplab.model import PRESETS

    max_k = MAX_TRANSITION_CAPACITY - 1
    unknown = [p for p in presets if p not in PRESETS]
    problems = [f"presets {unknown} unknown (allowed {list(PRESETS)})"] * bool(unknown)
    problems += [f"k={k} outside 1..{max_k}" for k in ks if not 1 <= k <= max_k] + ["no k given"] * (not ks)
    problems += [f"tokens={tokens} < 8"] * (tokens < 8)
    problems += [f"backend {backend!r} not in {list(BACKENDS)}"] * (backend not in BACKENDS)
    problems += [f"budget={budget_s} s: must be a number of seconds > 0"] * (not budget_s > 0 or budget_s == float("inf"))
    if problems:
        raise ValueError("; ".join(problems))
    if backend == "cuda":
        from mtplab.runtime.device import require_cuda

        require_cuda()
    t0 = time.perf_counter()
    doc = {"env": environment(backend), "doctor": report(), "backend": backend, "tokens": tokens}
    prepared = {name: _prepare(name, backend, tokens) for name in presets}
    arts = {name: p[0] for name, p in prepared.items()}
    captures = {name: p[2] for name, p in prepared.items()}
    kernels = {name: p[3] for name, p in prepared.items()}
    rows, skipped = [], []
    print(HEADER)
    for spec in tqdm(plan(presets, ks), desc="gpu-check", unit="run", leave=False, disable=None):
        if time.perf_counter() - t0 > budget_s:
            skipped.append(list(spec))
            continue
        rows.append(_run(spec, arts[spec[0]], backend, tokens))
        tqdm.write(_format(rows[-1]))
    control = negative_control(arts[presets[0]], backend, tokens) if time.perf_counter() - t0 <= budget_s else None
    if control is not None:
        print(
            f"negative control ({presets[0]}, sibling, validation off): hazards={control['hazards']} "
            f"identical={control['identical']} (expected: hazards > 0)"
        )
    changing = k_changing_check(arts[presets[0]], backend, tokens, max(ks)) if (
        time.perf_counter() - t0 <= budget_s) else None
    for plans, c in (changing or {}).items():
        print(f"K changing every step, verify plans {plans}: " + (f"ERROR {c['error']}" if "error" in c else
              f"M used {c['m_used']}, captures {c['captures']}, invalidations {c['invalidations']}, fallbacks "
              f"{c['fallbacks']}, identical {c['identical']}, plans bind " + ", ".join(
                  f"M={p['tokens']} {p['plan_bytes'] / 1024:.1f} KiB" for p in c["plans"])
              + ("" if c["device_bytes_taken"] is None else f", device memory taken {c['device_bytes_taken'] / 2**20:.1f} MiB")))
    result = checks(rows)
    result["K changing every step: a plan per M captured once each, one padded plan once, no invalidation"] = bool(
        changing and all(c["ok"] for c in changing.values()))
    result["negative control: an unpinned replay without validation is detected"] = bool(control and control["hazards"])
    result["capture protocol: greedy with graphs == greedy eager"] = all(c["identical"] for c in captures.values())
    if backend == "cuda":
        result["select replay kernel == array replay"] = all(k["ok"] for k in kernels.values())
    _print_best(rows)
    if skipped:
        print(f"\nSKIPPED {len(skipped)} runs past the {budget_s:.0f} s budget: " + "; ".join(map(str, skipped)))
    print()
    for what, ok in result.items():
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    doc |= {
        "build_seconds": {name: p[1] for name, p in prepared.items()},
        "capture": captures,
        "kernel": kernels,
        "runs": rows,
        "negative_control": control,
        "k_changing": changing,
        "skipped": skipped,
        "checks": result,
        "seconds": time.perf_counter() - t0,
    }
    write_atomic(out, json.dumps(doc, indent=1, default=str))
    print(f"{out}  ({doc['seconds']:.0f} s)")
    return 0 if all(result.values()) and not skipped else 1
