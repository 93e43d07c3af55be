"""Sweep grid specs: YAML with lists per dimension, validated before any point runs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import yaml

from .config import RunConfig

SPEC_DIR = Path(__file__).parent / "sweeps"
DIMENSIONS = (
    "preset",
    "k",
    "alpha",
    "drafter",
    "policy",
    "commit",
    "schedule",
    "tokens",
    "seed",
    "backend",
    "engine",
    "oracle_free_drafts",
    "int4",
)
TOP_KEYS = ("name", "defaults", "grids", "repeats", "resources", *DIMENSIONS)
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory")


@dataclass(frozen=True)
class Point:
    """One sweep point: a RunConfig and its repeat index, with a stable readable id."""

    run: RunConfig
    repeat: int = 0

    @property
    def id(self) -> str:
        r = self.run
        parts = [
            r.preset,
            f"k{r.k}",
            r.drafter + (f"{r.alpha:g}" if r.drafter == "oracle" else ""),
            r.policy,
            r.commit,
            r.schedule,
            f"t{r.tokens}",
            f"s{r.seed}",
            f"r{self.repeat}",
        ]
        if r.engine != "mtplab":
            parts.insert(0, r.engine)
        if r.backend != "cpu":
            parts.insert(0, r.backend)
        if r.int4:
            parts.append("int4")
        if r.oracle_free_drafts:
            parts.append("free")
        return "-".join(parts)


@dataclass(frozen=True)
class GridSpec:
    name: str
    points: tuple[Point, ...]
    source: dict
    resources: dict | None = None  # per-point resource request for cluster executors


def _fail(msg: str) -> None:
    raise ValueError(f"grid spec: {msg}")


def _check_lists(where: str, d: dict, allow_scalars: bool) -> None:
    for key, value in d.items():
        if key not in DIMENSIONS:
            _fail(f"unknown key {key!r} in {where} (allowed: {list(DIMENSIONS)})")
        if isinstance(value, list):
            if not value:
                _fail(f"{key!r} in {where} is an empty list")
        elif not allow_scalars:
            _fail(f"{key!r} in {where} must be a list (got {value!r})")


def parse(source: dict) -> GridSpec:
    """Expand a spec (a union of cartesian products over `grids`, or one product) into points."""
    if not isinstance(source, dict):
        _fail("the top level must be a mapping")
    for key in source:
        if key not in TOP_KEYS:
            _fail(f"unknown key {key!r} (allowed: {list(TOP_KEYS)})")
    defaults = source.get("defaults", {}) or {}
    _check_lists("defaults", defaults, allow_scalars=True)
    top = {k: v for k, v in source.items() if k in DIMENSIONS}
    _check_lists("the spec", top, allow_scalars=False)
    grids = source.get("grids") or [{}]
    if not isinstance(grids, list):
        _fail("'grids' must be a list of mappings")
    repeats = source.get("repeats", 1)
    if not isinstance(repeats, int) or repeats < 1:
        _fail(f"'repeats' must be an integer >= 1 (got {repeats!r})")
    points: dict[str, Point] = {}
    for n, grid in enumerate(grids):
        _check_lists(f"grids[{n}]", grid, allow_scalars=False)
        dims = {k: (v if isinstance(v, list) else [v]) for k, v in defaults.items()} | top | grid
        keys = list(dims)
        for values in itertools.product(*(dims[k] for k in keys)):
            params = dict(zip(keys, values))
            try:
                run = RunConfig(**params)
            except ValueError as err:
                bad = next((k for k in keys if str(err).find(k) >= 0), "value")
                _fail(f"{bad}: {err} (in grids[{n}])")
            except TypeError as err:
                _fail(f"{err} (in grids[{n}])")
            for r in range(repeats):
                p = Point(run, r)
                points.setdefault(p.id, p)
    resources = source.get("resources")
    if resources is not None:
        if not isinstance(resources, dict):
            _fail("'resources' must be a mapping like {num_cpus: 1, num_gpus: 0}")
        for key, value in resources.items():
            if key not in RESOURCE_KEYS:
                _fail(f"unknown key {key!r} in resources (allowed: {list(RESOURCE_KEYS)})")
            if not isinstance(value, (int, float)) or value < 0:
                _fail(f"resources.{key}={value!r}: must be a number >= 0")
    return GridSpec(str(source.get("name", "sweep")), tuple(points.values()), source, resources)


def load(spec: str | Path | None = None, preset: str | None = None) -> GridSpec:
    """A spec from a YAML file, or a named preset (smoke, default)."""
    if (spec is None) == (preset is None):
        raise ValueError("give a grid spec file or --preset (one of " + ", ".join(presets()) + ")")
    if preset is not None:
        if preset not in presets():
            raise ValueError(f"unknown sweep preset {preset!r}: allowed presets are {presets()}")
        path = SPEC_DIR / f"{preset}.yaml"
    else:
        path = Path(spec)
        if not path.exists():
            raise ValueError(f"grid spec {path} does not exist")
    return parse(yaml.safe_load(path.read_text()))


def presets() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))
