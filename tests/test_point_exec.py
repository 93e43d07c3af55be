"""point_exec: one point through papermill, and a kernel that dies while starting started again."""

from __future__ import annotations

import pytest

from mtplab.experiment.config import RunConfig
from mtplab.sweep import point_exec, store
from mtplab.sweep.grid import Point


class FlakyPapermill:
    """Test double for papermill.execute_notebook: raises the given errors in turn, then runs nothing (no kernel can
    be made to die at start on demand)."""

    def __init__(self, errors: list[Exception]):
        self.errors, self.calls = list(errors), 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


def _execute(monkeypatch, tmp_path, errors: list[Exception]) -> tuple[FlakyPapermill, tuple]:
    import papermill

    double = FlakyPapermill(errors)
    monkeypatch.setattr(papermill, "execute_notebook", double)
    points = tmp_path / "points"
    points.mkdir()
    return double, point_exec.execute_point(Point(RunConfig(model="tiny", tokens=8), 0), str(points), 60, 1)


DIED = "Kernel died before replying to kernel_info"


def test_a_kernel_that_dies_while_starting_is_started_again(monkeypatch, tmp_path):
    double, (_, status, error) = _execute(monkeypatch, tmp_path, [RuntimeError(DIED)])
    assert double.calls == 2
    # the second start ran (this double writes no result): the point's error is the run's, not the kernel's death
    assert status == "failed" and "without writing result.json" in error and DIED not in error


def test_a_kernel_that_never_starts_fails_the_point_saying_how_often(monkeypatch, tmp_path):
    double, (point_id, status, error) = _execute(monkeypatch, tmp_path, [RuntimeError(DIED)] * 5)
    assert double.calls == point_exec.KERNEL_STARTS == 3
    assert status == "failed" and f"{DIED} (the point's kernel died while starting, 3 times)" in error
    assert store.corrupt_reason(tmp_path / "points" / point_id) is None  # its error.json is a finished point's


@pytest.mark.parametrize("error", [RuntimeError("Kernel didn't respond in 60 seconds"), ValueError(DIED)])
def test_other_errors_fail_the_point_at_once(monkeypatch, tmp_path, error):
    double, (_, status, said) = _execute(monkeypatch, tmp_path, [error])
    assert double.calls == 1 and status == "failed" and str(error) in said
