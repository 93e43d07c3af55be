"""Export the trained model with onnxruntime-genai's model builder and check the export.

    .venv-train/bin/python train/export.py [--ckpt train/work/ckpt.pt]

1. HF checkpoint (train/work/export/hf): the trunk as Qwen3_5ForConditionalGeneration (the architecture the
   builder knows for Qwen3.5) with a one-layer vision tower the builder ignores, the LM head written untied
   (lm_head.weight = the embedding), `mtp_num_hidden_layers: 1` in text_config, and the mtp.* tensors added to
   model.safetensors (transformers does not save them).
2. `python -m onnxruntime_genai.models.builder -i HF -o train/work/export/onnx -p fp32 -e cpu -c CACHE`,
   then copies (not links) of model.onnx(+.data), mtp.onnx(+.data), genai_config.json into models/pycode.
3. Checks (fail loudly): torch vs ONNX Runtime logits of model.onnx on held-out rows; the torch MTP head vs
   mtp.onnx (logits and argmax); og.Model loads the folder and og.Generator greedy equals a torch greedy loop.
   Results: train/work/export_checks.json (card.py puts them in the model card).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from common import OUT, WORK, heldout_windows, load_checkpoint, load_stream
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

LOGIT_ATOL = 1e-3   # a logit check passes when max abs diff <= LOGIT_ATOL or max abs diff / max |logit| <= LOGIT_RTOL
LOGIT_RTOL = 1e-4
HIDDEN_ATOL = 1e-3
HEAD_SIZE = [0]  # set from genai_config.json
SHIPPED = ["model.onnx", "model.onnx.data", "mtp.onnx", "mtp.onnx.data", "genai_config.json"]


def hf_checkpoint(trunk, mtp, folder: Path) -> None:
    text = trunk.config.to_dict()
    for k in ("architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path"):
        text.pop(k, None)
    text.update(tie_word_embeddings=False, mtp_num_hidden_layers=1)
    H = trunk.config.hidden_size
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=H, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                        image_token_id=2044, video_token_id=2045, vision_start_token_id=2046, vision_end_token_id=2047)
    torch.manual_seed(0)
    full = Qwen3_5ForConditionalGeneration(cfg)
    sd = {}
    for k, v in trunk.state_dict().items():
        if k.startswith("model."):
            sd["model.language_model." + k[len("model."):]] = v
    sd["lm_head.weight"] = trunk.model.embed_tokens.weight.detach().clone()
    missing, unexpected = full.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.startswith("model.visual.")]
    if missing or unexpected:
        raise SystemExit(f"trunk -> Qwen3_5ForConditionalGeneration: missing {missing}, unexpected {unexpected}")
    shutil.rmtree(folder, ignore_errors=True)
    full.save_pretrained(folder)
    st = folder / "model.safetensors"
    tensors = load_file(st)
    for k, v in mtp.state_dict().items():
        tensors["mtp." + k] = v.detach().clone().contiguous()
    tensors["lm_head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, st, metadata={"format": "pt"})
    cj = json.loads((folder / "config.json").read_text())
    if cj["text_config"].get("mtp_num_hidden_layers") != 1:  # make sure it survived save_pretrained
        cj["text_config"]["mtp_num_hidden_layers"] = 1
        (folder / "config.json").write_text(json.dumps(cj, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(OUT / f, folder / f)


def run_builder(hf: Path, onnx_dir: Path, cache: Path) -> str:
    shutil.rmtree(onnx_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(onnx_dir),
           "-p", "fp32", "-e", "cpu", "-c", str(cache)]
    print(" ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    (WORK / "export" / "builder.log").write_text(r.stdout + "\n" + r.stderr)
    if r.returncode:
        raise SystemExit(f"builder failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return " ".join(cmd)


def feeds_for(sess: ort.InferenceSession, ids: np.ndarray, extra: dict) -> dict:
    """Prefill feeds: empty past for attention layers, zero conv/recurrent states."""
    B, S = ids.shape
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones((B, S), np.int64),
             "position_ids": np.broadcast_to(np.arange(S, dtype=np.int64), (3, B, S)).copy()}
    feeds.update(extra)
    for i in sess.get_inputs():
        if i.name in feeds:
            continue
        dims = {"batch_size": B, "kv_cache_dim": HEAD_SIZE[0]}  # kv_cache_dim: the head size
        shape = [dims.get(d, 0) if isinstance(d, str) else d for d in i.shape]
        if ".conv" in i.name or ".recurrent" in i.name:
            assert all(isinstance(d, int) for d in shape), (i.name, i.shape)
        feeds[i.name] = np.zeros(shape, np.float32)
    return feeds


def check_onnx(trunk, mtp, folder: Path, rows: torch.Tensor) -> dict:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    main = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
    head = ort.InferenceSession(str(folder / "mtp.onnx"), so, providers=["CPUExecutionProvider"])
    res = {"rows": int(rows.shape[0]), "tokens_per_row": int(rows.shape[1]), "main": {}, "mtp": {}}
    lmax = lrel = hmax = hscale = 0.0
    agree = total = 0
    mmax = mrel = 0.0
    magree = mtotal = 0
    near_ties = []
    for r in rows:
        ids = r.unsqueeze(0)
        with torch.no_grad():
            h = trunk.model(input_ids=ids).last_hidden_state
            logits = trunk.lm_head(h)
        out = dict(zip([o.name for o in main.get_outputs()], main.run(None, feeds_for(main, ids.numpy(), {}))))
        ol, oh = out["logits"], out["hidden_states"]
        tl = logits.numpy()
        lmax = max(lmax, float(np.abs(ol - tl).max()))
        lrel = max(lrel, float(np.abs(ol - tl).max() / np.abs(tl).max()))
        hmax = max(hmax, float(np.abs(oh - h.numpy()).max()))
        hscale = max(hscale, float(np.abs(h.numpy()).max()) / 100)  # hidden tolerance: 1e-3 per 100 of |h|max
        agree += int((ol.argmax(-1) == tl.argmax(-1)).sum())
        total += tl.shape[1]
        # the head on the same inputs: pairs (t_{i+1}, h_i) at position i, from the torch trunk's hidden
        L = ids.shape[1] - 1
        with torch.no_grad():
            ml, _ = mtp(trunk, ids[:, 1:], h[:, :L], torch.arange(L).unsqueeze(0))
        hout = dict(zip([o.name for o in head.get_outputs()],
                        head.run(None, feeds_for(head, ids[:, 1:].numpy(), {"hidden_states": h[:, :L].numpy()}))))
        hl, tml = hout["logits"], ml.numpy()
        mmax = max(mmax, float(np.abs(hl - tml).max()))
        mrel = max(mrel, float(np.abs(hl - tml).max() / np.abs(tml).max()))
        a, b = hl.argmax(-1)[0], tml.argmax(-1)[0]
        magree += int((a == b).sum())
        mtotal += L
        for j in np.nonzero(a != b)[0]:
            top2 = np.sort(tml[0, j])[-2:]
            near_ties.append(float(top2[1] - top2[0]))
    res["main"] = {"logits_max_abs_diff": lmax, "logits_max_rel_diff": lrel, "hidden_max_abs_diff": hmax,
                   "argmax_agreement": agree / total, "tolerance_abs": LOGIT_ATOL,
                   "tolerance_rel": LOGIT_RTOL, "hidden_tolerance_abs": HIDDEN_ATOL}
    res["mtp"] = {"logits_max_abs_diff": mmax, "logits_max_rel_diff": mrel, "argmax_agreement": magree / mtotal,
                  "disagreements_top2_gap": near_ties, "tolerance_abs": LOGIT_ATOL,
                  "tolerance_rel": LOGIT_RTOL}
    print(json.dumps(res, indent=1))
    if (lmax > LOGIT_ATOL and lrel > LOGIT_RTOL) or hmax > HIDDEN_ATOL * max(1.0, hscale) or (mmax > LOGIT_ATOL and mrel > LOGIT_RTOL):
        raise SystemExit(f"export check failed: logits differ by {lmax:.3g} (main) / {mmax:.3g} (MTP), "
                         f"hidden by {hmax:.3g}, tolerance {LOGIT_ATOL}")
    if magree != mtotal and (not near_ties or max(near_ties) > 10 * LOGIT_ATOL):
        raise SystemExit(f"MTP argmax differs at {mtotal - magree} of {mtotal} positions, not near ties: {near_ties}")
    return res


def torch_greedy(trunk, prompt: list[int], n: int, eos: int = 0) -> list[int]:
    """Greedy continuation, stopping after EOS as og.Generator does (eos_token_id 0 in genai_config)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(trunk(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            if ids[-1] == eos:
                break
    return ids[len(prompt):]


def check_genai(trunk, folder: Path, prompt: list[int], n: int) -> dict:
    """og.Model on a copy of the folder with shared_initializers removed (genai 0.18 on the CPU refuses the
    builder's genai_config otherwise: 'GetMemoryInfo for CPU should not be used'); the shipped folder keeps the
    builder's genai_config as written."""
    import onnxruntime_genai as og

    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for f in SHIPPED + ["tokenizer.json", "tokenizer_config.json"]:
            shutil.copy2(folder / f, tmp / f)
        cfg = json.loads((tmp / "genai_config.json").read_text())
        removed = [k for k in ("decoder", "mtp") if cfg["model"].get(k, {}).pop("shared_initializers", None)]
        if removed:
            notes.append(f"removed shared_initializers from {removed} in a temporary copy of genai_config.json")
        (tmp / "genai_config.json").write_text(json.dumps(cfg, indent=1))
        model = og.Model(str(tmp))
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + n)
        gen = og.Generator(model, params)
        gen.append_tokens(np.asarray(prompt, dtype=np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        og_tokens = [int(t) for t in gen.get_sequence(0)][len(prompt):]
        del gen, model
    torch_tokens = torch_greedy(trunk, prompt, n)
    res = {"prompt_tokens": len(prompt), "new_tokens": n, "og_tokens": og_tokens, "torch_tokens": torch_tokens,
           "identical": og_tokens == torch_tokens, "notes": notes}
    print(json.dumps({k: v for k, v in res.items() if k not in ("og_tokens", "torch_tokens")}))
    if not res["identical"]:
        raise SystemExit(f"og.Generator greedy differs from torch greedy:\n{og_tokens}\n{torch_tokens}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", type=Path, default=WORK / "ckpt.pt")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check-rows", type=int, default=4)
    ap.add_argument("--check-len", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(2)
    trunk, mtp, ck = load_checkpoint(args.ckpt)
    ex = WORK / "export"
    hf, onnx_dir, cache = ex / "hf", ex / "onnx", ex / "cache"
    ex.mkdir(parents=True, exist_ok=True)
    hf_checkpoint(trunk, mtp, hf)
    cmd = run_builder(hf, onnx_dir, cache)
    args.out.mkdir(parents=True, exist_ok=True)
    for f in SHIPPED:
        dst = args.out / f
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        shutil.copy2(onnx_dir / f, dst)  # copies: symlinked data files fail onnx validation
    HEAD_SIZE[0] = json.loads((args.out / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
    rows = heldout_windows(load_stream("heldout"))
    pick = np.linspace(0, len(rows) - 1, args.check_rows).astype(int)
    rows = rows[pick, : args.check_len]
    onnx_res = check_onnx(trunk, mtp, args.out, rows)
    # the prompt: the first 32 tokens of the first check row whose torch greedy continuation runs 32 tokens
    # without EOS (a continuation that ends at EOS is shorter: og.Generator stops there)
    prompt = next((r[:32].tolist() for r in rows if 0 not in torch_greedy(trunk, r[:32].tolist(), 32)),
                  rows[0, :32].tolist())
    genai_res = check_genai(trunk, args.out, prompt, 32)
    checks = {"ckpt_step": ck["step"], "builder_command": cmd.replace(str(Path.cwd()) + "/", ""),
              "onnx": onnx_res, "genai": genai_res, "ort_version": ort.__version__}
    import onnxruntime_genai as og
    checks["genai_version"] = og.__version__
    (WORK / "export_checks.json").write_text(json.dumps(checks, indent=1) + "\n")
    print("export checks passed")


if __name__ == "__main__":
    main()
