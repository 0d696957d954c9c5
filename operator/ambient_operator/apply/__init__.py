"""The one writer: plan what to write, check ownership, write and prune."""
