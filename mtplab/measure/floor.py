"""Each timed side held against its floor: the same plans it replayed, replayed bare right after it (no engine,
no check, no counter around them), priced at the side's own replay counts.

A side's host time is its seconds minus its floor. The greedy baseline does little besides its forwards (its
graph's token read and a few feeds per token), so its host time per token must stay within GREEDY_BAND: a slower
greedy would make every speedup look better than it is. A speculative step's host work (drafting, acceptance, commit) is what the
experiment measures, so its band is wide: it flags gross waste only. A point with a side beyond its band is
suspect: its numbers are kept, its speedup is not a finding, `mtplab run` exits non-zero. (A side that took less
than its forwards is the clock audit's: mtplab.check.audit.clock_problems.)

A round's floor is timed right after its side. The band holds the side's fastest round against its second-fastest
floor (the fastest where fewer than 3 rounds ran): a busy machine interrupts a long side far more often than a short
floor, so medians would read the machine's load as host time, while a short floor's very fastest reads low by its
own noise; a side's fastest round still pays all of its own work.
A floor prices only the replays of plans still held when it is timed: where a side ran other forwards (a plan
recaptured at another M, as readvance-batched's Primary is; captures where a policy's buffers move; a pooled
workspace given back) the floor is partial, and the side is not held to a band (`priced_share` says how much).
A point beyond a band runs up to CONFIRM_ROUNDS more paired rounds (a moment of load passes; waste in the decoder
stays) before it is called suspect.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOOR_SHARE = 12  # a side's plans are replayed bare once per this many replays it made (at least once each)
CONFIRM_ROUNDS = 8  # paired rounds more a point runs while a side is beyond its band, before it is called suspect


@dataclass(frozen=True)
class Band:
    """How much host time a side may spend beyond its floor: a share of the floor, an allowance per unit (a greedy
    token, a speculative step) and one per run (its loop's set-up and its last read)."""

    share: float
    allowance_s: float
    per_run_s: float
    unit: str

    def allowed(self, floor_per_unit: float, units: float) -> float:
        """Seconds per unit allowed beyond a floor of floor_per_unit, in a run of `units`."""
        return self.share * floor_per_unit + self.allowance_s + self.per_run_s / units

    def text(self) -> str:
        return (f"{self.share:.0%} of the floor + {self.allowance_s * 1e6:.0f} us a {self.unit} + "
                f"{self.per_run_s * 1e6:.0f} us a run")


GREEDY_BAND = Band(0.10, 12e-6, 50e-6, "token")
SPECULATIVE_BAND = Band(1.0, 2e-3, 1e-3, "step")

# per side, the round sample's keys: its seconds, its floor's seconds, its floor's priced share, its units; its band
SIDES = {"greedy": ("greedy_seconds", "greedy_floor_seconds", "greedy_floor_share", "greedy_counted", GREEDY_BAND),
         "speculative": ("seconds", "floor_seconds", "floor_share", "steps", SPECULATIVE_BAND)}
WHOLE = 0.999  # a floor that prices less of its side's forwards is partial: a lower bound, held to no band


def side_summary(samples: list[dict], side: str) -> dict | None:
    """A side over the rounds that timed its floor: its fastest round's and its second-fastest floor's seconds per unit, the
    host time per unit between them, the band's allowance, the median side / floor, the share of the side's forwards
    its floor prices (the least of any round); None where no round timed one."""
    seconds_key, floor_key, share_key, unit_key, band = SIDES[side]
    rows = [s for s in samples if s.get(floor_key) and s.get(unit_key)]
    if not rows:
        return None
    per = np.array([[s[seconds_key] / s[unit_key], s[floor_key] / s[unit_key]] for s in rows], dtype=np.float64)
    floors = np.sort(per[:, 1])
    # the floor's second fastest from 3 rounds on: a short block's fastest reads low by its own noise (on `small`'s
    # 10 ms forwards by about the band's share), its second much less
    fastest, floor_per = float(per[:, 0].min()), float(floors[1] if len(floors) >= 3 else floors[0])
    share = min(float(s.get(share_key, 1.0)) for s in rows)
    return {"rounds": len(rows), "fastest_per_unit": fastest, "floor_per_unit": floor_per,
            "host_per_unit": fastest - floor_per,
            "allowed_per_unit": band.allowed(floor_per, float(np.median([s[unit_key] for s in rows]))),
            "ratio": float(np.median(per[:, 0] / per[:, 1])),
            "unit": band.unit, "band": band.text(), "priced_share": share}


def held(summary: dict) -> bool:
    """Whether a side's floor (side_summary) priced all of it, so that the side is held to its band."""
    return summary.get("priced_share", 1.0) >= WHOLE


def floor_problems(samples: list[dict]) -> list[str]:
    """Why a point's timing is suspect (empty when each side is within its band of its floor)."""
    out = []
    for side in SIDES:
        s = side_summary(samples, side)
        if s is None:
            continue
        us = 1e6
        if held(s) and s["host_per_unit"] > s["allowed_per_unit"]:
            out.append(f"{side}: {s['host_per_unit'] * us:.1f} us a {s['unit']} beyond the bare replays of its plans in its "
                       f"fastest of {s['rounds']} rounds (its floor {s['floor_per_unit'] * us:.1f} us), more than "
                       f"its band of {s['band']} ({s['allowed_per_unit'] * us:.1f} us): time its decoder does not spend")
    return out
