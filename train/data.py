"""Corpus, split and tokenizer for the pycode model.

The corpus is the running Python's standard library source (sysconfig's 'stdlib' path, *.py files).
Left out: every test package (a path component named test, tests or idle_test), idlelib/, lib2to3/,
site-packages/ and __pycache__/. The split is BY FILE (seed 0, 10% of files held out). A byte-level BPE
(vocab 2048, <|endoftext|> = id 0) is trained on the train files only.

Writes models/pycode/data_split.json, models/pycode/tokenizer.json + tokenizer_config.json, and the
token streams train/work/{train,heldout}.npy (uint16; files joined with <|endoftext|>).

    .venv-train/bin/python train/data.py
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import sysconfig
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "models" / "pycode"
WORK = ROOT / "train" / "work"
SEED = 0
HELD_FRACTION = 0.10
VOCAB = 2048
EOS = "<|endoftext|>"
EXCLUDED_DIRS = {"test", "tests", "idle_test", "idlelib", "lib2to3", "site-packages", "__pycache__"}
# Qwen2/Qwen3-style pre-tokenizer split (the same as the stdlib-probe-3m tokenizer's)
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TOKENIZER_CONFIG = {
    "add_prefix_space": None,
    "backend": "tokenizers",
    "bos_token": None,
    "eos_token": EOS,
    "model_max_length": 4096,
    "pad_token": EOS,
    "tokenizer_class": "Qwen3_5Tokenizer",
    "unk_token": EOS,
}


def stdlib_files() -> tuple[Path, list[str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if EXCLUDED_DIRS & set(rel.parts[:-1]):
            continue
        files.append(rel.as_posix())
    return root, sorted(files)


def read(root: Path, rel: str) -> str:
    return (root / rel).read_text(encoding="utf-8", errors="replace")


def make_tokenizer(texts) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_stream(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    root, files = stdlib_files()
    shuffled = files[:]
    random.Random(SEED).shuffle(shuffled)
    n_held = max(1, round(HELD_FRACTION * len(files)))
    held, train = sorted(shuffled[:n_held]), sorted(shuffled[n_held:])
    train_texts = [read(root, f) for f in train]
    held_texts = [read(root, f) for f in held]
    tok = make_tokenizer(train_texts)
    assert tok.token_to_id(EOS) == 0 and tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    OUT.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    (OUT / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    train_ids, held_ids = encode_stream(tok, train_texts), encode_stream(tok, held_texts)
    np.save(WORK / "train.npy", train_ids)
    np.save(WORK / "heldout.npy", held_ids)
    split = {
        "python_version": sys.version.split()[0],
        "stdlib": str(root),
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "seed": SEED,
        "held_fraction": HELD_FRACTION,
        "vocab_size": VOCAB,
        "counts": {
            "files_total": len(files), "files_train": len(train), "files_heldout": len(held),
            "bytes_train": sum(len(t.encode()) for t in train_texts),
            "bytes_heldout": sum(len(t.encode()) for t in held_texts),
            "tokens_train": int(train_ids.size), "tokens_heldout": int(held_ids.size),
        },
        "train_files": train,
        "heldout_files": held,
    }
    (OUT / "data_split.json").write_text(json.dumps(split, indent=1) + "\n")
    print(json.dumps({"python": split["python_version"], **split["counts"]}))


if __name__ == "__main__":
    main()
