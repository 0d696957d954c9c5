"""`python -m ambient_operator.cli`: the same as the `ambient-operator` command."""

from ambient_operator.cli.main import main

raise SystemExit(main())
