"""onnxruntime-genai as a side-by-side peer: its greedy and MTP loops on an export (mtplab.experiment.genai_export)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

INSTALL_HINT = "the ort-genai engine needs onnxruntime-genai: pip install 'mtplab[peer]'"


def require_genai():
    try:
        import onnxruntime_genai as og
    except ImportError as err:
        raise ValueError(INSTALL_HINT) from err
    return og


def genai_version() -> str:
    """The installed onnxruntime-genai's version."""
    import importlib.metadata as md

    return md.version("onnxruntime-genai")


class GenaiPeer:
    """og.Generator (greedy, or plain sampling) and og.MtpGenerator (MTP, real head) on an exported model.

    sampling: {"temperature", "top_k", "top_p", "sample_seed"} (RunConfig's fields) to sample, None for greedy;
    genai's own sampler and its own speculative acceptance run then, seeded by sample_seed. Its top-p rule is
    mtplab's (the token whose cumulative probability reaches p is kept); its top_k when none is set is not: genai
    keeps the 50 most likely tokens (its search.top_k default), so mtplab's top_k 0 (off) is passed as the whole
    vocabulary.
    """

    def __init__(self, folder: str | Path, sampling: dict | None = None):
        og = self.og = require_genai()
        self.main, self.head = og.Model(str(Path(folder) / "target")), og.Model(str(Path(folder) / "mtp"))
        self.sampling = sampling
        config = json.loads((Path(folder) / "target" / "genai_config.json").read_text())
        self.vocab_size = int(config["model"]["vocab_size"])

    def _params(self, total: int, k: int | None = None):
        params = self.og.GeneratorParams(self.main)
        if self.sampling is None:
            params.set_search_options(max_length=total, do_sample=False)
        else:
            s = self.sampling
            options = {"max_length": total, "do_sample": True, "temperature": float(s["temperature"]),
                       "random_seed": int(s["sample_seed"])}
            options["top_k"] = int(s["top_k"]) or self.vocab_size  # 0: off, every token (genai's default is 50)
            if s["top_p"] < 1:
                options["top_p"] = float(s["top_p"])
            params.set_search_options(**options)
        if k is not None:
            params.set_speculative_options(max_draft_tokens=k)
        return params

    def first_token(self, prompt: list[int], seed: int) -> int:
        """The token og.Generator chooses after `prompt` with its sampler seeded by `seed` (the peer's sampling
        settings otherwise): one draw from its distribution at the prompt's end."""
        params = self._params(len(prompt) + 2)
        if self.sampling is not None:
            params.set_search_options(random_seed=int(seed))
        gen = self.og.Generator(self.main, params)
        gen.append_tokens(np.asarray(prompt, dtype=np.int32))
        gen.generate_next_token()
        return int(gen.get_next_tokens()[0])

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        """n tokens; the time covers the n - 1 after the prefill's token, as mtplab's greedy."""
        gen = self.og.Generator(self.main, self._params(len(prompt) + n))
        gen.append_tokens(np.asarray(prompt, dtype=np.int32))
        gen.generate_next_token()  # the prompt's forward: timed from the first decode, as mtplab's greedy
        tokens = [int(gen.get_next_tokens()[0])]
        t0 = time.perf_counter()
        while not gen.is_done() and len(tokens) < n:
            gen.generate_next_token()
            tokens.append(int(gen.get_next_tokens()[0]))
        return tokens, time.perf_counter() - t0

    def mtp(self, prompt: list[int], n: int, k: int) -> tuple[list[int], float, dict]:
        """n tokens (max_length stops it: no overshoot); timed from after the prompt's forward."""
        gen = self.og.MtpGenerator(self.main, self.head, self._params(len(prompt) + n, k))
        gen.append_tokens(np.asarray(prompt, dtype=np.int32))
        t0 = time.perf_counter()
        while not gen.is_done():
            gen.generate_next_token()
        seconds = time.perf_counter() - t0
        return [int(t) for t in gen.get_sequence()[len(prompt) :]][:n], seconds, gen.get_stats()
