"""mtplab.measure.env: what a result says about where it ran, its code's revision included."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mtplab.measure.env import git_revision

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=root, check=True,
                   capture_output=True)


def test_the_revision_says_modified_where_the_package_differs_from_its_commit(tmp_path):
    (tmp_path / "mtplab").mkdir()
    (tmp_path / "mtplab" / "engine.py").write_text("A = 1\n")
    (tmp_path / "README.md").write_text("readme\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "first")
    clean = git_revision(tmp_path)
    assert clean and "+" not in clean
    (tmp_path / "README.md").write_text("edited, outside the package\n")
    assert git_revision(tmp_path) == clean
    (tmp_path / "mtplab" / "engine.py").write_text("A = 2\n")
    assert git_revision(tmp_path) == clean + "+modified"


def test_outside_a_checkout_there_is_no_revision(tmp_path):
    assert git_revision(tmp_path) is None
