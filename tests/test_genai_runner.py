"""genai's loops on the export: it loads in genai, genai's greedy and MTP tokens equal mtplab's greedy, and its sampler
draws from the distribution mtplab's sampling computes for the same settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mtplab.engine.engine import Engine
from mtplab.experiment.config import RunConfig
from mtplab.model.prompts import prompt_tokens

og = pytest.importorskip(
    "onnxruntime_genai", reason="onnxruntime-genai is not installed: pip install 'mtplab[peer]' (make test installs it)"
)

from mtplab.engine.models import model_for  # noqa: E402
from mtplab.engine.sampling import Sampling  # noqa: E402
from mtplab.experiment.genai_export import export_genai  # noqa: E402
from mtplab.experiment.genai_point import exported  # noqa: E402
from mtplab.experiment.genai_runner import GenaiPeer  # noqa: E402
from mtplab.measure import stats  # noqa: E402


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


PYCODE = Path(__file__).parents[1] / "models" / "pycode"
DRAWS = 1500  # first tokens per setting; each setting's verdict is fixed by its seeds 0..DRAWS-1
FALSE_ALARM = 1e-3  # a test of one setting fails where genai's draws are this unlikely under mtplab's distribution


@pytest.fixture(scope="module")
def pycode_row():
    """pycode's logits at the end of a held-out prompt, and the prompt: a trained head's peaked distribution."""
    art = model_for(RunConfig(model=str(PYCODE)))
    prompt = prompt_tokens(art.description.vocab_size, 8, 3)
    logits = np.array(Engine(RunConfig(model=str(PYCODE), k=1), art).start(prompt)["logits"][0, -1])
    return art, prompt, logits


@pytest.mark.parametrize("top_k, top_p", [(0, 0.8), (0, 1.0), (5, 0.8)])
def test_genais_sampler_draws_from_mtplabs_distribution(pycode_row, top_k, top_p):
    """At temperature 0.7 genai's first sampled token follows Sampling.probs for the same top_k and top_p (top-p
    keeps the token whose cumulative probability reaches p, in both)."""
    art, prompt, logits = pycode_row
    settings = {"temperature": 0.7, "top_k": top_k, "top_p": top_p, "sample_seed": 0}
    peer = GenaiPeer(exported(art, 1), settings)
    counts = np.bincount([peer.first_token(prompt, seed) for seed in range(DRAWS)], minlength=logits.shape[0])
    probs = Sampling(0.7, top_k, top_p).probs(np, logits[None])[0]
    assert stats.goodness_of_fit(counts, probs) > FALSE_ALARM


def test_genais_default_top_k_of_50_is_told_apart(pycode_row):
    """The test above has power: genai left to its own top_k (50) at top_p 0.8 is not mtplab's top_k 0."""
    art, prompt, logits = pycode_row
    peer = GenaiPeer(exported(art, 1), {"temperature": 0.7, "top_k": 0, "top_p": 0.8, "sample_seed": 0})
    peer.vocab_size = 50  # test double of the peer before the fix: genai's default top_k
    counts = np.bincount([peer.first_token(prompt, seed) for seed in range(DRAWS)], minlength=logits.shape[0])
    assert stats.goodness_of_fit(counts, Sampling(0.7, 0, 0.8).probs(np, logits[None])[0]) < FALSE_ALARM
