"""Held-out prompt sets of four kinds for models/pycode (models/pycode/prompts.json), in the spirit of Spec-Bench's
categories: the text before a point in a held-out file, cut where a kind of text begins, so that a run continues it.

- code: a function's signature and the first lines of its body (cut inside the body);
- docstrings: a def or class line and the opening of its docstring (cut inside the docstring);
- comments: the code before a comment block and its first words (cut inside the comment);
- data: the opening of a literal table (a dict, list, tuple or set of three lines or more assigned to a name; cut
  inside it).

Each prompt is the PROMPT_TOKENS tokens ending at the cut, from held-out files only (data_split.json), the files in
sorted order, at most PER_FILE prompts of a kind per file; the first PER_KIND of each kind are kept. Deterministic.

A fifth set, `context`, is for acceptance by context length: code cuts with at least CONTEXT_TOKENS tokens of their
file before them, each row the CONTEXT_TOKENS tokens ending at the cut; a run's `context` field takes the last n of
them, so that every context length continues the same text.

    .venv-train/bin/python train/prompts.py
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from tokenizers import Tokenizer

OUT = Path(__file__).resolve().parent.parent / "models" / "pycode"
PROMPT_TOKENS, PER_KIND, PER_FILE = 48, 20, 3
CONTEXT_TOKENS = 1024  # four times the training rows (train/common.py SEQ = 256)


def cuts(source: str, per_file: int = PER_FILE) -> dict[str, list[int]]:
    """Character offsets where each kind's prompt ends, in one file (the first per_file of each kind)."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def at(lineno: int, col: int = 0) -> int:  # ast's 1-based line, 0-based column
        return starts[lineno - 1] + col

    out: dict[str, list[int]] = {"code": [], "docstrings": [], "comments": [], "data": []}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            doc = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                                                      ast.Constant) else None
            if doc is not None and isinstance(doc.value.value, str) and len(doc.value.value) > 40:
                out["docstrings"].append(at(doc.lineno, doc.col_offset) + 3 + 20)  # the quotes and a few words
            code = [s for s in body if s is not doc]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(code) >= 3:
                out["code"].append(at(code[1].lineno, code[1].col_offset))  # after its first statement
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(
                node.value, (ast.Dict, ast.List, ast.Tuple, ast.Set)) and node.value.end_lineno - node.value.lineno >= 2:
            second = lines[node.value.lineno]  # the literal's second line: cut after its first element
            out["data"].append(at(node.value.lineno + 1) + len(second) - len(second.lstrip()))
    for i, line in enumerate(lines[1:], start=1):
        if re.match(r"\s*# \w+ \w+ \w+", line) and not lines[i - 1].lstrip().startswith("#"):
            out["comments"].append(starts[i] + line.index("#") + 2 + len(" ".join(line.split()[1:3])))
    return {kind: sorted(set(offsets))[:per_file] for kind, offsets in out.items()}


def main() -> None:
    split = json.loads((OUT / "data_split.json").read_text())
    tok = Tokenizer.from_file(str(OUT / "tokenizer.json"))
    root = Path(split["stdlib"])
    kinds: dict[str, list[dict]] = {"code": [], "docstrings": [], "comments": [], "data": [], "context": []}
    for name in sorted(split["heldout_files"]):
        source = (root / name).read_text(encoding="utf-8")
        for kind, offsets in cuts(source).items():
            for end in offsets:
                ids = tok.encode(source[:end]).ids
                if len(ids) >= PROMPT_TOKENS and len(kinds[kind]) < PER_KIND:
                    line = source[:end].count("\n") + 1
                    kinds[kind].append({"file": name, "line": line, "tokens": ids[-PROMPT_TOKENS:]})
        for end in cuts(source, per_file=len(source))["code"]:  # every code cut, for the long ones
            if len(kinds["context"]) < PER_KIND and len(ids := tok.encode(source[:end]).ids) >= CONTEXT_TOKENS:
                line = source[:end].count("\n") + 1
                kinds["context"].append({"file": name, "line": line, "tokens": ids[-CONTEXT_TOKENS:]})
                break  # one a file: twenty files, not one long file's functions
    for kind, prompts in kinds.items():
        print(f"{kind}: {len(prompts)} prompts from {len({p['file'] for p in prompts})} held-out files")
        assert len(prompts) == PER_KIND, kind
    doc = {"about": "held-out prompt sets of models/pycode (train/prompts.py): the last tokens before a cut where a "
                    "kind of text begins; a run continues the text. `context`: code cuts with context_tokens tokens "
                    "of their file before them, for acceptance by context length (a run's `context` takes the last n)",
           "python": split["python_version"], "tokens_per_prompt": PROMPT_TOKENS, "context_tokens": CONTEXT_TOKENS,
           "kinds": kinds}
    (OUT / "prompts.json").write_text(json.dumps(doc, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {OUT / 'prompts.json'}")


if __name__ == "__main__":
    main()
