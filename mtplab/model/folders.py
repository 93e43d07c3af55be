"""Opening a model folder: onnxruntime-genai builder output, or an mtplab artifact."""

from __future__ import annotations

from pathlib import Path


def open_model(path: str | Path):
    """A builder output folder (genai_config.json) or an mtplab artifact folder (manifest.json)."""
    from mtplab.model.artifact import load_artifact
    from mtplab.model.builder import is_builder_folder, open_builder

    folder = Path(path)
    if not folder.is_dir():
        what = "a file, not a folder" if folder.exists() else "no such folder"
        raise ValueError(f"{folder}: {what} (expected a folder the onnxruntime-genai model builder wrote, or an "
                         "mtplab artifact; `mtplab model inspect` also takes a preset name)")
    if is_builder_folder(folder):
        return open_builder(folder)
    if not (folder / "manifest.json").is_file():
        raise ValueError(f"{folder}: neither genai_config.json (onnxruntime-genai builder output) nor manifest.json "
                         "(an mtplab artifact, `mtplab model build --out`) is there")
    return load_artifact(folder)
