"""kiln's trainer: the process each torchrun rank runs for a job (``python -m trainer --spec ... --run-dir ...``).

It talks to the control plane only through ``core.trainer_protocol``: JSON-lines telemetry under the run
directory, the fence file beside the checkpoints, and its exit code.
"""
