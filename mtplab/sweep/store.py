"""The results store: point folders, results.parquet, sweep.json and results/index.html."""

from __future__ import annotations

import html
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from mtplab.base.files import write_atomic
from mtplab.measure.result import RESULT_COLUMNS, flatten

RESULT = "result.json"
ERROR = "error.json"
CORRUPT = ".corrupt"  # points/.corrupt/: unreadable or incomplete points moved aside on resume
STATUSES = ("ok", "suspect", "mismatch", "failed")  # suspect: lossless, but a timed side beyond its timing floor's
# band (mtplab.measure.floor); mismatch: ran, but the lossless check failed (result kept)
LOSSLESS = ("ok", "suspect")  # the points that ran and passed their lossless check


@contextmanager
def point_folder(points_dir: str | Path, point_id: str) -> Iterator[Path]:
    """A hidden scratch folder that becomes points/<id>/ in one rename when the block completes.

    Readers never see half a point; a block that dies leaves only the hidden folder, which a
    resumed sweep clears.
    """
    points_dir = Path(points_dir).resolve()
    tmp = Path(tempfile.mkdtemp(prefix=f".{point_id}.", dir=points_dir))
    yield tmp
    final = points_dir / point_id
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)


def error_summary(error, limit: int = 160) -> str:
    """A failed point's error in one line: its first, or the exception's own last line where the first names only a
    wrapper (papermill's "PapermillExecutionError: "), shortened to `limit` characters."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()] if isinstance(error, str) else []
    if not lines:
        return "no error recorded"
    line = lines[0] if not lines[0].endswith(":") and lines[0] != "..." else lines[-1]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def write_error(folder: Path, config: dict, error: str) -> None:
    """Record why a point failed (its result.json, if any, is removed)."""
    (folder / RESULT).unlink(missing_ok=True)
    write_atomic(folder / ERROR, json.dumps({"config": config, "error": error}, indent=1))


def status_counts(counts: dict) -> str:
    """`N ok, M mismatch, F failed` (and `S suspect` where a point was): a sweep's points by status, in words."""
    return ", ".join(f"{counts.get(status, 0)} {status}" for status in STATUSES
                     if status != "suspect" or counts.get(status))


def result_status(result: dict) -> str:
    """ok; mismatch when the point ran but its lossless check failed; suspect when it was lossless but a timed side
    was beyond its timing floor's band."""
    if not result.get("lossless", True):
        return "mismatch"
    return "suspect" if result.get("suspect") else "ok"


def published_problem(data: dict) -> str | None:
    """Why a stored result's published numbers cannot be published (None when they can): a speedup, rate, interval,
    efficiency or acceptance figure that its own rounds and accepted counts do not give (mtplab.measure.published:
    a result.json edited, or written by other code), or a value that is not a number where one belongs."""
    from mtplab.measure.published import result_problems
    from mtplab.measure.result import RunResult

    config = data.get("config") or {}
    if config.get("engine", "mtplab") != "mtplab":  # the peer's points publish genai's own rounds
        return None
    try:
        problems = result_problems(RunResult(**data), int(config["tokens"]), int(config["k"]), None)
    except (TypeError, ValueError, KeyError) as err:
        return f"its numbers do not read as a result's ({type(err).__name__}: {err})"
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"its published numbers are not its rounds': {problems[0]}{more}"


