"""The greedy choice inside the graph: ArgMax tokens and the count of leading drafts equal to them, on a graph whose
logits are its input (so any logits, ties and all, can be tried)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mtplab.model.greedy_outputs import ACCEPTED, TOKENS, append_greedy_outputs


def _session(elem: int = TensorProto.FLOAT, counts: bool = True) -> ort.InferenceSession:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["scores"], ["logits"])], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "M"]),
         helper.make_tensor_value_info("scores", elem, ["B", "M", "V"])],
        [helper.make_tensor_value_info("logits", elem, ["B", "M", "V"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    append_greedy_outputs(model, "input_ids", "logits", counts)
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _expected(ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tokens = logits.argmax(-1)
    counts = [next((i for i in range(ids.shape[1] - 1) if ids[b, i + 1] != tokens[b, i]), ids.shape[1] - 1)
              for b in range(ids.shape[0])]
    return tokens, np.array(counts)


@pytest.mark.parametrize("elem, dtype", [(TensorProto.FLOAT, np.float32), (TensorProto.FLOAT16, np.float16)])
def test_the_graph_chooses_as_numpys_argmax_and_counts_the_drafts_it_agrees_with(elem, dtype):
    session, rng = _session(elem), np.random.default_rng(0)
    for _ in range(200):
        B, M, V = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(2, 5))
        logits = rng.integers(0, 3, (B, M, V)).astype(dtype)  # few values: ties everywhere
        tokens = logits.argmax(-1)
        ids = rng.integers(0, V, (B, M))
        agree = rng.random(B) < 0.5  # half the rows draft what the graph chooses: every draft kept
        ids[agree, 1:] = tokens[agree, :-1]
        got_tokens, got_counts = session.run([TOKENS, ACCEPTED], {"input_ids": ids, "scores": logits})
        want_tokens, want_counts = _expected(ids, logits)
        assert got_tokens.tolist() == want_tokens.tolist() and got_counts.tolist() == want_counts.tolist()
        assert (got_counts[agree] == M - 1).all()


def test_a_decode_of_one_token_keeps_no_drafts():
    tokens, counts = _session().run([TOKENS, ACCEPTED], {"input_ids": np.array([[5], [6]]),
                                                         "scores": np.eye(3, dtype=np.float32)[[[2], [0]]]})
    assert tokens.tolist() == [[2], [0]] and counts.tolist() == [0, 0]


def test_a_head_graph_outputs_its_tokens_and_counts_nothing():
    session = _session(counts=False)  # as a head graph (GraphIO.counts=False) is made
    assert [o.name for o in session.get_outputs()] == ["logits", TOKENS]
    (tokens,) = session.run([TOKENS], {"input_ids": np.array([[1, 2]]), "scores": np.eye(3, dtype=np.float32)[[[2, 1]]]})
    assert tokens.tolist() == [[2, 1]]


def test_a_graph_older_than_the_appended_ops_is_refused_with_its_opset():
    graph = helper.make_graph([helper.make_node("Identity", ["scores"], ["logits"])], "old",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "M"]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", "M", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "M", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    with pytest.raises(ValueError, match=r"old imports ONNX opset 9; mtplab appends its greedy choice with ops of "
                                         r"opset 13 or later"):
        append_greedy_outputs(model, "input_ids", "logits")
    assert len(model.graph.node) == 1  # nothing appended
