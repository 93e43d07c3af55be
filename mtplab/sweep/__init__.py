"""Sweeps: grids from YAML, points through papermill (local or Ray), atomic and resumable results, the notebook kernel and workspace."""
