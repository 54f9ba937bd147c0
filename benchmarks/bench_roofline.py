"""The roofline and its overhead terms against a measured GPU verify-cost surface (issue 18, item 4).

For each point of the H200 files in ``shared/gpu/`` (Hugging Face transformers eager + SDPA, bf16; one
forward of ``q`` new tokens for each of ``batch`` sequences holding ``ctx`` tokens; see the README there)
it prints the measured median ms, the pure roofline's ms ("bound"), the default model's ("graphs": the
bound + a CUDA-graph engine's overheads) and the eager preset's ("eager": the bound + PyTorch eager's
overheads, the engine that was measured), their ratio T(q)/T(1) beside the measured one, and whether
the model stays at or below the measurement ("model <= measured": the roofline is a lower bound).

The presets' defaults come from cited public figures (``specledger.cost.roofline.OVERHEADS``), not
from these files: this is a check, not a fit. Pure arithmetic; runs in a second.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_roofline.py [--data DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specledger.cost.roofline import model_config_from_dict, roofline

LLAMA_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
SMOLLM2_135M = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "intermediate_size": 1536, "vocab_size": 49152, "torch_dtype": "bfloat16", "tie_word_embeddings": True}
FILES = {"h200-hf-eager-llama3-8b.jsonl": ("Llama-3.1-8B", LLAMA_8B),
         "h200-hf-eager-smollm2-135m.jsonl": ("SmolLM2-135M", SMOLLM2_135M)}
TERMS = ("bound", "graphs", "eager")


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def model_ms(points: list[dict], cfg: dict, terms: str) -> list[float]:
    """The model's ms of each point: one step of batch x q rows for batch requests at context ctx."""
    cost = roofline("h200", model_config_from_dict(cfg), terms=terms)
    return [cost.step_s(p["batch"] * p["q"], p["batch"], float(p["ctx"])) * 1e3 for p in points]


def report(path: Path, name: str, cfg: dict) -> dict[str, int]:
    pts = load(path)
    ms = {t: model_ms(pts, cfg, t) for t in TERMS}
    base = {(p["batch"], p["ctx"]): i for i, p in enumerate(pts) if p["q"] == 1}
    print(f"\n{name} ({path.name}) -- ms, and T(q)/T(1) in brackets; x = model / measured")
    print(f"{'batch':>5} {'ctx':>5} {'q':>3} | {'measured':>15} | " + " | ".join(f"{t:>22}" for t in TERMS)
          + " | model <= measured")
    over = dict.fromkeys(TERMS, 0)
    for i, p in enumerate(pts):
        j = base[(p["batch"], p["ctx"])]
        cells = [f"{p['ms']:7.2f} [{p['ms'] / pts[j]['ms']:4.2f}]"]
        bad = []
        for t in TERMS:
            m = ms[t][i]
            cells.append(f"{m:7.2f} [{m / ms[t][j]:4.2f}] x{m / p['ms']:4.2f}")
            if m > p["ms"]:
                over[t] += 1
                bad.append(t)
        print(f"{p['batch']:>5} {p['ctx']:>5} {p['q']:>3} | " + " | ".join(f"{c:>15}" if k == 0 else f"{c:>22}"
                                                                            for k, c in enumerate(cells))
              + " | " + ("violated: " + ",".join(bad) if bad else "yes"))
    print("points where the model exceeds the measurement: "
          + ", ".join(f"{t} {over[t]}/{len(pts)}" for t in TERMS))
    verify = [(i, base[(p["batch"], p["ctx"])]) for i, p in enumerate(pts) if p["q"] > 1]
    for t in TERMS:  # how far the model's verify premium T(q)/T(1) is from the measured one
        r = sorted((ms[t][i] / ms[t][j]) / (pts[i]["ms"] / pts[j]["ms"]) for i, j in verify)
        print(f"  {t:>6}: model ratio / measured ratio over the q > 1 points: min {r[0]:.2f}, "
              f"median {r[len(r) // 2]:.2f}, max {r[-1]:.2f}")
    return over


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "shared" / "gpu",
                    help="folder holding the H200 jsonl files (default: shared/gpu beside the repository)")
    args = ap.parse_args()
    data = args.data if args.data.is_dir() else Path("/work/shared/gpu")
    for fname, (name, cfg) in FILES.items():
        report(data / fname, name, cfg)


if __name__ == "__main__":
    main()
