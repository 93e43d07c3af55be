"""Sweep grid specs: YAML with lists per dimension, validated before any point runs."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from mtplab.base.names import likeliest
from mtplab.experiment import config, point_ids
from mtplab.experiment.config import RunConfig, field_problem
from mtplab.model.config import PRESETS

SPEC_DIR = Path(__file__).parent / "grids"
DIMENSIONS = config.dimensions()  # every RunConfig field a spec may vary
SPEC_KEYS = ("name", "defaults", "grids", "repeats", "resources", "allow_mismatch")
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True)
class Point:
    """One sweep point: a RunConfig and its repeat index, with a stable readable id."""

    run: RunConfig
    repeat: int = 0

    @property
    def id(self) -> str:
        return point_ids.point_id(self.run, self.repeat)


@dataclass(frozen=True)
class GridSpec:
    name: str
    points: tuple[Point, ...]
    source: dict
    resources: dict | None = None  # per-point resource request for cluster executors
    allow_mismatch: bool = False  # a point whose lossless check fails does not fail the sweep


def check_name(name) -> str | None:
    """Why a sweep name is not a safe folder name under the results root, or None."""
    if name == "index.html":
        return f"name={name!r}: is the results index's file name; choose another"
    if isinstance(name, str) and SAFE_NAME.fullmatch(name):
        return None
    return (
        f"name={name!r}: must be a folder name of letters, digits, '.', '_' or '-' "
        "(up to 100, starting with a letter or digit)"
    )


def _dimension_problems(where: str, d, allow_scalars: bool) -> list[str]:
    """Every problem with one mapping of dimensions: unknown keys, shapes, and each key's bad values."""
    if not isinstance(d, dict):
        return [f"{where} must be a mapping of dimension: values (got {d!r})"]
    dimensions = config.dimensions()
    out = _unknown_keys(d, dimensions, f" in {where}")
    for key, value in d.items():
        if key not in dimensions:
            continue
        if isinstance(value, list):
            if not value:
                out.append(f"{key!r} in {where} is an empty list")
                continue
            repeated = [v for i, v in enumerate(value) if _hashable(v) and v in value[:i]]
            if repeated:
                out.append(f"{key!r} in {where} repeats {', '.join(map(repr, dict.fromkeys(repeated)))}: give each value once")
        elif not allow_scalars:
            out.append(f"{key!r} in {where} must be a list (got {value!r})")
            continue
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, (list, tuple)) for v in values):  # alpha per row: a run's, not a sweep dimension's
            out.append(f"{key!r} in {where} holds a list in a list ({value!r}): a sweep gives each point one value "
                       "(alpha per batch row runs from `mtplab run --alpha 0.9,0.3 --batch 2` or run_point)")
            continue
        problem = field_problem(key, values)
        if problem:
            out.append(f"{key} in {where}: {problem}")
    return out


def _unknown_keys(d: dict, allowed, where: str = "") -> list[str]:
    """One problem naming every key of `d` not allowed, each with its likeliest meaning, and the allowed keys once."""
    unknown = [key for key in d if key not in allowed]
    if not unknown:
        return []
    named = [f"{key!r}" + (f" (did you mean {close!r}?)" if (close := likeliest(str(key), allowed)) else "")
             for key in unknown]
    return [f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(named)}{where} (allowed: {list(allowed)})"]


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _resource_problems(resources) -> list[str]:
    if resources is None:
        return []
    if not isinstance(resources, dict):
        return ["'resources' must be a mapping like {num_cpus: 1, num_gpus: 0}"]
    out = []
    for key, value in resources.items():
        if key not in RESOURCE_KEYS:
            out.append(f"unknown key {key!r} in resources (allowed: {list(RESOURCE_KEYS)})")
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            out.append(f"resources.{key}={value!r}: must be a number >= 0")
    return out


