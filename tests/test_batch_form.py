"""Builder folders at batch B > 1 (mtplab.model.batch_form): mtplab's copies of the graphs take each row's query
length, and every row decodes as a batch of one would, checked row by row."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
import pytest

from mtplab.check.lossless import checked_pass
from mtplab.check.verdict import verdict
from mtplab.engine.engine import Engine
from mtplab.engine.fit import batch_problem
from mtplab.experiment.config import RunConfig
from mtplab.model import batch_form as form
from mtplab.model.folders import open_model
from mtplab.model.prompts import run_prompts

DATA = Path(__file__).parent / "data"
N = 24


def _digest(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir()) if f.is_file()}


@pytest.mark.parametrize("folder, commit", [("builder-tiny", "select"), ("builder-tiny", "readvance-batched"),
                                            ("builder-tiny-gdn", "select")])
def test_a_builder_folders_rows_each_decode_as_a_batch_of_one(folder, commit):
    before = _digest(DATA / folder)
    run = RunConfig(model=str(DATA / folder), k=3, commit=commit, batch=2, tokens=N, threads=1, seed=1)
    engine = Engine(run)
    prompts = run_prompts(run, engine.desc.vocab_size)
    checked = checked_pass(engine, prompts, N)
    ok, message = verdict(checked.identity)
    assert ok and "every token in each of its 2 rows" in message, message
    one = Engine(run.replace(batch=1))
    for b in range(2):
        assert one.greedy([int(t) for t in prompts[b]], N).tokens == checked.greedy.tokens[b][:N], f"row {b}"
    assert _digest(DATA / folder) == before  # the copies live in mtplab's cache


def test_the_copies_feed_query_seqlens_to_every_attention_node():
    desc = open_model(DATA / "builder-tiny").description
    assert form.needs_copies(desc)
    copied = form.batch_form(desc)
    assert copied.original_target == desc.original_target and not form.needs_copies(copied)
    for io in (copied.target, copied.mtp):
        assert io.query_seqlens and DATA not in io.path.parents
        model = onnx.load(str(io.path), load_external_data=False)
        attention = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
        assert attention and all(n.input[form.QUERY_SEQLENS_INPUT] == form.QUERY_SEQLENS for n in attention)
        assert form.QUERY_SEQLENS in [i.name for i in model.graph.input]
    assert form.batch_form(copied) is copied


def test_a_runtime_without_query_seqlens_refuses_a_builder_batch(monkeypatch):
    desc = open_model(DATA / "builder-tiny").description
    monkeypatch.setattr(form, "schema_features", lambda: {"gqa_query_seqlens": False})
    why = batch_problem(2, desc)
    assert "needs GroupQueryAttention's query_seqlens" in why and ">= 1.32" in why
    assert batch_problem(1, desc) is None
