"""What the worker launches in each rank process: ``python -m rank.entry`` (started by torchrun, or directly for a
one-process attempt), which runs kiln's trainer as ``__main__`` (``runpy``, never an import) or, in script mode, the
spec's own command (``rank.script``), and records the rank's exit code for the worker.

It imports only core's worker/trainer protocol (``core.trainer_protocol``, ``core.telemetry``): neither the trainer
(torch), nor the worker (Celery, the database); the import contracts in ``pyproject.toml`` hold it so.
"""