def _shape_problems(source: dict) -> list[str]:
    """Every problem found without expanding the grid: keys, shapes, per-dimension values, scalars."""
    dimensions = config.dimensions()
    top_keys = (*SPEC_KEYS, *dimensions)
    out = _unknown_keys(source, top_keys)
    out += _dimension_problems("defaults", source.get("defaults") or {}, allow_scalars=True)
    top = {k: v for k, v in source.items() if k in dimensions}
    out += _dimension_problems("the spec", top, allow_scalars=False)
    grids = source.get("grids") or [{}]
    if source.get("grids") == []:
        out.append("'grids' is an empty list: give at least one grid (a mapping of dimensions), or leave grids out")
    if not isinstance(grids, list):
        out.append(f"'grids' must be a list of mappings (got {grids!r})")
    else:
        for n, g in enumerate(grids):
            if g == {} and source.get("grids"):
                out.append(f"grids[{n}] is empty: name at least one dimension in it")
            out += _dimension_problems(f"grids[{n}]", g, allow_scalars=False)
    if not source.get("defaults") and not top and not source.get("grids"):
        out.append("the spec names no dimension (no defaults, no grid): every point would be all defaults (model "
                   f"{config.defaults()['model']}, {config.defaults()['tokens']} tokens); give defaults or a grid")
    repeats = source.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        out.append(f"'repeats' must be an integer >= 1 (got {repeats!r})")
    if "name" in source and (problem := check_name(source["name"])):
        out.append(problem)
    if not isinstance(source.get("allow_mismatch", False), bool):
        out.append(f"allow_mismatch={source['allow_mismatch']!r}: must be true or false (a boolean)")
    return out + _resource_problems(source.get("resources"))


def _expand(source: dict) -> tuple[dict[str, Point], list[str]]:
    """The points of a well-shaped spec, and every problem across fields or between point ids."""
    defaults = source.get("defaults") or {}
    dimensions = config.dimensions()
    top = {k: v for k, v in source.items() if k in dimensions}
    points: dict[str, Point] = {}
    problems: list[str] = []
    for n, g in enumerate(source.get("grids") or [{}]):
        if both := sorted(set(top) & set(g)):
            problems.append(f"{', '.join(both)} set at the top level and in grids[{n}]: the grid's values would "
                            "replace the top level's; set each field in one place (`defaults:` for a default)")
            continue
        dims = {k: (v if isinstance(v, list) else [v]) for k, v in defaults.items()} | top | g
        keys, explicit = list(dims), set(top) | set(g)
        for values in itertools.product(*(dims[k] for k in keys)):
            params = config.with_implied_acceptance(dict(zip(keys, values)))
            bad = _drafter_params(params, explicit)
            bad += config.engine_param_problems(params.get("engine", "mtplab"),
                                                {n: params[n] for n in explicit if n in params})
            try:
                run = RunConfig(**params)
            except config.ConfigError as err:
                bad += [b for b in err.problems if b not in bad]
            if bad:
                problems += [f"{b} (in grids[{n}])" for b in bad if f"{b} (in grids[{n}])" not in problems]
                continue
            for r in range(source.get("repeats", 1)):
                p = Point(run, r)
                other = points.setdefault(p.id, p)
                if other.run != run:  # one id for two configs: a point would be silently dropped
                    diff = {k: (v, getattr(run, k)) for k, v in other.run.to_dict().items() if getattr(run, k) != v}
                    problems.append(f"point id {p.id} names two different points ({diff}); make them differ in the id")
    return points, problems


def _drafter_params(params: dict, explicit: set[str]) -> list[str]:
    """A drafter's parameters in one point: from `defaults`, they apply where the point's drafter takes them
    (dropped elsewhere, in place); given explicitly (the spec's top level, a grid) to a drafter that does not
    take them, they are refused, as on the command line."""
    drafter = params.get("drafter", config.defaults()["drafter"])
    for name, takers in config.drafter_params().items():
        if name in params and name not in explicit and drafter not in takers:
            del params[name]
    return config.drafter_param_problems(drafter, {n: params[n] for n in config.drafter_params() if n in params})


def _upgrade(source: dict) -> tuple[dict, list[str]]:
    """An older spec's `preset:` (the model) as `model:`, at every level; both at one level is a problem."""
    problems: list[str] = []

    def level(where: str, d):
        if not isinstance(d, dict) or "preset" not in d:
            return d
        if "model" in d:
            problems.append(f"preset and model in {where}: name the model once (model takes a preset name or a folder)")
            return d
        return config.upgrade(d)

    out = level("the spec", source)
    if "defaults" in out:
        out = {**out, "defaults": level("defaults", out["defaults"])}
    if isinstance(out.get("grids"), list):
        out = {**out, "grids": [level(f"grids[{n}]", g) for n, g in enumerate(out["grids"])]}
    return out, problems


MAX_POINTS = 2000  # a spec that would make more is refused unless its size is confirmed (mtplab sweep --yes)


