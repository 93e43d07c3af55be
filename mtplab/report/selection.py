"""Which rows of a sweep (see store.load) each figure, table and finding is computed on.

The plots draw what these select and the findings state numbers over the same rows, so a figure
and the sentence about it always speak of the same points.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from mtplab.engine.strategies import DRAFTERS
from mtplab.experiment.config import defaults

COUNTERS = ("captures", "replays", "fallbacks", "invalidations", "hazards")
SLOTS = ("primary", "verify", "mtp")
PINNED = defaults()["policy"]  # the policy a figure of one policy shows when the sweep has it
SCHEDULE = defaults()["schedule"]  # the schedule figures of one schedule show
COMMIT = defaults()["commit"]  # the commit figures of one commit show when the sweep has it


def ran(df: pd.DataFrame) -> pd.DataFrame:
    """The points that ran (ok, or a mismatch: their lossless check failed): a failed point measured nothing."""
    return df[df.status != "failed"] if "status" in df else df


def acceptance_source(drafter: str) -> str | None:
    """Where a drafter's acceptance comes from ("setting": its alpha; "calibration": the MTP head's, measured);
    None for a drafter this process has not registered."""
    kind = DRAFTERS.find(drafter)
    return kind.acceptance if kind is not None else None


def set_acceptance(df: pd.DataFrame) -> pd.DataFrame:
    """Greedy-decoding rows whose drafter's acceptance is a setting (the oracle's alpha): what the alpha figures
    sweep (at temperature > 0 the oracle's acceptance is its mixture's, drawn by `sampled_acceptance`)."""
    df = greedy_decoding(df)
    return df[df.drafter.map(acceptance_source) == "setting"] if len(df) else df


def measured_acceptance(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose drafter's acceptance is measured (the MTP head's)."""
    return df[df.drafter.map(acceptance_source) == "calibration"] if len(df) else df


def parse_json(col: pd.Series) -> pd.Series:
    """A JSON column (JSON text per row, see result.JSON_COLUMNS) as Python values."""
    return col.map(lambda v: json.loads(v) if isinstance(v, str) else v)


def own_engine(df: pd.DataFrame) -> pd.DataFrame:
    """mtplab's own rows (a sweep without an engine column has no others)."""
    return df[df.engine == "mtplab"] if "engine" in df else df


def own_head(df: pd.DataFrame) -> pd.DataFrame:
    """mtplab's own greedy-decoding runs with the model's own MTP head at a fixed k (not the onnxruntime-genai peer;
    sampled rows are drawn against temperature, draft-length policies against the fixed K: k_policy_rows)."""
    engine = df.engine if "engine" in df else pd.Series("mtplab", index=df.index)
    return measured_acceptance(greedy_decoding(fixed_k(df[engine == "mtplab"])))


def fixed_k(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that drafted k every step (the fixed draft-length policy; every row of a sweep from before policies)."""
    return df[df.k_policy.fillna("fixed") == "fixed"] if "k_policy" in df else df


def greedy_decoding(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that decode greedily (temperature 0; every row of a sweep from before sampling)."""
    return df[temperatures(df) == 0] if len(df) else df


def peer_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The onnxruntime-genai peer's greedy-decoding rows, what the side-by-side compares (none when the sweep has no
    engine column; its sampled rows are drawn against temperature)."""
    return greedy_decoding(df[df.engine == "ort-genai"]) if "engine" in df else df.iloc[:0]


def own_head_beside_peer(df: pd.DataFrame) -> pd.DataFrame:
    """mtplab's greedy-decoding MTP-head rows shown next to the peer: the pinned policy's when the sweep has it, and
    one commit's where it ran several (one_series)."""
    own = own_head(df)
    own = own[own.policy == PINNED] if PINNED in set(own.policy) else own
    return one_of(own, "commit", COMMIT)[0]


def one_of(rows: pd.DataFrame, col: str, prefer: str = "") -> tuple[pd.DataFrame, str | None]:
    """The rows of one value of `col` where a sweep ran several (`prefer` when it ran it, else the value with the most
    rows), and that value (None when there was nothing to choose)."""
    if col not in rows or rows[col].fillna("").nunique() <= 1:
        return rows, None
    values = rows[col].fillna("")
    pick = prefer if prefer in set(values) else values.value_counts().index[0]
    return rows[values == pick], pick


