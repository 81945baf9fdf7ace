"""The ``roofcal`` command line: one module per command group, each a thin wrapper over a documented function.

In: the command line. Out: calls of the functions named in each command's module docstring; one-line errors, exit status 2.
Open first: ``main.py`` (parser, error handling); then the module of the command.
"""

from roofcal.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
