"""CSV export of runs and their metrics, unsampled, in two shapes.

* long: one row per recorded metric value — the run columns (``RUN_COLUMNS``), then
  ``step, wall_time_s, metric, value``.
* wide: one row per (run, step) — the run columns, the run config flattened into
  ``config.<key>`` (nested keys joined with ``.``, lists as JSON), ``step``,
  ``wall_time_s`` (the latest wall time at that step), then one column per metric name
  (the last value recorded at that step; a metric whose name clashes with a column above
  is called ``metric.<name>``).

``COLUMNS`` says what every column holds, with its unit; the README's column dictionary
and the dashboard's download help are that text. A run's status, sweep id, tags and notes
ride along, so a file explains itself. The effective shape (``B_seqs``, ``T_tokens``,
``R_rows``: B and T after the preset's defaults, R clipped to B·T, empty for exact runs,
whose ``rank`` is empty too) comes from the caller's ``shape(config)`` (the run schema
lives in ``engine.config``, which storage does not import); without one it is empty.

Floats are written with full precision, so ``pandas.read_csv`` gives back the stored values.
Every CSV written here (``to_csv_bytes``, ``export_csv``) goes through ``neutralize``: a
text cell or header that starts with ``=``, ``+``, ``-``, ``@``, tab or CR is prefixed with
``'`` so a spreadsheet shows it instead of evaluating it as a formula; numbers stay numbers.

Exports stream: ``export_csv`` (and ``csv_chunks``, ``export_bytes``) reads the metric rows a
chunk at a time (``storage.stream``; wide: whole runs per chunk, since a run's steps pivot
together) and writes each chunk as it comes, so memory is bounded by the chunk, not by the
table; the bytes are those of ``to_csv_bytes`` of ``long_frame``/``wide_frame``, which build
the whole table in memory.

``write_file`` is the one way files are written: atomically (a temporary file in the same
directory, then ``os.replace``), never over an existing file unless ``force``, and never
over the store's own SQLite database or its ``-wal``/``-shm``/``-journal`` companions,
however the path is spelt (relative, ``..``, ``~``, a symlink or a hard link to it), and
never over anything but a regular file (a device, a FIFO, a socket: ``storage.outputs``).
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import pandas as pd

from .db import StorageError
from .errors import InvalidValueError
from .outputs import OutputExistsError, refuse_special
from .store import RunRecord, RunStore, empty_metrics_frame

__all__ = [
    "RUN_COLUMNS", "COLUMNS", "LONG_COLUMNS", "WIDE_RUN_COLUMNS", "EXPORT_FORMATS", "FORMULA_PREFIXES", "long_frame", "wide_frame",
    "export_csv", "csv_chunks", "export_bytes", "to_csv_bytes", "flatten_config", "neutralize", "database_files",
    "write_file",
]

RUN_COLUMNS = ["run_id", "run_name", "status", "sweep_id", "tags", "notes", "estimator", "rank", "lam", "seed",
               "preset", "steps", "B_seqs", "T_tokens", "R_rows"]
SHAPE_COLUMNS = ("B_seqs", "T_tokens", "R_rows")
LONG_COLUMNS = [*RUN_COLUMNS, "step", "wall_time_s", "metric", "value"]
WIDE_RUN_COLUMNS = RUN_COLUMNS
COLUMNS = {  # column → what it holds (the README's column dictionary and the download help)
    "run_id": "the run's id in the database",
    "run_name": "the run's name",
    "status": "queued, running, finished, failed, cancelled or interrupted, when exported",
    "sweep_id": "the launch the run belongs to (empty for a run launched alone by hand)",
    "tags": "the run's tags, comma separated",
    "notes": "the run's notes",
    "estimator": "the dW estimator; exact is plain backprop",
    "rank": "the sketch rank R the run was launched with (empty for exact runs)",
    "lam": "shrink λ",
    "seed": "seed of the initial parameters, batches and sketches",
    "preset": "the model preset",
    "steps": "training steps the run was launched for",
    "B_seqs": "effective batch size B, in sequences",
    "T_tokens": "effective sequence length T, in tokens",
    "R_rows": "effective rank R, in rows of B·T kept (clipped to B·T; empty for exact runs)",
    "config.<field>": "(wide) the run's stored config, one column per field",
    "step": "the training step of the value (0: before the first update)",
    "wall_time_s": "seconds of training wall time at that step, across resumes",
    "metric": "(long) the metric's name: val_loss and train_loss in nats/token, tokens_per_s, cos_mean and "
              "cos/<layer> (cosine of sketched to exact dW), rel_err_*, mem_*_bytes in bytes, and the "
              "system metrics sys/* (process CPU %, RSS MiB, host load, device memory MiB, GPU utilisation %, "
              "GPU power W)",
    "value": "(long) the metric's value; wide files have one column per metric instead",
}
EXPORT_FORMATS = ("long", "wide")
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
DB_COMPANIONS = ("", "-wal", "-shm", "-journal")


def flatten_config(config: dict, prefix: str = "config.") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"config.a.b": 1, "config.c": "[1, 2]"}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_config(value, name + "."))
        elif isinstance(value, (dict, list, tuple)):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out


def _runs(store: RunStore, run_ids: Optional[Sequence[int]]) -> list[RunRecord]:
    if run_ids is None:
        return store.runs.list_runs()
    if isinstance(run_ids, int):
        run_ids = [run_ids]
    return [store.runs.get_run(int(r)) for r in dict.fromkeys(run_ids)]


Shape = Callable[[dict], Mapping[str, Any]]  # stored config → {B_seqs, T_tokens, R_rows}


def _run_info(runs: list[RunRecord], shape: Optional[Shape], config: bool = False) -> pd.DataFrame:
    rows = []
    for r in runs:
        exact = r.estimator == "exact"
        row = {"run_id": r.id, "run_name": r.name, "status": r.status, "sweep_id": r.sweep_id,
               "tags": ", ".join(r.tags or []), "notes": r.notes or "", "estimator": r.estimator,
               "rank": None if exact else r.rank, "lam": r.lam, "seed": r.seed, "preset": r.preset, "steps": r.steps,
               **dict.fromkeys(SHAPE_COLUMNS)}
        if shape is not None:
            row.update({k: v for k, v in shape(r.config).items() if k in SHAPE_COLUMNS})
        if exact:
            row["R_rows"] = None
        if config:
            flat = flatten_config(r.config)
            if exact:  # an exact run has no rank or λ of its own: its config's are unused defaults
                flat = {k: (None if k in ("config.rank", "config.lam") else v) for k, v in flat.items()}
            row.update(flat)
        rows.append(row)
    frame = pd.DataFrame.from_records(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=RUN_COLUMNS)
    frame["run_id"] = frame["run_id"].astype("int64")
    for col in ("rank", "seed", "steps", *SHAPE_COLUMNS):
        frame[col] = frame[col].astype("Int64")
    for col in (c for c in frame.columns if c.startswith("config.")):
        raw = [row.get(col) for row in rows]
        values = [v for v in raw if v is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            frame[col] = pd.array(raw, dtype="Int64")  # an int field left empty for some runs stays an int
    return frame


def long_frame(store: RunStore, run_ids: Optional[Sequence[int]], shape: Optional[Shape] = None) -> pd.DataFrame:
    """Every metric value of ``run_ids`` (None: all runs), ordered by run then record order;
    ``shape(config)`` fills the effective B, T, R columns. The whole table in memory:
    :func:`export_csv` streams it instead."""
    return _whole(_long_frames(store, _runs(store, run_ids), shape))


def wide_frame(store: RunStore, run_ids: Optional[Sequence[int]], shape: Optional[Shape] = None) -> pd.DataFrame:
    """One row per (run, step) with run/config columns and one column per metric;
    ``shape(config)`` fills the effective B, T, R columns. The whole table in memory:
    :func:`export_csv` streams it instead."""
    return _whole(_wide_frames(store, _runs(store, run_ids), shape))


def _whole(frames: Iterator[pd.DataFrame]) -> pd.DataFrame:
    """The parts of an export (after its empty first frame) as one frame."""
    empty, *parts = frames
    return pd.concat(parts, ignore_index=True) if parts else empty


def _long_frames(store: RunStore, runs: list[RunRecord], shape: Optional[Shape], size: Optional[int] = None,
                 neutral: bool = False) -> Iterator[pd.DataFrame]:
    """The long export of ``runs`` in parts: first a frame of no rows (the columns), then
    one per chunk of about ``size`` metric rows (``storage.stream``), by run then record
    order. ``neutral``: text cells formula-neutralised (not the column names)."""
    info = _run_info(runs, shape)
    info = _neutral_cells(info) if neutral else info
    yield _long_part(empty_metrics_frame(), info)
    for m in store.metrics.chunks([r.id for r in runs], size=size):
        if neutral and m["name"].str.startswith(FORMULA_PREFIXES).any():
            m["name"] = m["name"].map(_neutral)
        yield _long_part(m, info)


def _long_part(m: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    out = m.merge(info, on="run_id", how="left").rename(columns={"name": "metric", "wall_time": "wall_time_s"})
    out = out.sort_values(["run_id", "id"], kind="stable")
    return out[LONG_COLUMNS].reset_index(drop=True)


def _wide_frames(store: RunStore, runs: list[RunRecord], shape: Optional[Shape], size: Optional[int] = None,
                 neutral: bool = False) -> Iterator[pd.DataFrame]:
    """The wide export of ``runs`` in parts, as :func:`_long_frames`; each part holds whole
    runs (a run's steps pivot together). The metric columns are every name the runs
    recorded, read in the same snapshot as the rows."""
    info = _run_info(runs, shape, config=True)
    config_cols = sorted(c for c in info.columns if c.startswith("config."))
    info = info[WIDE_RUN_COLUMNS + config_cols]
    taken = set(info.columns) | {"step", "wall_time_s"}
    info = _neutral_cells(info) if neutral else info
    ids = [r.id for r in runs]
    with store.metrics.snapshot() as snap:
        columns = [*info.columns, "step", "wall_time_s", *sorted({_metric_column(n, taken) for n in snap.names(ids)})]
        yield _wide_part(empty_metrics_frame(), info, taken, columns)
        for m in snap.chunks(ids, size=size, whole_runs=True):
            yield _wide_part(m, info, taken, columns)


def _metric_column(name: str, taken: set[str]) -> str:
    return f"metric.{name}" if name in taken else name


def _wide_part(m: pd.DataFrame, info: pd.DataFrame, taken: set[str], columns: list[str]) -> pd.DataFrame:
    """The wide rows of the whole runs in ``m``; a metric none of them recorded is empty."""
    m = m.assign(name=[_metric_column(n, taken) for n in m["name"]])
    if m.empty:
        per_step = pd.DataFrame({"run_id": pd.Series(dtype="int64"), "step": pd.Series(dtype="int64"),
                                 "wall_time_s": pd.Series(dtype="float64")})
    else:
        wall = m.groupby(["run_id", "step"])["wall_time"].max().rename("wall_time_s")
        last = m.drop_duplicates(["run_id", "step", "name"], keep="last")  # m is ordered by id
        values = last.pivot(index=["run_id", "step"], columns="name", values="value")
        values.columns.name = None
        per_step = wall.to_frame().join(values).reset_index()
    out = info.merge(per_step, on="run_id", how="inner")
    out = out.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    return out.reindex(columns=columns)


def _neutral(value):
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_PREFIXES) else value


def neutralize(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose text cells and column names starting with a
    spreadsheet formula character (``FORMULA_PREFIXES``) are prefixed with ``'``.
    Only ``str`` values change: numbers, negative ones included, are left as they are."""
    return _neutral_cells(frame.rename(columns=_neutral))


def _neutral_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """``neutralize`` of the cells alone: the column names stay."""
    out = frame.copy(deep=False)
    for i in range(out.shape[1]):
        column = out.iloc[:, i]
        if not pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
            out.isetitem(i, column.map(_neutral))
    return out


def to_csv_bytes(frame: pd.DataFrame) -> bytes:
    """UTF-8 CSV of ``frame`` without the index, formula-neutralised (for a download button)."""
    return neutralize(frame).to_csv(index=False).encode("utf-8")


def database_files(store: RunStore) -> list[Path]:
    """The files of ``store``'s SQLite database (itself and its companions, under its
    own name and its symlink target's); [] for other databases and in-memory SQLite."""
    url = store.engine.url
    database = url.database
    if url.get_backend_name() != "sqlite" or database in (None, "", ":memory:") or "mode=memory" in database:
        return []
    path = Path(database).expanduser().absolute()
    real = Path(os.path.realpath(path))  # SQLite names the companions of a symlinked file after its target
    return list(dict.fromkeys(p.with_name(p.name + suffix) for p in (path, real) for suffix in DB_COMPANIONS))


def _same_file(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_output(store: Optional[RunStore], path: "str | os.PathLike[str]", force: bool = False) -> Path:
    """The file :func:`write_file` writes for ``path`` (a symlink resolved), once it may:
    :class:`StorageError` when ``path`` is ``store``'s database or a companion of it (always,
    ``force`` or not), a directory or anything else but a regular file (a device, a FIFO,
    a socket: ``storage.outputs``; ``force`` or not), a file that exists while ``force`` is
    false, or in a directory that does not exist. Writes nothing: a command checks its output with it
    before its work."""
    shown = os.fspath(path)
    target = Path(os.path.realpath(os.path.expanduser(shown)))
    for db_file in database_files(store) if store is not None else []:
        if _same_file(target, db_file):
            raise StorageError(f"refusing to write {shown}: it is the database file {db_file}; choose another output path")
    if target.is_dir():
        raise StorageError(f"cannot write {shown}: it is a directory; give a file name")
    refuse_special(target, shown)  # a device, FIFO or socket: never replaced, --force or not
    if target.exists() and not force:
        raise OutputExistsError(shown)
    if not target.parent.is_dir():
        raise StorageError(f"cannot write {shown}: directory {target.parent} does not exist; create it or choose another path")
    return target


def write_file(store: Optional[RunStore], path: "str | os.PathLike[str]", content: "str | bytes | Iterable[bytes]",
               force: bool = False) -> Path:
    """Write ``content`` (text as UTF-8; an iterable of bytes piece by piece, as it comes) to
    ``path`` atomically; return the path written.

    Raises :class:`StorageError`, writing nothing, when ``path`` is ``store``'s
    database or a companion of it, or not a regular file (always, ``force`` or not), when
    it exists and ``force`` is false, or when it cannot be written. A symlink is followed: its
    target gets the new content."""
    shown = os.fspath(path)
    target = check_output(store, path, force)
    data = content.encode("utf-8") if isinstance(content, str) else content
    chunks = [data] if isinstance(data, bytes) else data
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:  # an iterable is written as it comes: never whole in memory
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"cannot write {shown} ({e.strerror or e}); choose another output path") from e
    except BaseException:  # the content's own error (a database one while streaming): no file either
        tmp.unlink(missing_ok=True)
        raise
    return target


def export_csv(
    store: RunStore,
    path: "str | os.PathLike[str]",
    run_ids: Optional[Sequence[int]] = None,
    fmt: str = "long",
    force: bool = False,
    shape: Optional[Shape] = None,
) -> int:
    """Write runs (None: all) to ``path`` as ``long`` or ``wide`` CSV with ``write_file``
    (atomic; an existing file only with ``force``; never the database); return the data
    rows written. Streamed: read and written a chunk of metric rows at a time
    (:func:`csv_chunks`), so memory is bounded by the chunk, not by the table."""
    counted = [0]
    write_file(store, path, csv_chunks(store, run_ids, fmt, shape, counted=counted), force=force)
    return counted[0]


def csv_chunks(store: RunStore, run_ids: Optional[Sequence[int]] = None, fmt: str = "long",
               shape: Optional[Shape] = None, *, size: Optional[int] = None,
               counted: Optional[list[int]] = None) -> Iterator[bytes]:
    """The export's CSV (UTF-8, formula-neutralised) piece by piece: the header, then one
    piece per chunk of about ``size`` metric rows (default ``storage.stream.CHUNK_ROWS``;
    wide: whole runs). Joined, the pieces are ``to_csv_bytes`` of ``long_frame`` or
    ``wide_frame``, byte for byte. ``counted[0]`` counts the data rows as they go. The runs
    are checked (an unknown id raises) and the format too before the first piece."""
    if fmt not in EXPORT_FORMATS:
        raise InvalidValueError(f"unknown export format {fmt!r}; use 'long' or 'wide'")
    frames = (_long_frames if fmt == "long" else _wide_frames)(store, _runs(store, run_ids), shape, size, neutral=True)
    return _csv_pieces(frames, counted if counted is not None else [0])


def _csv_pieces(frames: Iterator[pd.DataFrame], counted: list[int]) -> Iterator[bytes]:
    for i, part in enumerate(frames):
        yield part.rename(columns=_neutral).to_csv(index=False, header=i == 0).encode("utf-8")
        counted[0] += len(part)


def export_bytes(store: RunStore, run_ids: Optional[Sequence[int]] = None, fmt: str = "long",
                 shape: Optional[Shape] = None) -> bytes:
    """:func:`export_csv`'s file as bytes (a download button's data): streamed through an
    anonymous temporary file, so it takes the file's bytes and one chunk, not the table."""
    with tempfile.TemporaryFile() as f:
        for piece in csv_chunks(store, run_ids, fmt, shape):
            f.write(piece)
        f.seek(0)
        return f.read()
