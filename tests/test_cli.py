"""The command line as a whole: every option's default is shown by ``-h``."""

from __future__ import annotations

import argparse

import pytest

from roofcal.cli.main import build_parser


def leaf_parsers(parser, prefix=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, p in subs[0].choices.items():
        yield from leaf_parsers(p, prefix + (name,))


LEAVES = list(leaf_parsers(build_parser()))


@pytest.mark.parametrize("command, parser", LEAVES, ids=[" ".join(c) for c, _ in LEAVES])
def test_help_shows_every_default(command, parser):
    """An option with a default value (not a flag that is off, not "none given") says it in
    ``-h``: argparse's own help did not (``capacity --gpu-memory-utilization`` applied 0.9 silently)."""
    missing = []
    for action in parser._actions:
        d = action.default
        if not action.option_strings or d in (None, False, argparse.SUPPRESS) or d == [] or action.help is None:
            continue
        helptext = " ".join(parser._get_formatter()._expand_help(action).split())
        if "default" not in helptext.lower():
            missing.append(action.option_strings[-1])
    assert not missing, f"roofcal {' '.join(command)} -h: no default shown for {', '.join(missing)}"


def test_the_default_is_the_value_used():
    p = build_parser()
    cap = next(pp for c, pp in LEAVES if c == ("capacity",))
    assert "vLLM's share of GPU memory (default: 0.9)" in " ".join(cap.format_help().split())
    a = p.parse_args(["capacity", "--model", "m", "--gpu", "g", "--tp", "1"])
    assert a.gpu_memory_utilization == 0.9
