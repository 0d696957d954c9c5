"""Istio ambient data plane for clusters that mix Linux and Windows nodes."""
