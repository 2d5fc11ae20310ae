"""The ``specfold`` command line: generate, demo, dump, calibrate, eval, sweep, train.

``entry``          the command and its subcommands (``main``)
``arguments``      argument checks that run before any work, one-line user errors (status 2)
``options``        the arguments several commands share; ``cuda_graphs``: ``--cuda-graphs``
``delegated``      calibrate and train (parsers of their own): their arguments checked before handing over
``generate``, ``demo``, ``dump``, ``eval_commands``: one command (or two) per file
"""

from .demo import demo_prompts
from .entry import main

__all__ = ["main", "demo_prompts"]