def one_series(rows: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The rows of one commit and one prompt set, where a sweep ran several (the default commit, else the one with
    the most rows; the prompt set with the most rows), and those choices in words ("" when there was nothing to
    choose)."""
    said = []
    for col, prefer, name in (("commit", COMMIT, "commit"), ("prompts", "", "prompt set")):
        rows, pick = one_of(rows, col, prefer)
        if pick is not None:
            said.append(f"{name} {pick or 'random'}")
    return rows, ", ".join(said)



def alpha_grid(df: pd.DataFrame) -> pd.DataFrame:
    """Oracle points of the (policy, commit) pair swept over the most alphas: the k x alpha grid."""
    o = set_acceptance(df)
    if o.empty:
        return o
    best = o.groupby(["policy", "commit"])["alpha"].nunique().idxmax()
    return o[(o.policy == best[0]) & (o.commit == best[1])]


def policy_grid(df: pd.DataFrame) -> pd.DataFrame:
    """Oracle points of the default schedule at the (k, alpha) swept over the most policies: the policy x commit grid."""
    o = set_acceptance(df[df.schedule == SCHEDULE])
    if o.empty:
        return df
    k, alpha = o.groupby(["k", "alpha"])["policy"].nunique().idxmax()
    return o[(o.k == k) & (o.alpha == alpha)]


def split_points(df: pd.DataFrame) -> pd.DataFrame:
    """Oracle points of the default schedule whose step time split is compared across commit strategies.

    The pinned policy's when the sweep has it, at the k where the most commit strategies ran (then the
    most points, then the smallest k): a figure that compares strategies needs them all at one k.
    """
    s = set_acceptance(df[df.schedule == SCHEDULE])
    if PINNED in set(s.policy):
        s = s[s.policy == PINNED]
    if s.empty:
        return s
    per_k = s.groupby("k").agg(commits=("commit", "nunique"), points=("commit", "size"))
    k = per_k.sort_values(["commits", "points"], ascending=False, kind="stable").index[0]
    return s[s.k == k]


def counters_long(df: pd.DataFrame) -> pd.DataFrame:
    """Per-slot counters of the policy x commit grid in long form (policy, commit, slot, counters)."""
    rows = []
    for _, r in policy_grid(df).iterrows():
        for slot in ("primary", "verify"):
            if f"slots.{slot}.replays" in r and pd.notna(r[f"slots.{slot}.replays"]):
                rows.append(
                    {
                        "policy": r.policy,
                        "commit": r.commit,
                        "slot": slot,
                        **{c: r[f"slots.{slot}.{c}"] for c in COUNTERS},
                    }
                )
    return pd.DataFrame(rows)


def peak_arena_mib(df: pd.DataFrame) -> pd.Series:
    """Per row: peak MiB held by all mtplab arenas (named buffers, pool blocks, persistent state)."""
    return parse_json(df.arena).map(lambda a: sum(v.get("peak_bytes", v["bytes_held"]) for v in a.values()) / 2**20)


def temperatures(df: pd.DataFrame) -> pd.Series:
    """Each row's sampling temperature (0 for sweeps from before sampling existed)."""
    return df.temperature.fillna(0.0) if "temperature" in df else pd.Series(0.0, index=df.index)


def temperature_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The MTP head's rows of mtplab and of the onnxruntime-genai peer, where the sweep varies the temperature."""
    head = measured_acceptance(df)
    return head if temperatures(head).nunique() >= 2 else head.iloc[:0]


def context_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The MTP head's greedy rows on a prompt set cut to a context length, where the sweep varies that length."""
    if "context" not in df or "accepted_per_step" not in df:
        return df.iloc[:0]
    head = own_head(df)
    head = head[head.context.fillna(0) > 0]
    return head if head.context.nunique() >= 2 else head.iloc[:0]


def kind_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The MTP head's greedy rows on whole rows of a model's prompt sets, where the sweep runs two kinds or more."""
    if "prompts" not in df or "accepted_per_step" not in df:
        return df.iloc[:0]
    head = own_head(df)
    context = head.context.fillna(0) if "context" in head else pd.Series(0, index=head.index)
    head = head[(head.prompts.fillna("") != "") & (context == 0)]
    return head if head.prompts.nunique() >= 2 else head.iloc[:0]


def k_policy_rows(df: pd.DataFrame) -> pd.DataFrame:
    """mtplab's timed rows where the sweep ran a draft-length policy other than fixed (with the fixed rows beside)."""
    if "k_policy" not in df or "accepted_per_step" not in df:
        return df.iloc[:0]
    own = timed_points(own_engine(df)).assign(k_policy=lambda d: d.k_policy.fillna("fixed"))
    return own if (own.k_policy != "fixed").any() else own.iloc[:0]