def planned_points(source: dict) -> int:
    """How many points a well-shaped spec makes (repeats included), counted before any is built."""
    top = {k: v for k, v in source.items() if k in config.dimensions()}
    defaults = source.get("defaults") or {}
    total = 0
    for g in source.get("grids") or [{}]:
        dims = {k: v for k, v in defaults.items()} | top | g
        total += math.prod(len(v) if isinstance(v, list) else 1 for v in dims.values())
    return total * source.get("repeats", 1)


def parse(source: dict, max_points: int | None = MAX_POINTS) -> GridSpec:
    """Expand a spec (a union of cartesian products over `grids`, or one product) into points.

    Every problem is found before any point runs and reported at once, each naming its key and
    all of its bad values. An older spec's `preset:` reads as `model:`. A spec of more than max_points points
    (None: no limit) is refused before it is expanded.
    """
    if not isinstance(source, dict):
        _fail(["the top level must be a mapping"])
    source, problems = _upgrade(source)
    problems += _shape_problems(source)
    if problems:
        _fail(problems)
    if max_points is not None and (count := planned_points(source)) > max_points:
        _fail([f"it makes {count:,} points, more than {max_points:,}: confirm with `mtplab sweep --yes` (a point "
               "takes seconds to minutes), or narrow it"])
    points, problems = _expand(source)
    if problems:
        _fail(problems)
    return GridSpec(
        str(source.get("name", "sweep")),
        tuple(points.values()),
        source,
        source.get("resources"),
        source.get("allow_mismatch", False),
    )


def _fail(problems: list[str]) -> None:
    raise ValueError("grid spec: " + "; ".join(problems))


def check_models(spec: GridSpec) -> None:
    """Open every model folder the spec names and hold each point to it: a bad folder, or a point its
    model cannot run (k, commit, tokens, a batch's memory), is refused before any point runs. A preset is checked from
    its config, and opened (built where missing, as its calibration would) for a batch > 1's memory."""
    from mtplab.engine.models import model_for
    from mtplab.experiment.build import check_run_on_model

    problems, opened = [], {}
    for p in spec.points:
        if p.run.model in PRESETS and p.run.batch == 1:
            continue
        key = (p.run.model, p.run.int4)
        if key not in opened:
            try:
                opened[key] = model_for(p.run).description
            except ValueError as err:
                opened[key] = None
                problems.append(f"model: {err}")
        if opened[key] is not None:
            try:
                check_run_on_model(p.run, opened[key])
            except ValueError as err:
                problems.append(f"point {p.id}: {err}")
    if problems:
        _fail(sorted(set(problems)))


def require_engines(spec: GridSpec) -> None:
    """Refuse a spec whose engines' packages are not installed, with the install line."""
    if any(p.run.engine == "ort-genai" for p in spec.points):
        from mtplab.experiment.genai_runner import require_genai

        try:
            require_genai()
        except ValueError as err:
            _fail([f"engine: {err}"])


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (safe_load keeps the last, silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not _hashable(key):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(spec: str | Path | None = None, preset: str | None = None, max_points: int | None = MAX_POINTS) -> GridSpec:
    """A spec from a YAML file, or a named preset (smoke, default)."""
    if (spec is None) == (preset is None):
        raise ValueError("give a grid spec file or --grid (one of " + ", ".join(presets()) + ")"
                         + (", not both" if spec is not None else ""))
    if preset is not None:
        if preset not in presets():
            raise ValueError(f"unknown sweep preset {preset!r}: allowed presets are {presets()}")
        path = SPEC_DIR / f"{preset}.yaml"
    else:
        path = Path(spec)
        if not path.exists():
            raise ValueError(f"grid spec {path} does not exist")
    if path.is_dir():
        raise ValueError(f"grid spec {path} is a folder; give a YAML file")
    try:
        source = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as err:
        raise ValueError(f"grid spec {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"grid spec {path}: YAML syntax error{where}: {problem}") from None
    if preset is None and isinstance(source, dict):
        source = models_beside(source, path.parent)
    return parse(source, max_points)


def models_beside(source: dict, base: Path) -> dict:
    """The spec with each relative `model:` folder that exists beside the spec file made absolute, so a spec
    names its models the same from any working directory (others stay as written: relative to it)."""

    def fix(value):
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, str) and value not in PRESETS and not Path(value).is_absolute():
            candidate = base / value
            return str(candidate.resolve()) if candidate.is_dir() else value
        return value

    out = dict(source)
    for holder in [out, out.get("defaults"), *(out.get("grids") or [])]:
        for key in ("model", "preset"):
            if isinstance(holder, dict) and key in holder:
                holder[key] = fix(holder[key])
    return out


def presets() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))
