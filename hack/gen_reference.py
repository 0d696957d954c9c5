"""Write docs/ambientmesh-reference.md from the AmbientMesh models.

.venv/bin/python hack/gen_reference.py          # rewrite the page
.venv/bin/python hack/gen_reference.py --check  # exit 1 when it would change

The page is the models' reference (ambient_operator.api.reference), whose
`kubectl get ambientmesh` line lists the CRD's printer columns as generated,
after NAME, as kubectl prints them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ambient_operator.api import crdgen
from ambient_operator.api.reference import reference_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "ambientmesh-reference.md"
# The comment of the first `kubectl get ambientmesh` line of the page.
_COLUMNS = re.compile(r"^(kubectl get ambientmesh +# ).*$", re.M)


def columns() -> list[str]:
    """The headings kubectl prints after NAME: the CRD's additionalPrinterColumns."""
    version = crdgen.ambientmesh_crd()["spec"]["versions"][0]
    return [str(col["name"]).upper() for col in version["additionalPrinterColumns"]]


def page() -> str:
    """The whole page, its column list taken from the CRD."""
    text, found = _COLUMNS.subn(
        lambda m: m[1] + ", ".join(columns()), reference_markdown(), count=1
    )
    if not found:
        raise ValueError("the reference has no `kubectl get ambientmesh  # COLUMNS` line")
    return text


def main() -> int:
    """Write or check the reference page."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the page would change")
    args = parser.parse_args()
    text = page()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is stale; run hack/gen_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
