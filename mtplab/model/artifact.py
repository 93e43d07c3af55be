"""Model artifacts: build (cached by config hash), manifest, and validation of external models.

An artifact directory holds three files: target.onnx, mtp.onnx and manifest.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import onnx

from mtplab.base.paths import cache_root
from mtplab.model.behaviour import fitted_head
from mtplab.model.config import ModelConfig
from mtplab.model.description import graph_problems
from mtplab.model.forms import check_runtime, choose_form
from mtplab.model.graph import build_mtp, build_target, mtp_signature, target_signature
from mtplab.model.onnx_read import io_table, parameter_count
from mtplab.model.stepper import runnable_providers
from mtplab.model.weights import target_weights

REQUIRED_OPS = {
    "GroupQueryAttention": "1.18",
    "GatedDeltaNet": "1.30",
    "CausalConvWithState": "1.30",
    "MatMulNBits": "1.17",
    "RMSNormalization": "1.22",
}


def cache_dir() -> Path:
    """Where built models live: $MTPLAB_CACHE, else ~/.cache/mtplab/models."""
    return cache_root() / "models"


def available_ops() -> set[str]:
    """com.microsoft and default-domain op names that the installed onnxruntime knows."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    return {s.name for s in C.get_all_operator_schema() if s.domain in ("", "com.microsoft")}


def check_ops(ops: set[str] | None = None) -> None:
    """Fail with the op name and the onnxruntime version it needs if the installed runtime lacks one."""
    import onnxruntime

    have = available_ops()
    for op, version in REQUIRED_OPS.items():
        if ops is not None and not any(o.endswith(op) for o in ops):
            continue
        if op not in have:
            raise RuntimeError(
                f"onnxruntime {onnxruntime.__version__} lacks the op {op}: it needs onnxruntime >= {version} "
                f"(pip install 'onnxruntime>={max(REQUIRED_OPS.values())}')"
            )


def _io_table(values) -> list[dict]:
    return [{"name": n, "dtype": dtype, "shape": list(dims)} for n, (dims, dtype) in io_table(values).items()]


@dataclass(frozen=True)
class Artifact:
    """A built (or external) model: paths plus the parsed manifest."""

    path: Path
    manifest: dict

    @property
    def target(self) -> Path:
        return self.path / self.manifest["files"]["target"]

    @property
    def mtp(self) -> Path:
        return self.path / self.manifest["files"]["mtp"]

    @property
    def config(self) -> ModelConfig:
        d = dict(self.manifest["config"])
        d["attention_layers"] = tuple(d["attention_layers"])
        return ModelConfig(**d)

    @property
    def description(self):
        """The runtime contract (mtplab.model.description) of this built-in model."""
        from mtplab.model.description import describe_builtin

        return describe_builtin(self.config, self.target, self.mtp)

    def identity(self) -> dict:
        """What a result records about the model it ran on."""
        cfg = self.config
        return {"name": cfg.name, "hash": cfg.config_hash(), "summary": self.summary(),
                "parameters": self.manifest["parameters"], "kind": "built-in"}

    def summary(self) -> str:
        m = self.manifest
        cfg = self.config
        return (
            f"{cfg.name}: {m['parameters']['target'] / 1e6:.1f}M params (MTP head {m['parameters']['mtp'] / 1e6:.1f}M), "
            f"{cfg.num_layers} layers = {len(cfg.gdn_layer_ids)} GatedDeltaNet + {len(cfg.attention_layer_ids)} attention, "
            f"{cfg.dtype}/{cfg.weight_format}, ops: {', '.join(sorted(o.split('::')[-1] for o in m['ops']))}"
        ) + (f"\n  {behaviour_line(m['behaviour'])}" if "behaviour" in m else "")


def behaviour_line(b: dict) -> str:
    """The build-time behaviour figures in one line (see mtplab.model.behaviour)."""
    if not b.get("measured", True):
        return f"NOT MEASURED: {b['why']}"
    free = ["never" if f is None else str(f) for f in b["free_running_departure"]]
    return (
        f"state sensitivity over prompt seeds {b['seeds']}: teacher-forced "
        f"{min(b['teacher_forced']):.0%}..{max(b['teacher_forced']):.0%} of positions change when the state is "
        f"zeroed, free-running departure at token {'/'.join(free)}; top-2 margin median {b['margin_median']:.2f}"
        + (f"; MTP head acceptance at k=1 {b['head_acceptance_k1']:.0%}" if "head_acceptance_k1" in b else "")
    )


# The code that decides an artifact's bytes besides its config: its source is part of the cache key,
# so a change to how weights or graphs are generated never reuses an artifact built by the old code.
BUILD_CODE = ("weights.py", "graph.py", "config.py", "forms.py", "behaviour.py", "stepper.py")
BUILD_LOCK_WAIT = 3600.0  # seconds a build waits for another process building the same artifact


