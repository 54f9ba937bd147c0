"""Proposers, one module each, behind :class:`specledger.engine.drafters.base.Drafter`."""

from specledger.engine.drafters.base import Drafter, NoDrafter, Proposal

__all__ = ["Drafter", "NoDrafter", "Proposal"]
