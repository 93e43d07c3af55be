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

from .result import flatten, write_atomic

RESULT = "result.json"
ERROR = "error.json"


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


def write_error(folder: Path, config: dict, error: str) -> None:
    """Record why a point failed (its result.json, if any, is removed)."""
    (folder / RESULT).unlink(missing_ok=True)
    write_atomic(folder / ERROR, json.dumps({"config": config, "error": error}, indent=1))


def point_rows(sweep_dir: Path) -> list[dict]:
    """One row per finished point folder: its RunResult flattened, or its error."""
    rows = []
    for point in sorted((sweep_dir / "points").iterdir()) if (sweep_dir / "points").exists() else []:
        if point.name.startswith("."):
            continue
        if (point / RESULT).exists():
            row = flatten(json.loads((point / RESULT).read_text()))
            row |= {"point_id": point.name, "status": "ok", "error": None}
        elif (point / ERROR).exists():
            err = json.loads((point / ERROR).read_text())
            row = {f"config.{k}": v for k, v in err.get("config", {}).items()}
            row |= {"point_id": point.name, "status": "failed", "error": err.get("error")}
        else:
            continue
        rows.append(row)
    return rows


def collect(sweep_dir: str | Path) -> pd.DataFrame:
    """Gather every point into results.parquet (written atomically) and return the table."""
    sweep_dir = Path(sweep_dir)
    df = pd.DataFrame(point_rows(sweep_dir))
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    write_atomic(sweep_dir / "results.parquet", buf.getvalue())
    return df


def load(sweep_dir: str | Path) -> pd.DataFrame:
    """The sweep's table, with the config columns under short names (k, alpha, policy, ...)."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / "results.parquet"
    if not path.exists():
        raise ValueError(f"{sweep_dir}: no results.parquet (run `mtplab sweep` first)")
    df = pd.read_parquet(path)
    return df.rename(columns={c: c.split(".", 1)[1] for c in df.columns if c.startswith("config.")})


def write_index(results_root: str | Path) -> Path:
    """results/index.html: every sweep with its date, environment, point counts and a link."""
    root = Path(results_root)
    rows = []
    for sj in sorted(root.glob("*/sweep.json")):
        s = json.loads(sj.read_text())
        env = s.get("env", {})
        report = sj.parent / "report.html"
        link = f'<a href="{html.escape(sj.parent.name)}/report.html">report</a>' if report.exists() else "no report yet"
        rows.append(
            f"<tr><td>{html.escape(s.get('name', sj.parent.name))}</td><td>{html.escape(s.get('finished', ''))}</td>"
            f"<td>{html.escape(str(env.get('device', '')))} / onnxruntime {html.escape(str(env.get('onnxruntime', '')))}</td>"
            f"<td>{s.get('ok', 0)}</td><td>{s.get('failed', 0)}</td><td>{link}</td></tr>"
        )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>mtplab results</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:4px 12px;text-align:left}</style></head><body>"
        "<h1>mtplab sweeps</h1><table><tr><th>sweep</th><th>finished</th><th>environment</th><th>ok</th>"
        "<th>failed</th><th></th></tr>" + "".join(rows) + "</table></body></html>"
    )
    path = root / "index.html"
    write_atomic(path, page)
    return path
