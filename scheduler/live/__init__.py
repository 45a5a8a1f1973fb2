"""The scheduler's database side: load the snapshot, apply the decisions, reconcile, evaluate SLAs, the leader-elected
loop. Everything here runs inside one PostgreSQL transaction per cycle."""
