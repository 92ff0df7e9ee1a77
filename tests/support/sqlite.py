"""SQLite test databases: the URL of a database file in a test's temporary directory."""

from pathlib import Path


def sqlite_url(tmp_path: Path, name: str = "lab.db") -> str:
    return f"sqlite:///{tmp_path / name}"
