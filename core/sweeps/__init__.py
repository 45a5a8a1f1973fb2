"""Sweeps (job arrays) on the server side: the document (spec), its search, early stopping, curves, ranking, the
service."""
