"""Generic machinery the controllers run on: the reconcile loop's pacing, leader election."""
