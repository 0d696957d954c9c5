"""Rewrite the reason tables of docs/troubleshooting.md from the operator's vocabulary.

.venv/bin/python hack/gen_troubleshooting.py          # rewrite the tables
.venv/bin/python hack/gen_troubleshooting.py --check  # exit 1 when they would change

Every condition type and reason, node reason, Event reason and webhook
reason is a member of a StrEnum in operator/ambient_operator/api/conditions.py,
and its tables (TROUBLESHOOTING_TABLES) say what each one means and what to
do. Each table of the page sits between two marker comments,

    <!-- generated: reasons NAME, ... -->
    <!-- end generated: reasons NAME -->

where NAME is the table's name; the rest of the page is written by hand.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from ambient_operator.api.conditions import TROUBLESHOOTING_TABLES, Table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"
SOURCE = "operator/ambient_operator/api/conditions.py"
_BLOCK = re.compile(
    r"(?P<begin><!-- generated: reasons (?P<name>[a-z0-9-]+)\b[^\n]*-->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- end generated: reasons (?P=name) -->)",
    re.S,
)


def begin_marker(name: str) -> str:
    """The comment that opens a generated table (what to paste into the page for a new one)."""
    return f"<!-- generated: reasons {name}, from {SOURCE} by `make docs`; edit it there -->"


def rewrite(text: str, tables: Sequence[Table] = TROUBLESHOOTING_TABLES) -> str:
    """The page with every generated table rewritten; the hand-written rest is kept.

    Raises ValueError when a table has no markers on the page, or twice, or
    the page has markers of a table that does not exist.
    """
    by_name = {table.name: table for table in tables}
    seen: list[str] = []

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in by_name:
            raise ValueError(f"the page has markers for unknown table {name!r}")
        seen.append(name)
        # Blank lines around the table: a marker right below it would read as a row.
        return f"{begin_marker(name)}\n\n{by_name[name].markdown()}\n\n{match['end']}"

    out = _BLOCK.sub(fill, text)
    missing = [name for name in by_name if name not in seen]
    twice = sorted({name for name in seen if seen.count(name) > 1})
    if missing or twice:
        raise ValueError(f"tables without markers: {missing}; tables marked twice: {twice}")
    return out


def main() -> int:
    """Write or check the page."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the page would change")
    args = parser.parse_args()
    text = PAGE.read_text(encoding="utf-8")
    new = rewrite(text)
    if args.check:
        if new != text:
            print(f"{PAGE} is stale; run hack/gen_troubleshooting.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