def point_folders(points_dir: Path) -> list[Path]:
    """Installed point folders (hidden scratch and .corrupt left out), sorted by id."""
    if not points_dir.exists():
        return []
    return sorted(p for p in points_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def same_config(stored: dict, config: dict) -> bool:
    """Whether a stored result's config is a point's. Where the spec leaves `threads` to the sweep (0), the
    thread count it ran on is the sweep's choice (recorded in the result, not part of the point)."""
    from mtplab.experiment.config import defaults

    # a field added since the result was stored ran at its default then (batch: 1)
    stored = {**{k: v for k, v in defaults().items() if k in config and k not in stored}, **stored}
    if not config.get("threads", 0):
        stored, config = ({k: v for k, v in c.items() if k != "threads"} for c in (stored, config))
    return stored == config


def corrupt_reason(folder: Path, config: dict | None = None) -> str | None:
    """Why a point folder cannot be used (unreadable or invalid JSON, incomplete), or None if it can.

    With config, a result.json for another config is invalid too.
    """
    from mtplab.measure.result import RunResult, type_problem

    name = RESULT if (folder / RESULT).exists() else ERROR if (folder / ERROR).exists() else None
    if name is None:
        return f"incomplete: neither {RESULT} nor {ERROR}"
    try:
        data = json.loads((folder / name).read_text())
    except (OSError, ValueError) as err:
        return f"unreadable {name}: {err}"
    if not isinstance(data, dict):
        return f"invalid {name}: not a JSON object"
    if name == ERROR:
        return None if "error" in data else f"invalid {name}: no 'error'"
    try:
        RunResult(**data)
    except TypeError as err:
        return f"invalid {name}: {err}"
    if problem := type_problem(data):
        return f"invalid {name}: {problem}"
    if problem := published_problem(data):
        return f"invalid {name}: {problem}"
    if config is not None and not same_config(data["config"], config):
        return f"invalid {name}: its config is not this point's"
    return None


def move_corrupt(points_dir: Path, folder: Path) -> Path:
    """Move a point folder aside into points/.corrupt/ (never overwriting an earlier one)."""
    dest_dir = points_dir / CORRUPT
    dest_dir.mkdir(exist_ok=True)
    dest = dest_dir / folder.name
    n = 1
    while dest.exists():
        dest, n = dest_dir / f"{folder.name}.{n}", n + 1
    os.rename(folder, dest)
    return dest


def clear_scratch(points_dir: Path) -> None:
    """Remove hidden scratch folders left by a stopped or killed run (points/.corrupt/ is kept)."""
    for stale in points_dir.glob(".*"):
        if stale.name != CORRUPT:
            shutil.rmtree(stale, ignore_errors=True)


def point_rows(sweep_dir: Path) -> list[dict]:
    """One row per finished point folder: its RunResult flattened, or its error."""
    rows = []
    for point in point_folders(sweep_dir / "points"):
        if (point / RESULT).exists():
            result = json.loads((point / RESULT).read_text())
            if problem := published_problem(result):  # refused, named: never published as it stands
                row = {f"config.{k}": v for k, v in result.get("config", {}).items()}
                row |= {"point_id": point.name, "status": "failed", "error": f"{RESULT} refused: {problem}"}
            else:
                row = flatten(result)
                row |= {"point_id": point.name, "status": result_status(result), "error": None}
        elif (point / ERROR).exists():
            err = json.loads((point / ERROR).read_text())
            row = {f"config.{k}": v for k, v in err.get("config", {}).items()}
            row |= {"point_id": point.name, "status": "failed", "error": err.get("error")}
        else:
            continue
        rows.append(row)
    return rows


def mixed_as_text(df: pd.DataFrame) -> pd.DataFrame:
    """Columns holding both text and numbers (rounds: 3 beside rounds: 'auto') as text, which parquet can store."""
    for c in [c for c in df.columns if pd.api.types.is_object_dtype(df[c])]:
        kinds = {type(v) for v in df[c] if v is not None and not (isinstance(v, float) and v != v)}
        if str in kinds and kinds & {int, float}:
            df[c] = [None if v is None or (isinstance(v, float) and v != v) else str(v) for v in df[c]]
    return df


def collect(sweep_dir: str | Path) -> pd.DataFrame:
    """Gather every point into results.parquet (written atomically) and return the table."""
    sweep_dir = Path(sweep_dir)
    df = mixed_as_text(pd.DataFrame(point_rows(sweep_dir)))
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    write_atomic(sweep_dir / "results.parquet", buf.getvalue())
    return df


def finished_sweep(given: str | Path) -> Path:
    """The folder of a finished sweep: `given` as a path, or where that holds no sweep and `given` is a bare name, the
    sweep of that name in the results root ($MTPLAB_RESULTS, else results/). ValueError saying which it is not: no
    such folder, a file, a folder that holds no sweep, or a sweep that did not finish."""
    from mtplab.base.paths import results_root

    path, root = Path(given), results_root()
    bare = len(path.parts) == 1
    if bare and not _holds_sweep(path) and _holds_sweep(root / path):
        path = root / path
    path = path.resolve()
    named = f", nor is there a sweep named {given!s} in {root}" if bare else ""
    if not path.exists():
        raise ValueError(f"{path}: no such folder{named}: give a sweep's folder, or its name in the results root "
                         "($MTPLAB_RESULTS, else results/), or the path of one elsewhere")
    if not path.is_dir():
        raise ValueError(f"{path} is a file: give a sweep's folder (the one `mtplab sweep --name NAME` wrote, "
                         f"e.g. {root / 'demo'})")
    if not _holds_sweep(path):
        raise ValueError(f"{path} holds no sweep (no sweep.json, no points/){named}: give the folder `mtplab sweep "
                         "--name NAME` wrote")
    if not (path / "sweep.json").exists() or not (path / "results.parquet").exists():
        elsewhere = "" if path.parent == root.resolve() else f" --results {path.parent}"
        raise ValueError(f"{path}: its sweep did not finish (no sweep.json / results.parquet): "
                         f"`mtplab sweep <spec> --name {path.name}{elsewhere} --resume` finishes it")
    return path


def _holds_sweep(path: Path) -> bool:
    return path.is_dir() and ((path / "sweep.json").exists() or (path / "points").is_dir())


def check_fresh(sweep_dir: str | Path) -> None:
    """Refuse a results.parquet older than a point folder, or naming other points than the folders hold."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / "results.parquet"
    folders = point_folders(sweep_dir / "points")
    stamps = [f.stat().st_mtime_ns for folder in folders for f in (folder, *folder.iterdir())]
    how = "is older than the points in" if bool(stamps) and max(stamps) > path.stat().st_mtime_ns else None
    if how is None:  # the same points: a point folder removed since leaves the table naming it
        try:
            has_ids = "point_id" in pq.read_schema(path).names  # a sweep of no points has no columns
            ids = set(pd.read_parquet(path, columns=["point_id"]).point_id) if has_ids else set()
        except Exception as err:  # noqa: BLE001 - pyarrow's errors for a damaged file: name the file instead
            raise _unreadable(path, err) from err
        how = "names other points than those in" if ids != {f.name for f in folders} else None
    if how:
        raise ValueError(
            f"{path} {how} {sweep_dir / 'points'}: re-collect it with "
            f"`mtplab sweep <spec> --name {sweep_dir.name} --resume` (it collects without re-running finished points)"
        )


def _unreadable(path: Path, err: BaseException) -> ValueError:
    return ValueError(f"{path}: not a readable results table ({' '.join(str(err).split())}); it is collected from the "
                      "point folders: `mtplab sweep <spec> --resume` writes it again")


SUMMARY_KEYS = ("name", "points", "ok", "mismatch", "failed", "interrupted")  # what every reader of sweep.json takes
# from it (a sweep from before suspect points counts none)


def read_summary(sweep_dir: str | Path) -> dict:
    """sweep.json, the summary a sweep writes at its end; ValueError naming the file when it is not one."""
    path = Path(sweep_dir) / "sweep.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a sweep's summary ({err}); `mtplab sweep <spec> --resume` writes it again") from err
    missing = [key for key in SUMMARY_KEYS if not isinstance(summary, dict) or key not in summary]
    if missing:
        raise ValueError(f"{path}: not a sweep's summary (it lacks {', '.join(missing)}); `mtplab sweep <spec> --resume` "
                         "writes it again")
    summary.setdefault("suspect", 0)
    return summary


def load(sweep_dir: str | Path) -> pd.DataFrame:
    """The sweep's table, config columns under short names (k, alpha, policy, ...); the output ids are generated_tokens."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / "results.parquet"
    if not path.exists():
        raise ValueError(f"{sweep_dir}: no results.parquet (run `mtplab sweep` first)")
    check_fresh(sweep_dir)
    try:
        df = pd.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - pyarrow's errors for a damaged file: name the file instead
        raise _unreadable(path, err) from err
    if problem := table_problem(df, point_rows(sweep_dir)):
        raise ValueError(f"{path}: {problem}: the table is collected from the point folders; `mtplab sweep <spec> "
                         f"--name {sweep_dir.name} --resume` writes it again")
    # The generated token ids would collide with config.tokens (how many to generate).
    df = df.rename(columns={"tokens": "generated_tokens"})
    # The result's model record (JSON) would collide with config.model (the folder or preset it names).
    info = df.pop("model") if "model" in df.columns else pd.Series([None] * len(df), index=df.index)
    df = df.rename(columns={c: c.split(".", 1)[1] for c in df.columns if c.startswith("config.")})
    batch = df["batch"].fillna(1).astype(int) if "batch" in df else 1  # sweeps from before batches: 1
    # A sweep whose every point failed has no result columns: they are there, empty, as a failed row leaves them.
    missing = {c: float("nan") for c in RESULT_COLUMNS if c not in df and c not in ("tokens", "model")}
    if "status" in df and "stable" in df:  # a suspect point's speedup is no finding: it reads as not stable
        df["stable"] = df["stable"].where(df["status"] != "suspect", False)
    return df.assign(model_info=info, model_name=model_names(df, info), batch=batch, **missing)


PUBLISHED = ("status", "speedup", "tokens_per_s", "greedy_tokens_per_s", "efficiency", "stable")  # what a table may
# not say otherwise than its point folders


def table_problem(df: pd.DataFrame, rows: list[dict]) -> str | None:
    """Where a results table says otherwise than its point folders' rows (point_rows) in a published column: the
    first point and column that differ, or None."""
    if "point_id" not in df:
        return None
    fresh = {row["point_id"]: row for row in rows}
    for table_row in df.to_dict("records"):
        row = fresh.get(table_row["point_id"], {})
        for column in PUBLISHED:
            a, b = table_row.get(column), row.get(column)
            if not _same_value(a, b):
                return f"point {table_row['point_id']}'s {column} is {a!r} in the table and {b!r} in its folder"
    return None


def _same_value(a, b) -> bool:
    """Equal, or both missing (None or NaN), or numbers within a rounding of each other."""
    missing = [v is None or (isinstance(v, float) and v != v) for v in (a, b)]
    if all(missing) or a == b:
        return True
    if any(missing) or isinstance(a, str) or isinstance(b, str):
        return False
    try:
        return abs(float(a) - float(b)) <= 1e-12 * max(abs(float(a)), abs(float(b)))
    except (TypeError, ValueError):
        return False


def model_names(df: pd.DataFrame, info: pd.Series) -> list[str]:
    """Each row's model by name (a preset's, from its config: "tiny-int4" for its int4 form, whatever a result from
    before that name recorded; or a builder folder's, as its result recorded it), failed points included."""
    from mtplab.experiment.config import model_name
    from mtplab.model.config import PRESETS

    named = [json.loads(v).get("name") if isinstance(v, str) and v.startswith("{") else None for v in info]
    spec = df["model"] if "model" in df else pd.Series([""] * len(df), index=df.index)
    preset = df["preset"] if "preset" in df else pd.Series([""] * len(df), index=df.index)
    int4 = df["int4"].fillna(False) if "int4" in df else pd.Series([False] * len(df), index=df.index)
    specs = [m if isinstance(m, str) and m else str(p) for m, p in zip(spec, preset)]
    return [model_name(s, bool(q)) if s in PRESETS else n if isinstance(n, str) and n else model_name(s)
            for n, s, q in zip(named, specs, int4)]


def write_index(results_root: str | Path) -> Path:
    """results/index.html: every sweep with its date, environment, point counts and a link. A folder whose sweep.json
    does not read as a sweep's is listed as such (another sweep's page never fails over it)."""
    root = Path(results_root)
    rows = []
    for sj in sorted(root.glob("*/sweep.json")):
        try:
            s = json.loads(sj.read_text())
            if not isinstance(s, dict):
                raise ValueError(f"a JSON {type(s).__name__}, not an object")
        except (OSError, UnicodeDecodeError, ValueError) as err:
            rows.append(f"<tr><td>{html.escape(sj.parent.name)}</td><td colspan='{len(STATUSES) + 3}'>unreadable sweep.json: "
                        f"{html.escape(str(err))}</td></tr>")
            continue
        env = s.get("env") if isinstance(s.get("env"), dict) else {}
        pages = [name for name in ("report", "study") if (sj.parent / f"{name}.html").exists()]
        link = " ".join(f'<a href="{html.escape(sj.parent.name)}/{name}.html">{name}</a>' for name in pages) or \
            "no report yet"
        rows.append(
            f"<tr><td>{html.escape(str(s.get('name', sj.parent.name)))}</td><td>{html.escape(str(s.get('finished', '')))}</td>"
            f"<td>{html.escape(str(env.get('device', '')))} / onnxruntime {html.escape(str(env.get('onnxruntime', '')))}</td>"
            + "".join(f"<td>{html.escape(str(s.get(c, 0)))}</td>" for c in STATUSES) + f"<td>{link}</td></tr>"
        )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>mtplab results</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:4px 12px;text-align:left}</style></head><body>"
        "<h1>mtplab sweeps</h1><table><tr><th>sweep</th><th>finished</th><th>environment</th>" + "".join(f"<th>{s}</th>" for s in STATUSES)
        + "<th></th></tr>" + "".join(rows) + "</table></body></html>"
    )
    path = root / "index.html"
    write_atomic(path, page)
    return path
