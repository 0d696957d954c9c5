"""The `ambient-operator` command line."""
