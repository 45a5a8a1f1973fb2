"""Trace replay in simulated time through the very same ``plan()`` as the live loop."""
