"""What an engine asks of a model, refused before any session is made: the commits the model runs, batches, the
memory a batch's state takes. (A run's KV capacity, its tokens and prompt: mtplab.experiment.build.)"""

from __future__ import annotations

import glob
import inspect
from pathlib import Path

import numpy as np

from mtplab.base.memory import meminfo_gib
from mtplab.engine.batch_commits import BATCH_COMMITS
from mtplab.engine.spec import EngineSpec
from mtplab.engine.strategies import ACCEPTANCE, COMMITS
from mtplab.model.batch_form import batch_form_problem
from mtplab.model.config import k_problem
from mtplab.runtime.device import backend_problem


def commits_on(desc, batch: int = 1) -> tuple[list[str], dict[str, str]]:
    """The registered commit strategies this model runs at `batch` rows, and {name: why} for those it refuses."""
    refused = {c.name: why for c in COMMITS.values() if (why := c.refusal(desc) or batch_commit_problem(c.name, batch))}
    return [name for name in COMMITS.names() if name not in refused], refused


def batch_commit_problem(commit: str, batch: int) -> str | None:
    """Why a commit strategy cannot commit `batch` rows, or None: a strategy's own commit (CommitStrategy.prepare)
    holds one sequence, so batch > 1 runs those with a form row by row (mtplab.engine.batch_commits)."""
    if batch == 1 or commit in BATCH_COMMITS:
        return None
    return (f"commit={commit!r} commits one sequence (it has no row-by-row form): batch={batch} runs commit in "
            f"{sorted(BATCH_COMMITS)}")


def acceptance_problem(acceptance: str, batch: int) -> str | None:
    """Why an acceptance rule cannot judge `batch` rows, or None: its methods must take the graph's greedy choice
    (mtplab.model.greedy_outputs: accept's greedy and kept, row_tokens' and draft_rows' greedy); a batch whose rows
    draft different K judges each group of rows apart, telling the rule which rows they are (accept's `rows`); a
    rule whose accept takes no rows judges one sequence."""
    rule = ACCEPTANCE.get(acceptance)
    old = []
    for method, greedy_at in ((rule.accept, 4), (rule.row_tokens, 2), (rule.draft_rows, 2)):
        params = list(inspect.signature(method).parameters)  # a bound method's: self left out
        if len(params) <= greedy_at or params[greedy_at] in ("drawing", "rows"):  # the old form's
            old.append(f"{method.__name__}({', '.join(params)})")
    if old:
        return (f"acceptance={acceptance!r}: {', '.join(old)} take no greedy choice; mtplab passes the graph's: "
                "accept(xp, drafts, logits, greedy, kept, rows=None), row_tokens(xp, rows, greedy), "
                "draft_rows(xp, rows, greedy, drawing=None)")
    params = list(inspect.signature(rule.accept).parameters)
    if batch == 1 or len(params) > 5 or "rows" in params:
        return None
    return (f"acceptance={acceptance!r} judges one sequence (its accept takes no rows): batch={batch} needs "
            "accept(xp, drafts, logits, greedy, kept, rows=None), which judges the rows of a [B, k] batch")


def batch_problem(batch: int, desc) -> str | None:
    """Why a model cannot decode `batch` rows together, or None: every row's M > 1 forward after a past needs per-row
    query lengths (GroupQueryAttention's query_seqlens: the built-in graphs take them, a builder folder's graphs get
    them in mtplab's copies, mtplab.model.batch_form)."""
    if batch == 1:
        return None
    io = desc.target
    if io.lengths == "seqlens" and not (io.query_seqlens and desc.mtp.query_seqlens):
        return (f"batch={batch} on {desc.name}: its graphs take no query_seqlens, so an M > 1 forward after a past "
                "runs batch 1 only; batch > 1 needs the built-in model's graph form with GroupQueryAttention's "
                "query_seqlens (onnxruntime >= 1.32)")
    if why := batch_form_problem(desc):
        return f"batch={batch} on {desc.name}: {why}"
    return None


def state_bytes(desc, batch: int, k: int) -> int:
    """Bytes of the buffers an engine of `batch` rows holds for its sequences: the target's KV and the head's, each
    conv and recurrent state with its verify snapshot (and its own present where the kernel cannot write in place),
    both slots' logits. Weights and onnxruntime's own workspace come on top."""
    kv = sum(2 * kv.heads * desc.capacity * kv.head_dim * kv.np_dtype.itemsize for kv in (*desc.target.kv, *desc.mtp.kv))
    states = sum(int(np.prod(s.shape[1:])) * s.np_dtype.itemsize * (2 if s.in_place else 3) for s in desc.target.states)
    return batch * (kv + states + 2 * (k + 1) * desc.vocab_size * 4)


def graph_bytes(path) -> int:
    """Bytes of a graph's files: the .onnx and its external data beside it (model.onnx.data)."""
    path = Path(path)
    return sum(f.stat().st_size for f in path.parent.glob(glob.escape(path.name) + "*") if f.is_file())


def run_bytes(desc, batch: int, k: int) -> int:
    """Bytes a run of `batch` rows takes beyond its sessions: its state buffers (state_bytes), and the checked pass's
    lossless check, which steps an independent reference session of the target per row (its weights each)."""
    return state_bytes(desc, batch, k) + batch * graph_bytes(desc.target.path)


MEMORY_SHARE = 0.5  # of the available memory, for the state buffers: weights, the calibration's engine, onnxruntime's
# workspace and the checks' copies take the rest


def memory_problem(run: EngineSpec, desc) -> str | None:
    """Why the run's state buffers would not fit in this machine's available memory (the CPU backend), or None."""
    available = meminfo_gib("MemAvailable")
    if run.backend != "cpu" or available is None:
        return None
    need = run_bytes(desc, run.batch, run.k) / 2**30
    if need <= MEMORY_SHARE * available:
        return None
    fits = int(MEMORY_SHARE * available * 2**30 // run_bytes(desc, 1, run.k))
    return (f"batch={run.batch} on {desc.name} needs about {need:.1f} GiB for its state buffers and the lossless check's "
            f"reference per row alone, more than {MEMORY_SHARE:.0%} of the {available:.1f} GiB this machine has "
            f"available: at most about batch={fits} here")


def spec_problems(spec: EngineSpec, desc, strategies: bool = True, also: tuple = ()) -> list[str]:
    """Why an engine of this spec cannot run on the model (empty when it can). strategies: whether its k and commit
    apply (mtplab's own engine; the onnxruntime-genai peer runs neither); also: a caller's problems (or None),
    named after the spec's own and before its batch's."""
    problems = (
        backend_problem(spec.backend, desc),
        k_problem(spec.k, desc.transition_capacity) if strategies and desc.transition_capacity else None,
        COMMITS.get(spec.commit).refusal(desc) if strategies else None,
        COMMITS.get(spec.commit).backend_refusal(spec.backend) if strategies else None,
        batch_commit_problem(spec.commit, spec.batch) if strategies else None,
        acceptance_problem(spec.acceptance, spec.batch) if strategies else None,
        *also,
        batch_problem(spec.batch, desc),
        memory_problem(spec, desc),
    )
    return [problem for problem in problems if problem is not None]


def check_spec_on_model(spec: EngineSpec, desc) -> None:
    """ValueError, before any session is made, if the engine asks what the model cannot do."""
    if problems := spec_problems(spec, desc):
        raise ValueError("; ".join(problems))
