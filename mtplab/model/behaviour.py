"""How the built-in model behaves: state sensitivity, margins, and the MTP head fitted to the target.

An untrained model must still behave like the models mtplab studies: its tokens must depend on
the context the recurrent state carries (or a state bug could never change a token), greedy must
keep clear top-1 margins, and the MTP head must agree with the target about as often as trained
heads do. These figures are measured at build time and stored in the manifest.
"""

from __future__ import annotations

import sys

import numpy as np
from tqdm import tqdm

from mtplab.model.config import ModelConfig
from mtplab.model.reference import ReferenceMTP, rmsnorm
from mtplab.model.stepper import Stepper, runnable_providers
from mtplab.model.weights import Weights, mtp_weights

SEEDS = (0, 1, 2, 3, 4)  # prompt seeds the figures are taken over
FIGURE_TOKENS = 64
WARM_POSITIONS = 16  # teacher-forced sensitivity counts positions after this many tokens
PROMPT_LEN = 8
HEAD_RIDGE = 0.05  # relative to the mean diagonal of each fit's Gram matrix
NEARBY_COPIES = 3  # teacher-forced variants of each greedy trace the head is also fitted on


def prompt(cfg: ModelConfig, seed: int, length: int = PROMPT_LEN) -> list[int]:
    """The deterministic prompt for a seed (the same one `mtplab run --seed` uses)."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, cfg.vocab_size, length)]


def _top2(row: np.ndarray) -> float:
    top = np.partition(row.astype(np.float64), -2)[-2:]
    return float(top[1] - top[0])


def greedy_trace(
    step: Stepper, tokens: list[int], n: int, zero_state: bool = False, teacher_forced: bool = True
) -> dict:
    """Greedy decoding of n tokens after `tokens` on a fresh sequence.

    Returns the prompt, tokens, the hidden state of every position that produced one (pre-norm, the
    MTP head's input), top-2 margins, and (teacher_forced) whether zeroing the recurrent state for
    that one forward changes the argmax, which costs a second forward per position.
    zero_state=True zeroes the state before every forward instead.
    """
    step.reset()
    out = step.forward(tokens)
    hidden, margins, flips = [out["hidden"][-1]], [_top2(out["logits"][-1])], []
    gen = [int(out["logits"][-1].argmax())]
    while len(gen) < n:
        if zero_state:
            step.zero_recurrent()
        elif teacher_forced and len(gen) > WARM_POSITIONS:
            flips.append(int(step.forward_without_state(gen[-1]).argmax()))
        out = step.forward([gen[-1]])
        hidden.append(out["hidden"][0])
        margins.append(_top2(out["logits"][0]))
        gen.append(int(out["logits"][0].argmax()))
    changed = [a != b for a, b in zip(flips, gen[WARM_POSITIONS + 1 :])]
    return {"prompt": list(tokens), "tokens": gen, "hidden": np.stack(hidden), "margins": margins, "changed": changed}


def state_sensitivity(step: Stepper, seeds=SEEDS, n: int = FIGURE_TOKENS, head: Weights | None = None) -> dict:
    """Both state-sensitivity figures, per prompt seed, plus margins and variety of greedy text.

    teacher_forced: share of positions after 16 where zeroing the GDN and conv state for that one
    forward (context and KV cache unchanged) changes greedy's argmax. free_running_departure: the
    first position where greedy with the state zeroed before every forward leaves greedy (None:
    never within n). With `head`, also the head's k=1 draft acceptance on the same greedy text.
    """
    cfg = step.cfg
    n = min(n, cfg.max_seq_len - PROMPT_LEN)  # a short KV capacity: as far as it holds
    tf, free, margins, distinct, traces = [], [], [], [], []
    for seed in tqdm(seeds, desc="state sensitivity", leave=False, disable=None):
        ref = greedy_trace(step, prompt(cfg, seed), n)
        traces.append(ref)
        cut = greedy_trace(step, prompt(cfg, seed), n, zero_state=True)
        tf.append(float(np.mean(ref["changed"])))
        free.append(next((i for i, (a, b) in enumerate(zip(ref["tokens"], cut["tokens"])) if a != b), None))
        margins += ref["margins"]
        distinct.append(len(set(ref["tokens"])) / len(ref["tokens"]))
    return {
        "seeds": list(seeds),
        "tokens": n,
        "teacher_forced": tf,
        "free_running_departure": free,
        "margin_median": float(np.median(margins)),
        "margin_p5": float(np.percentile(margins, 5)),
        "distinct_token_share": float(np.mean(distinct)),
    } | ({"head_acceptance_k1": head_acceptance(cfg, head, traces)} if head is not None else {})


def _head_inputs(w: Weights, tokens: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """[norm(embed(next token)), norm(hidden)]: what the head's input projection reads."""
    e = rmsnorm(w["embed"][tokens].astype(np.float64), w["mtp.enorm"].astype(np.float64))
    h = rmsnorm(hidden.astype(np.float64), w["mtp.hnorm"].astype(np.float64))
    return np.concatenate([e, h], axis=-1)


def head_training_text(step: Stepper, tokens: int, length: int = 128) -> list[dict]:
    """Greedy text from the target, `tokens` positions in all, from prompts no experiment uses."""
    n = min(length, step.cfg.max_seq_len - PROMPT_LEN)
    count = -(-tokens // (n - 1))
    seeds = tqdm(range(10_000, 10_000 + count), desc="head fit text", leave=False, disable=None)
    return [greedy_trace(step, prompt(step.cfg, seed), n, teacher_forced=False) for seed in seeds]


def nearby_text(step: Stepper, traces: list[dict], copies: int, share: float = 0.1) -> list[dict]:
    """Teacher-forced variants of greedy text with `share` of its tokens replaced at random.

    One forward over a whole sequence gives a hidden state per position, so these are cheap
    samples of contexts near the ones greedy decoding visits (the head must map any context).
    """
    cfg, out = step.cfg, []
    rng = np.random.default_rng(cfg.seed)
    for _ in range(copies):
        for t in traces:
            P = len(t["prompt"])
            seq = np.asarray(t["prompt"] + t["tokens"], dtype=np.int64)
            swap = rng.random(seq.size) < share
            swap[:P] = False
            seq[swap] = rng.integers(0, cfg.vocab_size, int(swap.sum()))
            step.reset()
            hidden = step.forward(seq)["hidden"]
            out.append({"tokens": [int(x) for x in seq[P:]], "hidden": hidden[P - 1 : -1]})
    return out


def _ridge(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    gram = X.T @ X
    gram[np.diag_indices_from(gram)] += HEAD_RIDGE * np.trace(gram) / len(gram)
    return np.linalg.solve(gram, X.T @ Y).astype(np.float32)


def fit_head(cfg: ModelConfig, head: Weights, traces: list[dict]) -> Weights:
    """The head fitted to the target's own next hidden state, one projection at a time.

    hidden[j] is the target's hidden state where it produced token x[j]. The head reads
    (embed(x[j]), hidden[j]) and should produce what the target produces next (hidden[j+1], whose
    argmax is x[j+1]): the objective an MTP head is trained on. Solved in closed form (ridge), in
    the head's own order: the input projection, then the attention layer's o projection on what is
    left, then the MLP's down projection on what is left after that.
    """
    head = dict(head)
    X = [_head_inputs(head, np.asarray(t["tokens"][:-1]), t["hidden"][:-1]) for t in traces]
    Y = np.concatenate([t["hidden"][1:].astype(np.float64) for t in traces])
    head["mtp.proj"] = _ridge(np.concatenate(X), Y)
    ref = ReferenceMTP(cfg, head)
    x0 = [x @ ref.inner.w["mtp.proj"] for x in X]
    context = [ref.inner.attention_context(x, "mtp.layer.", ref.new_kv(), 0) for x in x0]
    x0, context = np.concatenate(x0), np.concatenate(context)
    head["mtp.layer.o"] = _ridge(context, Y - x0)
    x1 = x0 + context @ head["mtp.layer.o"].astype(np.float64)
    ref = ReferenceMTP(cfg, head)
    head["mtp.layer.down"] = _ridge(ref.inner.mlp_features(x1, "mtp.layer."), Y - x1)
    return head


def head_acceptance(cfg: ModelConfig, head: Weights, traces: list[dict]) -> float:
    """Share of positions where the head's first draft equals the target's next-next token (k=1)."""
    hits = total = 0
    mtp = ReferenceMTP(cfg, head)
    for t in traces:
        toks, hid = np.asarray(t["tokens"]), t["hidden"]
        mtp.kv = mtp.new_kv()
        logits = mtp.forward(toks[:-1], hid[:-1], 0)["logits"]
        hits += int((logits.argmax(-1) == toks[1:]).sum())
        total += len(toks) - 1
    return hits / total


def fitted_head(cfg: ModelConfig, target: Weights, target_model: bytes | str) -> tuple[Weights, dict]:
    """The MTP head fitted to this target, and the model's behaviour figures (for the manifest).

    target: the target's weights (effective ones where quantized); target_model: its ONNX graph.
    """
    providers = runnable_providers()
    if providers is None:
        import onnxruntime

        why = (
            f"onnxruntime {onnxruntime.__version__} has no provider here that runs GatedDeltaNet, so the target "
            "cannot generate the head's training text: MTP head left unfitted, behaviour not measured"
        )
        print(f"WARNING: {why}", file=sys.stderr)
        return mtp_weights(cfg, target), {"measured": False, "why": why}
    step = Stepper(cfg, target_model, providers=providers)
    traces = head_training_text(step, cfg.head_fit_tokens)
    head = fit_head(cfg, mtp_weights(cfg, target), traces + nearby_text(step, traces, NEARBY_COPIES))
    return head, {"measured": True, "provider": providers[0]} | state_sensitivity(step, head=head)
