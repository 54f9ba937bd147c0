"""The analysis side without torch: ``ledger``, ``analysis``, ``gates``, ``cost``, ``simulate``, ``report`` and
``probe`` (with the ``inspect`` and ``import`` commands) import, every module, in a process where torch and
transformers cannot be imported -- and a run folder's report builds there. ``pip install specledger`` reads run
folders, probes endpoints, imports benchmark results, simulates and reports; the ``engine`` extra brings torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"

TORCH_FREE = ("ledger", "analysis", "gates", "cost", "simulate", "report", "probe")

#: a finder that refuses torch and transformers, as a machine without the ``engine`` extra would
BLOCK = textwrap.dedent("""
    import sys
    class _NoEngine:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked here)", name=name)
    sys.meta_path.insert(0, _NoEngine())
""")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_the_blocker_blocks_torch():
    proc = _run("import torch")
    assert proc.returncode != 0 and "blocked here" in proc.stderr


def test_every_module_of_the_analysis_side_imports_without_torch():
    proc = _run(f"""
        import importlib, pkgutil
        failed = []
        names = []
        for pkg in {TORCH_FREE!r}:
            mod = importlib.import_module("specledger." + pkg)
            names.append(mod.__name__)
            names += [m.name for m in pkgutil.walk_packages(mod.__path__, mod.__name__ + ".")]
        names.append("specledger.cli.probe")  # the probe, inspect and import commands
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:
                failed.append(f"{{name}}: {{exc!r}}")
        print(len(names), "modules")
        print("\\n".join(failed))
        raise SystemExit(1 if failed else 0)
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert int(proc.stdout.split()[0]) > 80


def test_a_run_folders_report_builds_without_torch(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    records = json.loads((DATA / "golden_run_traces.json").read_text())
    (run_dir / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    meta = json.loads((DATA / "golden_run_summary.json").read_text())["meta"]
    (run_dir / "run.json").write_text(json.dumps(meta))
    proc = _run(f"""
        from specledger.report.build import build_report
        summary, html = build_report({str(run_dir)!r}, n_resamples=20)
        print(len(summary["scenarios"]), html)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    n, html = proc.stdout.split()
    assert int(n) > 0 and Path(html).is_file()


def test_the_cli_reads_without_torch_and_names_the_extra_for_the_engine(tmp_path):
    proc = _run("""
        from specledger.cli import main
        main(["ledger", "--acceptance", "0.7", "--gamma", "1,2,4", "--base-ms", "10", "--round-ms", "10+1*k"])
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _run("""
        from specledger.cli import main
        main(["generate", "--prompt", "hi"])
    """)
    assert proc.returncode != 0
    assert "specledger[engine]" in proc.stderr and "Traceback" not in proc.stderr


def test_the_engine_is_an_extra_and_the_setup_installs_it():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    assert "torch" not in base and "transformers" not in base
    assert any(d.startswith("torch==") for d in project["optional-dependencies"]["engine"])
    assert '-e ".[engine' in (ROOT / "scripts" / "setup.sh").read_text()
