"""The native interface is declared once (``specledger_kernels.h``): the ctypes bindings and the layer Structure
must agree with it -- names, argument counts and types, struct fields in order. No compiler needed."""

from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
from pathlib import Path

import pytest

from specledger.engine import kernels
from specledger.engine.native_rows import _EndsF32, _LayerF32

HEADER = Path(kernels.__file__).with_name("specledger_kernels.h")
_C_SOURCES = [Path(kernels.__file__).with_name(name) for name in ("gemv.c", "ops.c", "qgemv.c")]

#: C parameter / return types -> the ctypes type a binding uses for them (any pointer: c_void_p)
_SCALARS = {"int": ctypes.c_int, "float": ctypes.c_float, "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32,
            "size_t": ctypes.c_size_t, "void": None}
_PROTO = re.compile(r"^\s*((?:const\s+)?[A-Za-z_][A-Za-z0-9_]*\s*\**)\s*(specledger_[a-z0-9_]+)\s*\(([^;]*?)\)\s*;",
                    re.M | re.S)


def _ctype(decl: str, *, ret: bool = False):  # noqa: ANN202
    """The ctypes type for one C declaration (a parameter with its name, or a bare return type)."""
    decl = " ".join(decl.split())
    if "*" in decl:
        base = decl.replace("const", "").split("*")[0].strip()
        return ctypes.c_char_p if ret and base == "char" else ctypes.c_void_p
    words = decl.replace("const ", "").split()
    return _SCALARS[words[0]]


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def parse_header() -> dict[str, tuple[object, list[object]]]:
    """name -> (restype, [argtypes]) for every prototype in the header."""
    protos = {}
    for ret, name, params in _PROTO.findall(_strip_comments(HEADER.read_text())):
        params = " ".join(params.split())
        args = [] if params in ("", "void") else [_ctype(p) for p in params.split(",")]
        assert name not in protos, f"{name} declared twice"
        protos[name] = (_ctype(ret, ret=True), args)
    return protos


def parse_struct(name: str = "specledger_layer_f32") -> list[tuple[str, object, int]]:
    """(field, ctypes type, array length or 0) for the fields of the header's struct ``name``, in order."""
    body = re.search(r"typedef struct\s*\{([^{}]*?)\}\s*" + name + r"\s*;", _strip_comments(HEADER.read_text()), re.S)
    assert body, f"{name} not found in the header"
    fields = []
    for decl in filter(None, (d.strip() for d in body.group(1).split(";"))):
        m = re.fullmatch(r"(?:const\s+)?([A-Za-z0-9_]+)\s*(\**)\s*([A-Za-z0-9_]+)\s*(?:\[(\d+)\])?", decl)
        assert m, f"unparsed struct field: {decl!r}"
        ctype = ctypes.c_void_p if m.group(2) else _SCALARS[m.group(1)]
        fields.append((m.group(3), ctype, int(m.group(4) or 0)))
    return fields


def test_header_declares_the_library() -> None:
    protos = parse_header()
    assert len(protos) >= 20
    for name in ("specledger_layers_f32", "specledger_q8_blocks", "specledger_gemv_f32_for", "specledger_qgemv_for"):
        assert name in protos


@pytest.mark.parametrize("name", sorted(kernels.SIGNATURES))
def test_binding_matches_header(name: str) -> None:
    protos = parse_header()
    assert name in protos, f"{name} is bound in kernels/__init__.py but not declared in {HEADER.name}"
    restype, argtypes = kernels.SIGNATURES[name]
    want_ret, want_args = protos[name]
    assert len(argtypes) == len(want_args), f"{name}: {len(argtypes)} ctypes args, header has {len(want_args)}"
    assert list(argtypes) == want_args, f"{name}: argument types differ from the header"
    assert restype is want_ret, f"{name}: restype {restype} vs header {want_ret}"


def test_every_exported_function_is_declared_once_in_the_header() -> None:
    """Each .c file includes the header; no exported function is defined without a declaration there, and no
    .c file re-declares a prototype by hand."""
    protos = parse_header()
    define = re.compile(r"^(?:const\s+)?[a-z_][a-z0-9_]*\s*\**\s*(specledger_[a-z0-9_]+)\s*\(([^;{]*)\)\s*([;{])",
                        re.M | re.S)
    for src in _C_SOURCES:
        text = _strip_comments(src.read_text())
        assert '#include "specledger_kernels.h"' in text, src.name
        assert "typedef struct {\n    const float *wqkv" not in text, f"{src.name} re-declares the layer struct"
        for name, _params, end in define.findall(text):
            assert end == "{", f"{src.name} declares {name} by hand (declare it in {HEADER.name})"
            assert name in protos, f"{src.name} exports {name}, missing from {HEADER.name}"


def test_abi_matches_header() -> None:
    m = re.search(r"#define\s+SPECLEDGER_ABI\s+(\d+)", HEADER.read_text())
    assert m and int(m.group(1)) == kernels._ABI


@pytest.mark.parametrize(("name", "structure"),
                         [("specledger_layer_f32", _LayerF32), ("specledger_ends_f32", _EndsF32)])
def test_structs_match_header(name: str, structure: type) -> None:
    fields = parse_struct(name)
    ours = structure._fields_
    assert [f[0] for f in ours] == [f[0] for f in fields]
    for (name, ctype), (_, want, length) in zip(ours, fields, strict=True):
        if length:
            assert issubclass(ctype, ctypes.Array) and ctype._length_ == length, name
            assert ctype._type_ is want, name
        else:
            assert ctype is want, name


def test_describe() -> None:
    info = kernels.describe()
    assert set(info) == {"native", "path", "status"}
    assert info["status"] == kernels.status()
    assert info["native"] is (kernels.lib() is not None)
    assert info["path"] in (("avx512-vnni", "avx2", "portable") if info["native"] else ("none",))


def test_run_json_records_whether_the_kernels_or_the_fallback_ran(monkeypatch):
    from specledger.engine import kernels
    from specledger.engine.device import machine_info

    got = machine_info()["kernels"]
    assert got == kernels.describe() and set(got) == {"native", "path", "status"}
    monkeypatch.setattr(kernels, "lib", lambda: None)
    assert kernels.describe()["native"] is False and kernels.describe()["path"] == "none"


@pytest.mark.skipif(platform.system() != "Linux" or os.environ.get("SPECLEDGER_NATIVE") == "0"
                    or not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")),
                    reason="no C compiler, not Linux, or the kernels switched off")
def test_the_kernels_build_wherever_a_compiler_is() -> None:
    """A compile error must fail the suite, not quietly skip every kernel test (they skip when the library is off)."""
    assert kernels.lib() is not None, kernels.status()
