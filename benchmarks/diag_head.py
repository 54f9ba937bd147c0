"""Issue 20 diagnostic: the head's training-path prediction vs what its drafter proposes, on held-out dialogue.

    flock /tmp/specledger-bench.lock nice -n 19 python benchmarks/diag_head.py [N_PROMPTS] [MAX_TOKENS]

For each prompt: the target's greedy continuation; (a) the teacher-forced training-path prediction of
the bundled head at every answer position (``fc([embed(c_j); f_{j-1}])`` over the whole sequence, as
``head_train`` computes it) and its top-1 agreement with the target; (b) every chain round's proposal
(gamma 4) and whether its first token equals (a) for the same context. If (b) departs from (a), the
bug is between training and drafting; if they agree and (a) is low, the head itself is weak.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

DATA = Path(__file__).parent / "data" / "dialogue_heldout.jsonl"


def main() -> None:
    from specledger.engine.decode import Engine
    from specledger.engine.drafters.registry import make_drafter
    from specledger.engine.loader import load_model

    n_prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    torch.set_num_threads(1)
    lm = load_model()
    eng = Engine.from_loaded(lm)
    head = make_drafter("head", eng)
    model, net, vids = lm.model, head.net, head.vocab_ids
    print(f"head {head.head.path.name}: training val_top1 {head.head.figures.get('val_top1')}, "
          f"val_top1_answer {head.head.figures.get('val_top1_answer')}")
    items = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    log: list[tuple[int, list[int]]] = []
    original = head.propose

    def spy(context, gamma, params, rng):
        proposal = original(context, gamma, params, rng)
        log.append((len(context), list(proposal.tokens)))
        return proposal

    head.propose = spy
    tf_ok = tf_n = same = rounds = first_ok = 0
    for it in items[:n_prompts]:
        prompt = lm.encode_prompt(messages=it["messages"])
        plain = eng.generate(prompt, max_tokens=max_tokens)
        seq, p = list(prompt) + list(plain.token_ids), len(prompt)
        with torch.inference_mode():
            logits, hidden = model(torch.tensor([seq]), 0, model.new_cache(len(seq)), return_hidden=True)
            labels = logits[0].argmax(-1)
            prev = torch.cat((torch.zeros_like(hidden[:, :1]), hidden[:, :-1]), dim=1)
            kv = torch.zeros(2, 1, net.hc.n_kv_heads, len(seq), net.hc.head_dim)
            pred = head.lm_head(net(model.embed(torch.tensor([seq])), prev, kv, 0)[0]).float().argmax(-1)
            tf = pred if vids is None else vids[pred]
        ok = [int(tf[j]) == int(labels[j]) for j in range(p - 1, len(seq) - 1)]
        tf_ok, tf_n = tf_ok + sum(ok), tf_n + len(ok)
        log.clear()
        spec = eng.generate(prompt, drafter=head, gamma=4, max_tokens=max_tokens)
        assert spec.token_ids == plain.token_ids
        for n, toks in log:
            if toks:
                rounds += 1
                same += int(toks[0] == int(tf[n - 1]))
                first_ok += int(n < len(seq) and toks[0] == seq[n])
        print(f"{it['id']}: teacher-forced top-1 on the answer {sum(ok)}/{len(ok)}")
        print("  target :", [lm.tokenizer.decode([t]) for t in seq[p : p + 10]])
        print("  tf head:", [lm.tokenizer.decode([int(t)]) for t in tf[p - 1 : p + 9]])
    print(f"teacher-forced top-1 (answers) {tf_ok}/{tf_n} = {tf_ok / max(1, tf_n):.3f}; "
          f"drafter first token == training path {same}/{rounds}; first token accepted {first_ok}/{rounds}")


if __name__ == "__main__":
    main()
