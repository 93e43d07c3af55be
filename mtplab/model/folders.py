"""Opening a model folder: onnxruntime-genai builder output, or an mtplab artifact."""

from __future__ import annotations

from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[2] / "models"  # trained models that come with a clone: models/<name>


def shipped_models() -> list[str]:
    """The names of the trained models in the clone's models/ folder (`--model pycode`)."""
    return sorted(p.name for p in SHIPPED.iterdir() if p.is_dir()) if SHIPPED.is_dir() else []


def model_folder(spec: str | Path) -> Path:
    """The folder a model spec names: a path as given, else a shipped model of that name (models/<name>)."""
    folder = Path(spec)
    if not folder.exists() and str(spec) in shipped_models():
        return SHIPPED / str(spec)
    return folder


def open_model(path: str | Path):
    """A builder output folder (genai_config.json) or an mtplab artifact folder (manifest.json), or the name of a
    shipped model."""
    from mtplab.model.artifact import load_artifact
    from mtplab.model.builder import is_builder_folder, open_builder

    folder = model_folder(path)
    if not folder.is_dir():
        what = "a file, not a folder" if folder.exists() else "no such folder"
        raise ValueError(f"{folder}: {what} (expected a folder the onnxruntime-genai model builder wrote, an "
                         f"mtplab artifact, or a shipped model {shipped_models()}; `mtplab model inspect` also "
                         "takes a preset name)")
    if is_builder_folder(folder):
        return open_builder(folder)
    if not (folder / "manifest.json").is_file():
        raise ValueError(f"{folder}: neither genai_config.json (onnxruntime-genai builder output) nor manifest.json "
                         "(an mtplab artifact, `mtplab model build --out`) is there")
    return load_artifact(folder)
