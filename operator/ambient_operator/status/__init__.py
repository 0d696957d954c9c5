"""Conditions, status and Events: pure verdicts and the one status writer."""
