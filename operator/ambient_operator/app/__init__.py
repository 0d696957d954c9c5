"""Wiring: the operator process, which builds the layers below and hands each what it needs."""
