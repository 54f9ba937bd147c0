"""The drafter catalog (:mod:`specledger.engine.drafters.catalog`): one descriptor per drafter, the one home of
its name, whether it runs a network, its memory rank and its serving engines' methods -- and its readers."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import char_engine, tiny_model

from specledger.engine.drafters import catalog
from specledger.engine.drafters.catalog import CATALOG, PLAIN
from specledger.engine.drafters.registry import DRAFTERS, make_drafter
from specledger.errors import SpecLedgerError

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "specledger"
DRAFTERS_DIR = PKG / "engine" / "drafters"
#: the issue's bound: a drafter's name is a string literal in at most this many files outside engine/drafters/
MAX_FILES_WITH_NAME = 4
#: names that are ordinary words too ("model" a JSON key, "head" a tensor, "none" an option value): only their
#: uses as a drafter count (:func:`_drafter_uses`)
AMBIGUOUS = frozenset({"none", "model", "head"})


@pytest.fixture(scope="module")
def engine():
    return char_engine(tiny_model(3, vocab=64, n_layers=3))


def test_the_catalog_names_every_drafter_once_plain_first():
    assert DRAFTERS == catalog.names() == tuple(spec.name for spec in CATALOG)
    assert len(set(DRAFTERS)) == len(DRAFTERS) and DRAFTERS[0] == PLAIN.name == "none"
    assert catalog.drafter_names() == DRAFTERS[1:]
    assert all(catalog.by_name(spec.name) is spec for spec in CATALOG)
    assert catalog.model_free_names() == ("ngram", "suffix")


def test_an_unknown_name_is_a_one_line_error_listing_the_choices():
    with pytest.raises(SpecLedgerError, match=r"^unknown drafter 'eagle'; choose one of: none, ngram, suffix, "
                                              r"layerskip, quant-self, model, head$"):
        catalog.by_name("eagle")
    with pytest.raises(SpecLedgerError, match="unknown drafter 'eagle'"):
        make_drafter("eagle", None)
    with pytest.raises(SpecLedgerError, match=r"^unknown drafter 'none' in --x; choose from ngram, suffix,"):
        catalog.check_drafter("none", " in --x")
    assert catalog.find("eagle") is None and catalog.find(None) is None


def test_every_drafter_class_points_at_its_catalog_entry():
    for spec in CATALOG:
        cls = spec.drafter_class()
        assert cls.spec is spec, spec.name
        assert cls.uses_model is spec.needs_network, spec.name


def test_memory_ranks_are_unique_and_give_the_verdicts_tie_order():
    from specledger.gates.verdict_rules import DRAFTER_MEMORY_RANK

    ranks = [spec.memory_rank for spec in CATALOG if not spec.is_plain]
    assert None not in ranks and len(set(ranks)) == len(ranks)
    assert PLAIN.memory_rank is None and PLAIN.is_plain
    assert DRAFTER_MEMORY_RANK == {"ngram": 0, "suffix": 1, "layerskip": 2, "head": 3, "quant-self": 4, "model": 5}
    assert list(DRAFTER_MEMORY_RANK) == sorted(DRAFTER_MEMORY_RANK, key=DRAFTER_MEMORY_RANK.get)


@pytest.mark.parametrize("name", ["none", "ngram", "suffix"])
def test_the_drafters_that_need_nothing_build_without_an_engine(name):
    drafter = make_drafter(name, None)
    assert drafter.spec is catalog.by_name(name) and drafter.name == name


def test_the_network_drafters_build_on_a_tiny_target(engine):
    chosen = make_drafter("layerskip", engine, layers="2")
    assert chosen.name == "layerskip" and chosen.layers == [0, 1] and chosen.spec is catalog.LAYERSKIP
    calibrated = make_drafter("layerskip", engine, calibration_tokens=list(range(40)))
    assert calibrated.layers and len(calibrated.layers) < engine.model.config.n_layers
    quant = make_drafter("quant-self", engine)
    assert quant.name == "quant-self" and quant.uses_model and quant.spec is catalog.QUANT_SELF


def test_the_drafters_that_need_a_file_say_which(engine, tmp_path):
    with pytest.raises(SpecLedgerError, match=r"^the 'model' drafter needs --draft PATH"):
        make_drafter("model", engine)
    with pytest.raises(SpecLedgerError):  # no head file for a random target: the error names train-head
        make_drafter("head", engine, draft_path=str(tmp_path / "missing.safetensors"))


def test_every_serving_method_is_one_its_engine_accepts():
    from specledger.gates.engine_validators import (
        LLAMA_CPP_SPEC_TYPES,
        SGLANG_ALGORITHMS,
        TRT_DECODING_TYPES,
        VLLM_METHODS,
    )

    accepted = {"vllm": VLLM_METHODS, "sglang": SGLANG_ALGORITHMS, "llama_cpp": LLAMA_CPP_SPEC_TYPES,
                "trtllm": TRT_DECODING_TYPES}
    for spec in CATALOG:
        for engine_key, names in accepted.items():
            way = spec.serving.of(engine_key)
            assert not (way.method and way.lacking), (spec.name, engine_key)
            for method in (way.method, way.eagle3_method):
                assert method is None or method in names, (spec.name, engine_key, method)
    assert catalog.SUFFIX.serving.vllm.method == "suffix" and catalog.SUFFIX.serving.sglang.lacking
    assert catalog.HEAD.serving.sglang.name_for(eagle3=True) == "EAGLE3"
    assert catalog.HEAD.serving.sglang.name_for(eagle3=False) == "EAGLE"


def test_the_catalog_imports_without_torch():
    block = ("import sys\n"
             "class _NoEngine:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] in ('torch', 'transformers'):\n"
             "            raise ModuleNotFoundError(f'No module named {name!r} (blocked here)', name=name)\n"
             "sys.meta_path.insert(0, _NoEngine())\n"
             "from specledger.engine.drafters import catalog\n"
             "from specledger.engine.drafters.registry import DRAFTERS\n"
             "print(','.join(DRAFTERS), catalog.HEAD.serving.vllm.method, 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [",".join(DRAFTERS), "eagle", "False"]


# ------------------------------------------------------------------------------- the names' one home
def _sources() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for p in PKG.rglob("*.py") if DRAFTERS_DIR not in p.parents}


def _quoted(name: str) -> re.Pattern[str]:
    return re.compile(rf"""(["']){re.escape(name)}\1""")


def _mentions_drafter(node: ast.AST) -> bool:
    return "drafter" in ast.unparse(node).lower()


def _holds_drafter(node: ast.AST) -> bool:
    """A name, attribute or item that holds a drafter (``r.drafter``, ``p["drafter"]``), not a call about them."""
    return isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) and _mentions_drafter(node)


