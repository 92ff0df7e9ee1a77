"""A report's frames in its stored JSON.

Format 2 (``FRAME_FORMAT``): each frame is the base64 text of an Arrow IPC stream
(``pyarrow``), the frame's dtypes in the schema's pandas metadata, so a frame reads back
with the same columns, dtypes and values, NaN and ``pd.NA`` included. Format 1, the
reports stored before it, wrote each frame as ``{"columns", "dtypes", "data"}`` (rows of
JSON cells, NaN as null): ``legacy_frame`` still reads those.
"""

from __future__ import annotations

import base64
import math
from datetime import datetime

import numpy as np
import pandas as pd
import pyarrow as pa

FRAME_FORMAT = "arrow-ipc-base64"


def encode_frame(frame: pd.DataFrame) -> dict:
    """``frame`` as ``{"format": FRAME_FORMAT, "data": base64 of its Arrow IPC stream}``."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return {"format": FRAME_FORMAT, "data": base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")}


def decode_frame(stored: dict) -> pd.DataFrame:
    """The frame ``encode_frame`` stored, or a format-1 frame (``legacy_frame``)."""
    if "format" not in stored:
        return legacy_frame(stored)
    if stored["format"] != FRAME_FORMAT:
        raise ValueError(f"frame format {stored['format']!r} is not {FRAME_FORMAT}")
    with pa.ipc.open_stream(base64.b64decode(stored["data"], validate=True)) as reader:
        return reader.read_all().to_pandas()


def legacy_frame(d: dict) -> pd.DataFrame:
    """A frame of format 1 (module docstring), with its numeric and boolean dtypes back;
    text columns as ``object``, as that format read them."""
    columns = {}
    for i, (column, dtype) in enumerate(zip(d["columns"], d["dtypes"])):
        values = [row[i] for row in d["data"]]
        if dtype == "float64":
            columns[column] = pd.array([np.nan if v is None else v for v in values], dtype="float64")
        elif dtype in ("Int64", "int64"):
            kind = "int64" if dtype == "int64" and None not in values else "Int64"
            columns[column] = pd.array(values, dtype=kind)
        elif dtype == "bool":
            columns[column] = pd.array(values, dtype="bool")
        else:
            columns[column] = pd.array(values, dtype=object)
    return pd.DataFrame(columns, columns=d["columns"])


def json_default(value):
    """JSON for the numpy scalars and times a report's other fields may hold (NaN as null)."""
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, (datetime, pd.Timestamp)):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
