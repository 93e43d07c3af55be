"""Which RunConfig field values cannot go together: rounds and their auto settings, sampling, batches, draft-length
policies (mtplab.experiment.config.run_problems asks each, with RunConfig's defaults: a field set away from its
default is one a user gave; every problem names the fields and what is allowed)."""

from __future__ import annotations

from mtplab.engine.fit import batch_commit_problem
from mtplab.engine.sampling import FIELDS as SAMPLING_FIELDS
from mtplab.engine.strategies import ACCEPTANCE, DRAFTERS, K_POLICIES
from mtplab.experiment.params import AUTO_ROUNDS, INT64_MAX


def rounds_problems(cfg: dict, default: dict) -> list[str]:
    """The auto rounds' target and budget belong to rounds='auto'."""
    if cfg["rounds"] == "auto":
        return []
    set_apart = [f"{n}={cfg[n]!r}" for n in AUTO_ROUNDS if cfg[n] != default[n]]
    if not set_apart:
        return []
    these = "they size" if len(set_apart) > 1 else "it sizes"
    return [f"{', '.join(set_apart)} with rounds={cfg['rounds']!r}"
            f"{' (the default)' if cfg['rounds'] == default['rounds'] else ''}: {these} "
            f"rounds='auto' only (drop {'them' if len(set_apart) > 1 else 'it'}, or give rounds='auto')"]


def sampling_problems(cfg: dict, default: dict) -> list[str]:
    """Temperature, top-k/top-p, the acceptance rule, the drafter and the engine must agree on sampling."""
    rule, sampled, out = ACCEPTANCE.get(cfg["acceptance"]), cfg["temperature"] > 0, []
    sampling_rules = [r.name for r in ACCEPTANCE.values() if r.samples]
    if sampled and not rule.samples:
        out.append(f"temperature={cfg['temperature']!r} samples, but acceptance={rule.name!r} decodes greedily: use "
                   f"acceptance in {sampling_rules}, or temperature 0")
    if rule.samples and not sampled:
        out.append(f"acceptance={rule.name!r} samples: give temperature > 0 (temperature 0 is greedy decoding, "
                   "acceptance='greedy-match')")
    shaping = [f"{n}={cfg[n]!r}" for n in SAMPLING_FIELDS if n != "temperature" and cfg[n] != default[n]]
    if not sampled and shaping:
        out.append(f"{', '.join(shaping)}: {'they shape' if len(shaping) > 1 else 'it shapes'} sampling, which needs "
                   "temperature > 0")
    drafter = DRAFTERS.get(cfg["drafter"])
    if sampled and not drafter.samples:
        out.append(f"drafter={drafter.name!r} has no distribution to draft from, which rejection sampling needs: at "
                   f"temperature > 0 use drafter in {[d.name for d in DRAFTERS.values() if d.samples]}")
    return out


def k_policy_problems(cfg: dict, default: dict) -> list[str]:
    """A draft-length policy other than fixed chooses K in 1..k (each row of a batch its own); the confidence
    policy reads the drafter's own probabilities; k_confidence belongs to it."""
    kp, out = K_POLICIES.get(cfg["k_policy"]), []
    if cfg["k_confidence"] != default["k_confidence"] and not kp.needs_confidence:
        out.append(f"k_confidence={cfg['k_confidence']!r} with k_policy={kp.name!r}: it is the confidence policy's "
                   "threshold (drop it, or use k_policy='confidence')")
    if kp.name == default["k_policy"]:
        return out
    if cfg["k"] == 1:
        out.append(f"k_policy={kp.name!r} with k=1: k is the most drafts a step may make, so K=1 leaves nothing to "
                   "choose (give k >= 2)")
    if kp.needs_confidence and not DRAFTERS.get(cfg["drafter"]).confident:
        able = [d.name for d in DRAFTERS.values() if d.confident]
        out.append(f"k_policy={kp.name!r} stops drafting on the drafter's own top probability: needs drafter in "
                   f"{able} (got drafter={cfg['drafter']!r})")
    return out


def batch_problems(cfg: dict, default: dict) -> list[str]:
    """What a batch > 1 cannot be combined with (this version: mtplab's engine on the CPU); an alpha per row needs one
    value for each of the batch's rows."""
    alpha, out = cfg["alpha"], []
    if isinstance(alpha, (list, tuple)) and (len(alpha) != cfg["batch"] or cfg["batch"] == 1):
        out.append(f"alpha={tuple(alpha)!r} sets each row's own acceptance: give one value per row of a batch, "
                   f"batch={max(len(alpha), 2)} (got batch={cfg['batch']}), or one alpha for every row")
    for name in ("seed", "sample_seed"):  # row b runs at seed + b: the last row's must be a seed too
        if isinstance(cfg[name], int) and cfg[name] + cfg["batch"] - 1 > INT64_MAX:
            out.append(f"{name}={cfg[name]} with batch={cfg['batch']}: row b runs at {name} + b, and the last row's "
                       f"{cfg[name] + cfg['batch'] - 1} passes 2**63 - 1 (give {name} <= {INT64_MAX - cfg['batch'] + 1})")
    if cfg["batch"] == 1:
        return out
    if why := batch_commit_problem(cfg["commit"], cfg["batch"]):
        out.append(why)
    if cfg["engine"] != "mtplab":
        out.append(f"batch={cfg['batch']} with engine={cfg['engine']!r}: onnxruntime-genai's MtpGenerator refuses any "
                   "batch size but 1; run batch > 1 with engine='mtplab'")
    if cfg["backend"] != "cpu":
        out.append(f"batch={cfg['batch']} runs on backend='cpu' (got backend={cfg['backend']!r}: the row-by-row "
                   "commits and the state copies of rows riding along have run on host arrays only)")
    return out
