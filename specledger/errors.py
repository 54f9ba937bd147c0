"""User-facing errors.

Anything the user can fix (bad option, missing model, malformed file) is raised as
:class:`SpecLedgerError` with a one-line message that names the fix. The CLI prints it as
``error: <message>`` and exits with status 2, never with a traceback. What does not stop a verb is
warned with :class:`SpecLedgerWarning` (``warnings.warn``), printed as ``warning: <message>``.
"""

from __future__ import annotations


class SpecLedgerError(Exception):
    """An error the user can fix; its message is one line that says how."""

    exit_code = 2


class SpecLedgerWarning(UserWarning):
    """Something the user should know that does not stop the verb (a skipped trace line, a removed
    torn record); the CLI prints each as one ``warning: <message>`` line on stderr."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`SpecLedgerError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise SpecLedgerError(message)
