"""User JSONL: a built-in category without a usable reference loads, with a warning, quality not assessed."""

from __future__ import annotations

import json

from specledger.quality import metric_name, score
from specledger.workloads.jsonl import NOT_ASSESSED, load_jsonl


def test_builtin_category_without_reference_loads_not_assessed(tmp_path):
    path = tmp_path / "mine.jsonl"
    lines = [
        {"id": "a", "category": "code-edit", "prompt": "fix this function"},
        {"id": "b", "category": "math", "prompt": "2+2?", "reference": "4"},
        {"id": "c", "category": "summary", "prompt": "summarise", "reference": {"not": "text"}},
        {"id": "d", "category": "team-x", "prompt": "hello"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    items, warnings = load_jsonl(path)
    assert [it.id for it in items] == ["a", "b", "c", "d"]
    by_id = {it.id: it for it in items}
    assert by_id["a"].meta["quality"] == NOT_ASSESSED and by_id["c"].meta["quality"] == NOT_ASSESSED
    assert "quality" not in by_id["b"].meta and "quality" not in by_id["d"].meta
    assert len(warnings) == 2
    assert "line 1" in warnings[0] and "code-edit" in warnings[0] and NOT_ASSESSED in warnings[0]
    assert "line 3" in warnings[1]
    # scoring never stops the run: the item is simply not assessed
    assert score(by_id["a"], "def f(): pass") is None and metric_name(by_id["a"]) is None
    assert score(by_id["b"], "The answer is 4") == 1.0
