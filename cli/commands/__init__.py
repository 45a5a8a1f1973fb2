"""The kiln commands, one module per area; importing a module registers its commands on :data:`cli.app.app`.

`kiln --help` lists the commands in the order they were registered, so this package imports the modules in that
order whichever of them is imported first. The server-side commands (``kiln admin``, ``migrate``, ``simulate``,
``up``, ``down``) live in :mod:`cli.server.commands`, the one part of the CLI that may reach the database; they are
registered here in their place in that order.
"""

# isort: off
from cli.commands import access, jobs, job_actions, job_progress, estimate, reuse, teams  # noqa: F401
from cli.server import commands as server_commands  # noqa: F401
from cli.commands import webhooks, checkpoints  # noqa: F401
# isort: on