def _drafter_uses(tree: ast.Module, name: str) -> int:
    """How many string constants ``name`` in ``tree`` mean a drafter: compared with (``==``, ``in``) an expression
    naming a drafter, the fallback of one (``r.drafter or "none"``), assigned to or passed as a name holding one
    (``drafter=``, ``PLAIN_DRAFTER =``, a parameter ``drafter``'s default), or in a collection beside another
    drafter's name."""
    others = set(DRAFTERS) - {name}
    uses: set[int] = set()  # ids of the constants found (a constant may sit in two of the forms)
    for node in ast.walk(tree):
        parts: list[ast.AST] = []
        if isinstance(node, ast.Compare) and any(_mentions_drafter(x) for x in [node.left, *node.comparators]):
            parts = [node.left, *node.comparators]
        elif isinstance(node, ast.BoolOp) and any(_holds_drafter(x) for x in node.values):
            parts = list(node.values)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            parts = [node.value] if any(_mentions_drafter(t) for t in targets) else []
        elif isinstance(node, ast.keyword) and node.arg and "drafter" in node.arg:
            parts = [node.value]
        elif isinstance(node, ast.arguments):
            args = [*node.posonlyargs, *node.args]
            parts = [d for a, d in zip(args[len(args) - len(node.defaults):], node.defaults) if "drafter" in a.arg]
            parts += [d for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None and "drafter" in a.arg]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            parts = list(node.elts) if values & others else []
        uses.update(id(c) for p in parts for c in ast.walk(p) if isinstance(c, ast.Constant) and c.value == name)
    return len(uses)


def files_naming(name: str) -> list[str]:
    """The files outside engine/drafters/ that spell drafter ``name`` as a string literal: every quoted occurrence
    (docstrings too), or for :data:`AMBIGUOUS` names the literals :func:`_drafter_uses` finds."""
    found = []
    for path, text in _sources().items():
        hit = _drafter_uses(ast.parse(text), name) if name in AMBIGUOUS else _quoted(name).search(text)
        if hit:
            found.append(str(path.relative_to(ROOT)))
    return sorted(found)


@pytest.mark.parametrize("name", DRAFTERS)
def test_each_drafter_name_is_spelled_in_few_files_outside_the_drafters(name):
    files = files_naming(name)
    assert len(files) <= MAX_FILES_WITH_NAME, f"{name!r} is a literal in {files}: use catalog.{name.upper()}.name"


def test_the_drafter_use_finder_tells_a_drafter_from_a_word():
    tree = ast.parse('if r.drafter == "none": pass\nx = {"model": 1}\nDRAFTERS = ("model", "ngram")\n'
                     'def f(drafter="head"): pass\ny = getattr(m, "head")\nz = (r.drafter or "none")\n'
                     'known = ", ".join(m.drafters()) or "none"\n')
    assert [_drafter_uses(tree, n) for n in ("none", "model", "head")] == [2, 1, 1]
