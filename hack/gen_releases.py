"""Write the releases table of docs/versions.md from operator/ambient_operator/api/releases.py.

    .venv/bin/python hack/gen_releases.py [--check]

tests/test_default_version.py fails when the page's table is not the data's.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ambient_operator.api.releases import markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "versions.md"
BEGIN = (
    "<!-- generated: releases, from operator/ambient_operator/api/releases.py by `make docs` -->"
)
END = "<!-- end generated: releases -->"
_BLOCK = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)


def main() -> int:
    """Write or check the page."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the page would change")
    args = parser.parse_args()
    text = PAGE.read_text(encoding="utf-8")
    if len(_BLOCK.findall(text)) != 1:
        print(f"{PAGE}: expected one block between {BEGIN!r} and {END!r}", file=sys.stderr)
        return 1
    new = _BLOCK.sub(lambda _: f"{BEGIN}\n\n{markdown()}\n\n{END}", text)
    if args.check:
        return int(new != text)
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
