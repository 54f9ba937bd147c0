"""Cached readers for the data files (parsing gz/JSON is the slow part of loading)."""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path

from specledger.errors import SpecLedgerError


def _parse_json_lines(lines: list[str], path: Path) -> tuple[dict, ...]:
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise SpecLedgerError(
                f"{path} line {number} is not valid JSON ({error.msg}): reinstall the data package"
            ) from error
    return tuple(records)


@lru_cache(maxsize=32)
def read_json_lines(path: Path) -> tuple[dict, ...]:
    """Records of a JSON-lines file (``.gz`` transparently decompressed); blank lines skipped.

    Callers must treat the returned dicts as read-only: they are shared by the cache.
    """
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    else:
        lines = path.read_text(encoding="utf-8").splitlines()
    return _parse_json_lines(lines, path)


@lru_cache(maxsize=256)
def read_json(path: Path) -> dict:
    """A whole JSON document (read-only: shared by the cache)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise SpecLedgerError(
            f"{path} is not valid JSON ({error.msg}): reinstall the data package"
        ) from error
