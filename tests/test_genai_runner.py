"""genai's loops on the export: it loads in genai, and genai's greedy and MTP tokens equal mtplab's greedy."""

from __future__ import annotations

import pytest

from mtplab.engine.engine import Engine
from mtplab.experiment.config import RunConfig
from mtplab.model.prompts import prompt_tokens

og = pytest.importorskip(
    "onnxruntime_genai", reason="onnxruntime-genai is not installed: pip install 'mtplab[peer]' (make test installs it)"
)

from mtplab.experiment.genai_export import export_genai  # noqa: E402
from mtplab.experiment.genai_runner import GenaiPeer  # noqa: E402


@pytest.fixture(scope="module")
def peer(tiny, tmp_path_factory):
    folder = export_genai(tiny, tmp_path_factory.mktemp("genai"))
    return GenaiPeer(folder)


@pytest.fixture(scope="module")
def reference(tiny):
    prompt = prompt_tokens(tiny.config.vocab_size, 8, 0)
    return prompt, Engine(RunConfig(model="tiny"), tiny).greedy(prompt, 48).tokens


def test_export_loads_in_genai(peer):
    assert peer.main is not None and peer.head is not None


def test_genai_greedy_equals_mtplab_greedy(peer, reference):
    prompt, tokens = reference
    out, _ = peer.greedy(prompt, 48)
    assert out == tokens[: len(out)] and len(out) >= 40  # genai stops early only on its EOS token


@pytest.mark.parametrize("k", [1, 3])
def test_genai_mtp_equals_greedy(peer, reference, k):
    prompt, tokens = reference
    out, _, stats = peer.mtp(prompt, 48, k)
    assert out == tokens[: len(out)] and len(out) >= 40
    assert stats["draft_tokens_evaluated"] > 0
