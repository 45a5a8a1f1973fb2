"""The pure scheduling policy: ``plan(snapshot, config) -> Decisions`` and its parts (quota, fair share, placement,
preemption, pending reasons). No database, clock or randomness: the live loop and the simulator call it alike."""
