"""Write docs/ambientmesh-reference.md from the AmbientMesh models.

.venv/bin/python hack/gen_reference.py          # rewrite the page
.venv/bin/python hack/gen_reference.py --check  # exit 1 when it would change
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ambient_operator.api.reference import reference_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "ambientmesh-reference.md"


def main() -> int:
    """Write or check the reference page."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the page would change")
    args = parser.parse_args()
    text = reference_markdown()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is stale; run hack/gen_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
