"""Train the pycode model: a Qwen3.5-style hybrid trunk (3 Gated-DeltaNet + 1 full-attention layers) plus one
MTP layer, loss = next-token + 0.3 x token-after-next, on the CPU, within a wall-clock budget.

    nice -n 19 .venv-train/bin/python train/train.py --minutes 22 [--resume]

The learning rate follows a cosine over the wall-clock budget (or over --steps when given); a checkpoint is
written every --ckpt-minutes to train/work/ckpt.pt, and --resume continues from it (same batches: a batch is
a function of (seed, step)). Logs: train/work/log.csv (train loss every step, held-out loss every --eval-every
steps) and train/work/run.json (wall time, tokens seen, `uptime` at start and end).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import time
from pathlib import Path

import torch
from common import (
    MTP_WEIGHT,
    SEQ,
    WORK,
    build,
    count,
    forward_losses,
    heldout_windows,
    load_stream,
    seed_all,
    train_batch,
)
from tqdm import tqdm


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


@torch.no_grad()
def evaluate(trunk, mtp, windows) -> tuple[float, float]:
    trunk.eval(), mtp.eval()
    m = h = 0.0
    for i in range(0, len(windows), 16):
        a, b, _, _ = forward_losses(trunk, mtp, windows[i:i + 16])
        n = len(windows[i:i + 16])
        m, h = m + a.item() * n, h + b.item() * n
    trunk.train(), mtp.train()
    return m / len(windows), h / len(windows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=22.0, help="wall-clock training budget (all resumes together); ignored with --steps")
    ap.add_argument("--steps", type=int, default=None, help="stop after this many steps (cosine over steps)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--ckpt-minutes", type=float, default=3.0)
    ap.add_argument("--resume", action="store_true", help="continue from <work-dir>/ckpt.pt")
    ap.add_argument("--work-dir", type=Path, default=WORK, help="checkpoint and logs (the token streams stay in train/work)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    ckpt_path, log_path, run_path = work / "ckpt.pt", work / "log.csv", work / "run.json"

    seed_all(args.seed)
    trunk, mtp = build(args.seed)
    params = list(trunk.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    step, elapsed = 0, 0.0
    run = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "uptime_start": uptime(), "segments": []}
    if args.resume and ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        trunk.load_state_dict(ck["trunk"]), mtp.load_state_dict(ck["mtp"]), opt.load_state_dict(ck["opt"])
        step, elapsed = ck["step"], ck["elapsed"]
        torch.set_rng_state(ck["torch_rng"])
        run = json.loads(run_path.read_text()) if run_path.exists() else run
        # keep only the log rows up to the checkpoint
        rows = [r for r in csv.DictReader(log_path.open())] if log_path.exists() else []
        rows = [r for r in rows if int(r["step"]) <= step]
        print(f"resumed at step {step}, {elapsed / 60:.1f} min trained")
    else:
        rows = []
    with log_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["step", "elapsed_s", "lr", "train_loss", "train_main", "train_mtp",
                                          "heldout_main", "heldout_mtp"])
        w.writeheader()
        w.writerows(rows)
    log = log_path.open("a", newline="")
    writer = csv.DictWriter(log, fieldnames=["step", "elapsed_s", "lr", "train_loss", "train_main", "train_mtp",
                                             "heldout_main", "heldout_mtp"])
    print(f"trunk {count(trunk):,} params, MTP layer {count(mtp):,}; uptime: {uptime()}")
    train_stream, held = load_stream("train"), heldout_windows(load_stream("heldout"), args.eval_windows)
    budget = args.minutes * 60

    def lr_at(step: int, elapsed: float) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = step / args.steps if args.steps else elapsed / budget
        frac = min(max(frac, 0.0), 1.0)
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))

    def save() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"trunk": trunk.state_dict(), "mtp": mtp.state_dict(), "opt": opt.state_dict(), "step": step,
                    "elapsed": elapsed, "args": run["args"], "torch_rng": torch.get_rng_state()}, tmp)
        tmp.replace(ckpt_path)

    seg_start, seg_step = time.time(), step
    last_ckpt = time.time()
    trunk.train(), mtp.train()
    bar = tqdm(total=args.steps if args.steps else int(budget), initial=step if args.steps else int(elapsed),
               unit="step" if args.steps else "s", dynamic_ncols=True)
    while True:
        if args.steps and step >= args.steps:
            break
        if not args.steps and elapsed >= budget:  # with --steps the step count decides, not the clock
            break
        t0 = time.time()
        lr = lr_at(step, elapsed)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = train_batch(train_stream, args.seed, step, args.batch)
        main_l, mtp_l, _, _ = forward_losses(trunk, mtp, batch)
        loss = main_l + MTP_WEIGHT * mtp_l
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        dt = time.time() - t0
        elapsed += dt
        if not math.isfinite(loss.item()):
            raise SystemExit(f"loss is {loss.item()} at step {step}: stopping")
        row = {"step": step, "elapsed_s": round(elapsed, 2), "lr": f"{lr:.6g}", "train_loss": f"{loss.item():.5f}",
               "train_main": f"{main_l.item():.5f}", "train_mtp": f"{mtp_l.item():.5f}", "heldout_main": "",
               "heldout_mtp": ""}
        if step % args.eval_every == 0:
            hm, hh = evaluate(trunk, mtp, held)
            row["heldout_main"], row["heldout_mtp"] = f"{hm:.5f}", f"{hh:.5f}"
            tqdm.write(f"step {step} {elapsed / 60:.1f} min: train {main_l.item():.3f}/{mtp_l.item():.3f} "
                       f"held-out {hm:.3f}/{hh:.3f} lr {lr:.2e}")
        writer.writerow(row)
        log.flush()
        bar.update(1 if args.steps else int(elapsed) - bar.n)
        bar.set_postfix(loss=f"{main_l.item():.3f}", mtp=f"{mtp_l.item():.3f}", step=step)
        if time.time() - last_ckpt > args.ckpt_minutes * 60:
            save()
            last_ckpt = time.time()
    bar.close()
    hm, hh = evaluate(trunk, mtp, held)
    writer.writerow({"step": step, "elapsed_s": round(elapsed, 2), "lr": "", "train_loss": "", "train_main": "",
                     "train_mtp": "", "heldout_main": f"{hm:.5f}", "heldout_mtp": f"{hh:.5f}"})
    log.close()
    save()
    run["segments"].append({"from_step": seg_step, "to_step": step, "wall_s": round(time.time() - seg_start, 1)})
    run.update(steps=step, train_seconds=round(elapsed, 1), tokens_seen=step * args.batch * SEQ,
               uptime_end=uptime(), final_heldout_main=hm, final_heldout_mtp=hh)
    run_path.write_text(json.dumps(run, indent=1) + "\n")
    print(f"done: {step} steps, {elapsed / 60:.1f} min, held-out {hm:.3f} / MTP {hh:.3f}; uptime: {run['uptime_end']}")


if __name__ == "__main__":
    main()
