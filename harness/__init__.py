"""Real services and kiln's own processes, stood up for the tests and the benches alike (neither imports the other):
PostgreSQL databases and servers, Redis, a worker cluster, the dashboard, faults, crafted archives."""
