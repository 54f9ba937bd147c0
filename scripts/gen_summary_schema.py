"""Write ``specledger/schemas/summary.schema.json`` from the summary's types
(:func:`specledger.report.summary_model.summary_schema`): the file is generated, never edited by hand.

    .venv/bin/python scripts/gen_summary_schema.py          # write it
    .venv/bin/python scripts/gen_summary_schema.py --check  # exit 1 when the file differs from the types
"""

from __future__ import annotations

import sys

from specledger.provenance import PACKAGE_DIR
from specledger.report.summary_model import summary_schema_text

SCHEMA_FILE = PACKAGE_DIR / "schemas" / "summary.schema.json"


def main(argv: list[str]) -> int:
    text = summary_schema_text()
    if "--check" in argv:
        same = SCHEMA_FILE.is_file() and SCHEMA_FILE.read_text(encoding="utf-8") == text
        print(f"{SCHEMA_FILE}: {'up to date' if same else 'differs from the types: run scripts/gen_summary_schema.py'}")
        return 0 if same else 1
    SCHEMA_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
