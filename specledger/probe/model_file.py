"""The model file a launched llama.cpp engine loads: m_KV (bytes of K and V per token) and the weights' size from
its GGUF metadata, and this machine's memory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from specledger.errors import SpecLedgerError
from specledger.probe.engine_command import flag_value

#: bytes per KV element of llama.cpp's --cache-type-k / -v (block types: bytes per block / block size)
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
                 "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}


def model_path(argv: Sequence[str]) -> Path | None:
    """The GGUF a llama.cpp command loads (``-m`` / ``--model``), if it names an existing ``.gguf``."""
    value = flag_value(argv, ("-m", "--model"))
    path = Path(value).expanduser() if value else None
    return path if path is not None and path.suffix == ".gguf" and path.is_file() else None


class _KvKeys(TypedDict):
    """The keys every :class:`GgufKvFacts` has."""

    kv_model_file: str
    kv_layers: int  # block_count
    kv_heads: int  # head_count_kv
    kv_head_dims: list[int]  # [key_length, value_length]
    kv_cache_types: list[str]  # [-ctk, -ctv], f16 by default
    weight_bytes: int  # the GGUF file's size


class GgufKvFacts(_KvKeys, total=False):
    """:func:`gguf_kv_facts`, merged into a launch's run.json."""

    kv_bytes_per_token: int  # m_KV; absent for a cache type not in KV_TYPE_BYTES


def gguf_kv_facts(path: Path, argv: Sequence[str] = ()) -> GgufKvFacts:
    """m_KV from a GGUF's metadata: ``kv_bytes_per_token = block_count · head_count_kv · (key_length +
    value_length) · bytes per element`` (key/value length default ``embedding_length / head_count``; bytes
    per element from ``-ctk`` / ``-ctv`` in ``argv``, f16 by default, :data:`KV_TYPE_BYTES`), and the file's
    size as ``weight_bytes``. A file the ``gguf`` library cannot read is a one-line error."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
        values = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
        arch = str(values["general.architecture"])
        layers = int(values[f"{arch}.block_count"])
        heads = int(values[f"{arch}.attention.head_count"])
        kv_heads = int(values.get(f"{arch}.attention.head_count_kv", heads))
        head_dim = int(values[f"{arch}.embedding_length"]) // heads
        k_len = int(values.get(f"{arch}.attention.key_length", head_dim))
        v_len = int(values.get(f"{arch}.attention.value_length", head_dim))
    except Exception as exc:  # the reader raises KeyError, ValueError, struct errors ... on a bad file
        raise SpecLedgerError(f"cannot read the GGUF metadata of {path} ({type(exc).__name__}: {exc})") from None
    k_type = flag_value(argv, ("-ctk", "--cache-type-k")) or "f16"
    v_type = flag_value(argv, ("-ctv", "--cache-type-v")) or "f16"
    k_bytes, v_bytes = KV_TYPE_BYTES.get(k_type.lower()), KV_TYPE_BYTES.get(v_type.lower())
    facts: GgufKvFacts = {"kv_model_file": str(path), "kv_layers": layers, "kv_heads": kv_heads,
                          "kv_head_dims": [k_len, v_len], "kv_cache_types": [k_type, v_type],
                          "weight_bytes": path.stat().st_size}
    if k_bytes is not None and v_bytes is not None:
        facts["kv_bytes_per_token"] = int(round(layers * kv_heads * (k_len * k_bytes + v_len * v_bytes)))
    return facts


def machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