def code_version() -> str:
    """A hash of the model-building code (BUILD_CODE)."""
    h = hashlib.sha256()
    for name in BUILD_CODE:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:12]


def cache_key(cfg: ModelConfig) -> str:
    """What decides an artifact's bytes: the config (with the graph version) and the building code's version."""
    return hashlib.sha256(f"{cfg.config_hash()}/{code_version()}".encode()).hexdigest()[:16]


def content_hash(path: Path, files: dict) -> str:
    """sha256 over the target and MTP files as stored (first 16 hex digits), read in chunks."""
    h = hashlib.sha256()
    for part in ("target", "mtp"):
        with open(path / files[part], "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()[:16]


def _replace_dir(final: Path, files: dict[str, bytes]) -> None:
    """Write files into a temporary folder beside final, then swap it into place (callers hold the build lock)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    for name, blob in files.items():
        (tmp / name).write_bytes(blob)
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
        os.rename(final, old / final.name)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)


def _reusable(final: Path, cfg: ModelConfig, key: str, explicit: bool) -> tuple[Artifact | None, str]:
    """(the artifact at final if it can be used as is, else None and why it must be rebuilt).

    Another config in an explicit --out folder is refused (ValueError), never overwritten silently.
    """
    try:
        manifest = json.loads((final / "manifest.json").read_text())
    except (OSError, ValueError) as err:
        return None, f"unreadable manifest.json ({err})"
    if explicit and manifest.get("config") != cfg.to_dict():
        have = manifest.get("config", {})
        diff = {k: (have.get(k), v) for k, v in cfg.to_dict().items() if have.get(k) != v}
        raise ValueError(
            f"{final} holds an artifact of another config (differs in {diff}, as (there, asked)): "
            "choose another --out, or pass --force to replace it"
        )
    if manifest.get("cache_key") != key:
        return None, "built by another version of the model code"
    if not manifest.get("behaviour", {}).get("measured", True) and runnable_providers() is not None:
        return None, "built where its MTP head could not be fitted, which this runtime can do"
    try:
        return load_artifact(final), ""
    except ValueError as err:
        return None, str(err)


def build_model(cfg: ModelConfig, out: str | Path | None = None, force: bool = False) -> Artifact:
    """Build target.onnx + mtp.onnx + manifest.json for cfg, cached under cache_dir() by cache_key(cfg).

    A cached artifact is verified when loaded (content hash, files readable) and rebuilt with a
    message if it is not intact. Builds of one folder are serialised by a lock and swapped in
    atomically, so concurrent builds (and --force) never expose a half-built artifact.
    """
    from mtplab.base.lock import folder_lock

    if cfg.graph_form is None:  # the installed runtime's form, recorded in the config (manifest, cache key)
        cfg = cfg.replace(graph_form=choose_form()[0].name)
    check_runtime(cfg.form)
    key = cache_key(cfg)
    final = Path(out) if out else cache_dir() / f"{cfg.name}-{key}"
    if out and final.exists() and any(final.iterdir()) and not (final / "manifest.json").exists():
        raise ValueError(f"{final} exists and is not an mtplab artifact (no manifest.json): choose another --out")
    final.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(final.parent / f".{final.name}.lock", f"model {final}", wait=BUILD_LOCK_WAIT, quiet=True):
        for stale in final.parent.glob(f".{final.name}.tmp-*"):  # left by a killed build
            shutil.rmtree(stale, ignore_errors=True)
        if (final / "manifest.json").exists() and not force:
            art, why = _reusable(final, cfg, key, explicit=out is not None)
            if art is not None:
                return art
            print(f"model {final}: {why}; rebuilding it", file=sys.stderr)
        else:  # minutes for the larger presets: say so before the silence
            print(f"model {cfg.name}: building it into {final} (once for this config and runtime; runs load it "
                  "after)", file=sys.stderr)
        t0 = time.perf_counter()
        _replace_dir(final, _build(cfg, key))
        print(f"model {cfg.name}: built in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        return load_artifact(final)


def _build(cfg: ModelConfig, key: str) -> dict[str, bytes]:
    """The artifact's files: target.onnx, mtp.onnx and manifest.json."""
    import onnxruntime

    check_ops()
    tw = target_weights(cfg)
    target, ops_t, effective = build_target(cfg, tw)
    target_blob = target.SerializeToString()
    head, behaviour = fitted_head(cfg, tw | effective, target_blob)
    mtp, ops_m, _ = build_mtp(cfg, head)
    blobs = {"target.onnx": target_blob, "mtp.onnx": mtp.SerializeToString()}
    t_in, t_out = target_signature(cfg)
    m_in, m_out = mtp_signature(cfg)
    manifest = {
        "format": "mtplab-artifact/1",
        "builtin": True,
        "config": cfg.to_dict(),
        "config_hash": cfg.config_hash(),
        "code_version": code_version(),
        "cache_key": key,
        "files": {"target": "target.onnx", "mtp": "mtp.onnx"},
        "io": {
            "target": {"inputs": _io_table(t_in), "outputs": _io_table(t_out)},
            "mtp": {"inputs": _io_table(m_in), "outputs": _io_table(m_out)},
        },
        "ops": sorted(ops_t | ops_m),
        "parameters": {"target": parameter_count(target), "mtp": parameter_count(mtp)},
        "behaviour": behaviour,
        "onnxruntime_version": onnxruntime.__version__,
        "content_hash": hashlib.sha256(blobs["target.onnx"] + blobs["mtp.onnx"]).hexdigest()[:16],
    }
    blobs["manifest.json"] = json.dumps(manifest, indent=1).encode()
    return blobs


def load_artifact(path: str | Path) -> Artifact:
    """Load an artifact directory and validate its manifest against the models' real inputs and outputs."""
    path = Path(path)
    mf = path / "manifest.json"
    if not mf.exists():
        raise ValueError(f"{path}: no manifest.json (build one with `mtplab model build` or write one for your model)")
    try:
        manifest = json.loads(mf.read_text())
    except ValueError as err:
        raise ValueError(f"{mf}: not valid JSON ({err})") from None
    art = Artifact(path, manifest)
    validate_manifest(art)
    if manifest["config"].get("graph_form"):  # built for a form this runtime may not accept
        try:
            check_runtime(art.config.form)
        except RuntimeError as err:
            raise ValueError(f"{path}: {err}") from None
    return art


def validate_manifest(art: Artifact) -> None:
    """Check every name, rank, dtype and fixed dimension the manifest declares against the ONNX files, and the
    graphs against what its config describes (the states and KV caches mtplab allocates from it: their fixed
    dimensions, a KV's length config.max_seq_len); ValueError on a mismatch, before any run."""
    for key in ("config", "files", "io"):
        if key not in art.manifest:
            raise ValueError(f"{art.path}/manifest.json: missing key {key!r}")
    for part in ("target", "mtp"):
        file = art.path / art.manifest["files"][part]
        if not file.exists():
            raise ValueError(f"{art.path}/manifest.json: files.{part} names {file.name}, which does not exist")
    want = art.manifest.get("content_hash")
    if want is not None and (have := content_hash(art.path, art.manifest["files"])) != want:
        raise ValueError(
            f"{art.path}: the model files' content hash is {have}, the manifest says {want} (changed or truncated)"
        )
    tables = {}
    for part in ("target", "mtp"):
        file = art.path / art.manifest["files"][part]
        try:
            model = onnx.load(str(file), load_external_data=False)
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and friends: name the file instead
            raise ValueError(f"{file}: not a readable ONNX model ({type(err).__name__}: {err})") from None
        tables[part] = (io_table(model.graph.input), io_table(model.graph.output))
        real = {kind: {n: {"name": n, "dtype": dtype, "shape": list(dims)} for n, (dims, dtype) in table.items()}
                for kind, table in zip(("inputs", "outputs"), tables[part])}
        for kind in ("inputs", "outputs"):
            for want in art.manifest["io"][part][kind]:
                have = real[kind].get(want["name"])
                where = f"{art.path.name}/manifest.json io.{part}.{kind}"
                if have is None:
                    raise ValueError(
                        f"{where}: {part} model has no {kind[:-1]} named {want['name']!r} "
                        f"(it has: {sorted(real[kind])})"
                    )
                if len(have["shape"]) != len(want["shape"]):
                    raise ValueError(
                        f"{where}: {want['name']!r} has rank {len(have['shape'])} in the model, "
                        f"manifest says {len(want['shape'])}"
                    )
                if have["dtype"] != want["dtype"]:
                    raise ValueError(
                        f"{where}: {want['name']!r} is {have['dtype']} in the model, manifest says {want['dtype']}"
                    )
                if any(isinstance(h, int) and isinstance(w, int) and h != w for h, w in zip(have["shape"],
                                                                                          want["shape"])):
                    raise ValueError(f"{where}: {want['name']!r} is {have['shape']} in the model, manifest says "
                                     f"{want['shape']}")
    try:
        desc = art.description
    except (KeyError, TypeError) as err:  # ModelConfig's own refusals are ValueErrors that name the field
        raise ValueError(f"{art.path.name}/manifest.json config: not a model config ({type(err).__name__}: {err})") \
            from None
    for part, io in (("target", desc.target), ("mtp", desc.mtp)):
        if problems := graph_problems(io, *tables[part], capacity=desc.capacity):
            more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
            raise ValueError(f"{art.path.name}/manifest.json config: the {part} model is not what it describes "
                             "(KV caches from attn_kv_heads, max_seq_len and attn_head_dim; states from the gdn_ and "
                             "conv_ fields): " + "; ".join(problems[:3]) + more)
