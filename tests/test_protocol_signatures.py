"""The engine protocol (``engine/protocol.py``) and the engine (``engine/decode.py``) agree: every method the
protocol declares has the engine's parameters (names, kinds, defaults), so a caller typed against the protocol can
pass whatever the engine takes."""

from __future__ import annotations

import inspect

import pytest

from specledger.engine.decode import Engine
from specledger.engine.protocol import StreamArgs, TargetEngine

PROTOCOL_METHODS = sorted(name for name, member in vars(TargetEngine).items()
                          if inspect.isfunction(member) and not name.startswith("_"))


def _shape(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(inspect.unwrap(fn)).parameters.values()]


def test_the_protocol_declares_the_engine_verbs():
    assert {"stream", "prefill", "generate", "sibling", "check_prompt", "decode_text"} <= set(PROTOCOL_METHODS)


@pytest.mark.parametrize("name", PROTOCOL_METHODS)
def test_protocol_method_matches_the_engine(name):
    assert _shape(getattr(TargetEngine, name)) == _shape(getattr(Engine, name))


def test_stream_args_name_the_stream_keywords():
    keywords = [p.name for p in inspect.signature(inspect.unwrap(Engine.stream)).parameters.values()][2:]
    assert list(StreamArgs.__annotations__) == keywords
