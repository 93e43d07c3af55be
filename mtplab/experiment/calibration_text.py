"""A calibration (mtplab.experiment.calibrate) as text: what `mtplab calibrate` prints and the report quotes."""

from __future__ import annotations


def format_table(calib: dict) -> str:
    """The calibration as text: T(M) and T(M)/T(1), the head step, commit costs per n."""
    t1 = calib["target"]["1"]
    lines = [
        f"calibration  preset={calib['key']['preset']} threads={calib['key']['threads']} "
        f"onnxruntime={calib['key']['onnxruntime']} repeats={calib['repeats']}"
        + (f" batch={calib['batch']} (every time below is one [B, *] forward, step or commit)" if calib.get("batch") else ""),
        "  M        " + " ".join(f"{m:>8}" for m in calib["target"]),
        "  T(M) ms  " + " ".join(f"{v * 1e3:8.3f}" for v in calib["target"].values()),
        "  T(M)/T(1)" + " ".join(f"{v / t1:8.2f}" for v in calib["target"].values()),
        f"  head step {calib['head'] * 1e3:.3f} ms ({calib['head'] / t1:.2f} T(1))",
    ]
    if calib.get("target_fallbacks"):
        lines.insert(3, f"  WARNING: {calib['target_fallbacks']} of the timed forwards above ran eager (a declined capture): "
                        "T(M) holds fallback costs")
    if calib.get("eager"):
        eager = calib["eager"]
        lines.insert(4, "  eager ms  " + " ".join(f"{eager[m] * 1e3:8.3f}" for m in calib["target"] if m in eager))
        lines.insert(5, "  eager/T(M)" + " ".join(f"{eager[m] / v:8.2f}" for m, v in calib["target"].items() if m in eager))
    if calib.get("copy_target"):
        copy = calib["copy_target"]["1"]
        lines.append(f"  T(1) on mtplab's copy {copy * 1e3:.3f} ms ({copy / t1:.2f} T(1)): a shared policy's Primary; T(1) "
                     "above is the user's graph (Primary given a session of its own), T(M > 1) the copy's (Verify)")
    if calib.get("draft"):
        lines.append("  draft phase k=1..{} ms ".format(len(calib["draft"]))
                     + " ".join(f"{v * 1e3:.3f}" for v in calib["draft"].values()))
    if calib.get("greedy_token"):
        lines.append(f"  greedy per token {calib['greedy_token'] * 1e3:.3f} ms ({calib['greedy_token'] / t1:.2f} T(1): "
                     "its loop's host work included)")
    for strategy, costs in (calib.get("verify") or {}).items():
        lines.append(f"  verify {strategy:17} M=2..{1 + len(costs)} ms " + " ".join(f"{v * 1e3:.3f}" for v in costs.values())
                     + "  (its own graph's verify, in place of T(M))")
    for strategy, costs in calib["commit"].items():
        lines.append(f"  commit {strategy:17} n=1..{len(costs)} ms " + " ".join(f"{v * 1e3:.3f}" for v in costs.values()))
    for strategy, why in calib.get("commits_skipped", {}).items():
        lines.append(f"  commit {strategy:17} not measured: {why}")
    acc = calib.get("mtp_acceptance")
    if acc is None:  # a batch calibration: the head's acceptance is the batch-1 calibration's
        return "\n".join(lines)
    lines.append(
        f"  MTP head acceptance (seeds {list(acc['seeds'])}): alpha {acc['alpha']:.3f}, "
        "P(accepted>=i) " + " ".join(f"{p:.2f}" for p in acc["per_position"])
    )
    return "\n".join(lines)