def head_prediction_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The MTP head's greedy rows with a measured speedup and the cost model's price for the steps they made."""
    if "predicted.speedup" not in df:
        return df.iloc[:0]
    head = timed_points(own_head(df))
    return head[np.isfinite(pd.to_numeric(head["predicted.speedup"], errors="coerce").astype(float))]


SAMPLED = "theory.sampled_acceptance."  # a sampled point's expected and measured acceptance (its checked run)


def sampled_rows(df: pd.DataFrame) -> pd.DataFrame:
    """mtplab's sampled rows that report rejection sampling's expected acceptance beside the measured one."""
    col = SAMPLED + "expected"
    return own_engine(df)[lambda d: d[col].notna()] if col in df and len(df) else df.iloc[:0]


EVERY_POINT_MAX = 60  # rows the every-point figure holds readably; a larger sweep is read from its tables


def timed_points(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with a finite speedup (what the every-point figure draws)."""
    if "speedup" not in df or not len(df):
        return df.iloc[:0]
    return df[np.isfinite(pd.to_numeric(df.speedup, errors="coerce").astype(float))]


def figures_for(df: pd.DataFrame) -> dict[str, bool]:
    """Which standard figures this sweep's points can fill (a report shows only those: no empty panels)."""
    own = own_engine(df)
    g = alpha_grid(own)
    top_k = own.k.max() if len(own) else None
    split = set_acceptance(own[own.schedule == SCHEDULE])
    return {
        "alpha_grid": g.alpha.nunique() >= 2,  # a curve against alpha needs two alphas at least
        "every_point": 2 <= len(timed_points(batch_one(df))) <= EVERY_POINT_MAX,
        "acceptance": len(g) > 0 or len(own_head(own)) > 0,
        "head_by_k": own_head(own).k.nunique() >= 2 if len(own) else False,
        "per_position": len(g[g.k == top_k]) > 0 or len(own_head(own)[lambda m: m.k == top_k]) > 0,
        "counters": len(own) > 0,
        "time_split": len(split) > 0,
        "memory": len(own) > 0 and "arena" in own,
        "peer": len(peer_rows(df)) > 0,
        "temperature": len(temperature_rows(df)) > 0,
        "by_context": len(context_rows(df)) > 0,
        "by_kind": len(kind_rows(df)) > 0,
        "head_prediction": len(head_prediction_rows(df)) >= 2,
        "head_table": len(timed_points(measured_acceptance(df))) >= 2,
        "k_policies": len(k_policy_rows(df)) > 0,
        "sampled_acceptance": len(sampled_rows(df)) > 0,
        "batch": len(batch_rows(df)) > 0,
    }


def batches(df: pd.DataFrame) -> pd.Series:
    """Each row's batch B (1 for sweeps from before batches)."""
    return df.batch.fillna(1).astype(int) if "batch" in df else pd.Series(1, index=df.index)


def batch_one(df: pd.DataFrame) -> pd.DataFrame:
    """The rows at batch 1: what every figure but the batch figure compares (a batch row's speedup is over greedy
    at its own B)."""
    return df[batches(df) == 1] if len(df) else df


def batch_rows(df: pd.DataFrame) -> pd.DataFrame:
    """mtplab's rows of a sweep over two batch sizes or more (each drafter setting, k, schedule and commit drawn
    against B), with `setting`: the drafter in words, and the temperature where it samples ("oracle alpha=0.7",
    "MTP head", "MTP head, T=0.7")."""
    own = own_engine(df)
    if batches(own).nunique() < 2:
        return own.iloc[:0].assign(setting=pd.Series(dtype=str))
    temperature = own.temperature if "temperature" in own else pd.Series(0.0, index=own.index)
    setting = [(f"oracle alpha={a:g}" if acceptance_source(d) == "setting" else "MTP head" if acceptance_source(d) ==
                "calibration" else str(d)) + (f", T={t:g}" if t > 0 else "")
               for d, a, t in zip(own.drafter, own.alpha, temperature.fillna(0.0))]
    return own.assign(batch=batches(own), setting=setting)


def models(df) -> list[str]:
    """The models a sweep's rows ran on, by name (store.load's model_name); [] for a frame without them."""
    return sorted(df.model_name.unique()) if "model_name" in df and len(df) else []
