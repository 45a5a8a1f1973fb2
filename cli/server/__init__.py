"""The CLI's server-side commands: ``kiln up`` / ``down``, ``kiln admin bootstrap``, ``kiln migrate`` and
``kiln simulate``, which run on the machine that hosts kiln and work on its database, its storage, the scheduler's
trace replay and the host's GPUs (``workers.inventory``) rather than through the API.

This package is the one place the CLI may import the database layer, the scheduler or the workers: the import
contracts in ``pyproject.toml`` (``lint-imports``) name it as the only exception, and every other CLI module talks
to kiln through :class:`cli.client.KilnClient`.
"""
