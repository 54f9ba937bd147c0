"""``python -m specledger.cli``: the same as the ``specledger`` command."""

from specledger.cli import main

main()
