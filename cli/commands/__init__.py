"""The kiln commands, one module per area; importing a module registers its commands on :data:`cli.app.app`.

`kiln --help` lists the commands in the order they were registered, so this package imports the modules in that
order whichever of them is imported first.
"""

# isort: off
from cli.commands import access, jobs, estimate, reuse, teams, admin, webhooks, checkpoints  # noqa: F401
# isort: on
