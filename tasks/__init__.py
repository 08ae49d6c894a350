"""The checkout's namespace for Invoke: `invoke TASK` here runs the tasks that the installed `slimeforge`
command runs (slimeforge/cli.py holds them, so that an installed package has them too)."""

from slimeforge.cli import *  # noqa: F403  (the tasks and helpers, as `tasks.NAME` for tests and scripts)
from slimeforge.cli import ns  # noqa: F401  (the collection Invoke looks for)
