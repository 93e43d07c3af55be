"""The built-in hybrid MTP model: config, presets, ONNX build, artifacts and the numpy reference."""

from mtplab.model.artifact import Artifact, build_model, cache_dir, check_ops, load_artifact
from mtplab.model.config import PRESETS, ModelConfig, preset, preset_config

__all__ = ["Artifact", "ModelConfig", "PRESETS", "build_model", "cache_dir", "check_ops", "load_artifact", "preset",
           "preset_config"]
