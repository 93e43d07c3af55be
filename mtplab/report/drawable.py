"""Whether a sweep's points can fill a figure, and, where a notebook asks for one they cannot, what it needs in one
line (the report asks quietly: it shows the figures it can fill). Batch-1 figures see the batch-1 rows only."""

from __future__ import annotations

import functools

import pandas as pd

from mtplab.report import baseline, selection


def markdown(text: str) -> None:
    from IPython.display import Markdown, display

    display(Markdown(text))


NEEDS = {  # what the points must hold for each figure, in words (selection.figures_for's tests)
    "alpha_grid": "oracle points at two alphas or more (a grid over alpha)",
    "every_point": f"2 to {selection.EVERY_POINT_MAX} timed batch-1 points",
    "acceptance": "an oracle or MTP-head point of mtplab's engine",
    "head_by_k": "MTP-head points at two k or more",
    "per_position": "an oracle or MTP-head point at the sweep's largest k",
    "counters": "a point of mtplab's own engine",
    "time_split": f"points on the {selection.SCHEDULE} schedule at one set acceptance",
    "memory": "a point of mtplab's own engine with its arena statistics",
    "peer": "onnxruntime-genai points beside mtplab's",
    "temperature": "points at temperature > 0 beside greedy ones",
    "by_context": "points on a prompt set cut at several context lengths",
    "by_kind": "MTP-head points on a prompt set with prompt kinds",
    "head_prediction": "two MTP-head points or more with a prediction",
    "head_table": "two timed points or more at a measured acceptance",
    "k_policies": "points with a draft-length policy other than fixed",
    "sampled_acceptance": "sampled points with their expected acceptance",
    "batch": "points of mtplab's engine at two batch sizes or more",
    "greedy_draw": f"{baseline.MIN_POINTS} points or more sharing one greedy run, each with an efficiency",
}
quiet: list[bool] = [False]  # True while `show` draws the report's figures: an unfillable one is left out unsaid


def fills(ok: pd.DataFrame, figure: str) -> bool:
    """Whether the points fill the figure; where not, one line says what it needs (unless the report asked)."""
    if selection.figures_for(ok)[figure]:
        return True
    if not quiet[0]:
        not_drawn(figure, len(ok))
    return False


def not_drawn(figure: str, points: int) -> None:
    """The one line a notebook shows where it asked for a figure its points cannot fill."""
    left = left_out[0]
    markdown(f"*Not drawn ({TITLES.get(figure, figure.replace('_', ' '))}): it needs {NEEDS[figure]}, and these {points} "
             f"point{'s' if points != 1 else ''} hold none"
             + (f" ({left} batch point{'s' if left != 1 else ''} left out: the batch section draws "
                f"{'them' if left != 1 else 'it'})" if left else "") + ".*")


TITLES = {"greedy_draw": "each point's efficiency against its own greedy"}  # where a figure's key says too little
left_out: list[int] = [0]  # batch rows a batch-1 recipe was handed and left out (its not-drawn line says so)


def batch_one(recipe):
    """A batch-1 figure's recipe (every figure but the batch section's): it draws the batch-1 rows only, a batch
    row's speedup being over greedy at its own B, wherever it is called from."""

    @functools.wraps(recipe)
    def draw(ok: pd.DataFrame, *args):
        one = selection.batch_one(ok)
        left_out[0] = len(ok) - len(one)
        try:
            return recipe(one, *args)
        finally:
            left_out[0] = 0

    return draw
