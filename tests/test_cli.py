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


def test_jax_runs_on_the_cpu_and_reproducibly_unless_told_otherwise():
    """The command line puts JAX on the CPU (on an H200 machine the fit took twice as long on its
    GPU) and asks XLA for deterministic GPU programs (two GPU fits wrote different files without),
    unless ``$JAX_PLATFORMS`` / ``$XLA_FLAGS`` say otherwise; JAX imported after ``main`` starts
    takes both."""
    import os
    import subprocess
    import sys

    from roofcal.cli.main import jax_defaults
    env = {}
    jax_defaults(env)
    assert env == {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_gpu_deterministic_ops=true"}
    env = {"JAX_PLATFORMS": "cuda", "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    jax_defaults(env)
    assert env == {"JAX_PLATFORMS": "cuda",
                   "XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_gpu_deterministic_ops=true"}
    env = {"XLA_FLAGS": "--xla_gpu_deterministic_ops=false"}
    jax_defaults(env)
    assert env["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=false"

    code = ("from roofcal.cli.main import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
            "import os, jax\nprint(jax.config.jax_platforms, os.environ['XLA_FLAGS'])")
    for given, used in ((None, "cpu"), ("cpu,cuda", "cpu,cuda")):
        env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
        if given is not None:
            env["JAX_PLATFORMS"] = given
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
        assert out[-2:] == [used, "--xla_gpu_deterministic_ops=true"]


def test_the_executable_ends_at_once_with_its_status_and_all_its_output():
    """``roofcal`` (``cli.main.run``) ends the process right after the command, skipping JAX's and
    the interpreter's teardown (≈ 0.45 s a command): the status is the command's, and what it
    printed reaches a pipe whole — the report's last line, the one-line error."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}   # a pipe: buffered

    def roofcal(*args):
        code = "import sys\nfrom roofcal.cli.main import run\nsys.argv = ['roofcal', *sys.argv[1:]]\nrun()"
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    ok = roofcal("capacity", "--model", "llama-2-7b-hf", "--gpu", "h100_sxm", "--tp", "1")
    assert ok.returncode == 0
    assert ok.stdout.rstrip().splitlines()[-1].lstrip().startswith("- KV cache:")
    bad = roofcal("fit", "--holdout", "2")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "roofcal: error: --holdout must be in [0, 1), got 2.0\n"


@pytest.mark.slow
def test_a_roofcal_process_runs_no_full_collection_of_its_heap(tmp_path):
    """``python -m roofcal.cli`` (as ``roofcal``) tunes Python's cycle collector for a command
    that runs once (``cli.main.batch_gc``): the README's ``predict`` ran 7 full collections of
    the whole heap with the interpreter's thresholds (≈ 0.1 s each in a fit), none with these."""
    import subprocess
    import sys

    steps = tmp_path / "steps.jsonl"
    steps.write_text('{"prefill": [[2048, 0]], "decode": []}\n'
                     '{"prefill": [], "decode": [512, 1024, 1024, 4096]}\n')
    code = ("import gc, runpy, sys\n"
            "full = []\n"
            "gc.callbacks.append(lambda phase, info: full.append(1) if phase == 'start' "
            "and info['generation'] == 2 else None)\n"
            "sys.argv = ['roofcal', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('roofcal.cli', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('full collections', len(full))\n")
    out = subprocess.run([sys.executable, "-c", code, "predict", "--model", "llama-3.1-70b-instruct",
                          "--gpu", "h100_sxm", "--tp", "4", "--steps", str(steps), "--coeffs",
                          "coeffs/h100_sxm.yaml", "--out", str(tmp_path / "pred.csv")],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "full collections 0"


def test_fit_reports_which_kernel_set_predictions_use():
    """The shipped H100 file's default stack, ``vllm``, was calibrated with vLLM 0.14's kernels,
    so predictions use that set although the file's ``kernels:`` is 0.24 (``--stack none``)."""
    from roofcal.cli.fit import set_role
    from roofcal.model import coeffs as coeff_io
    c = coeff_io.load("coeffs/h100_sxm.yaml")
    assert (c.stack, c.kernels, c.default_kernels) == ("vllm", "vllm-0.14.0", "vllm-0.24.0")
    assert set_role(c, "vllm-0.14.0") == " (default with stack 'vllm', calibrated with it)"
    assert set_role(c, "vllm-0.24.0") == " (the file's default, for --stack none)"
    bare = coeff_io.with_stack(c, None)
    assert set_role(bare, "vllm-0.24.0") == " (default)" and set_role(bare, "vllm-0.14.0") == ""


@pytest.mark.slow
def test_a_command_lists_the_programs_it_used_for_its_next_run_to_load_ahead(tmp_path):
    """``roofcal predict`` with a fresh store compiles and writes its programs and lists them
    (``predict.uses``), in the order used; the next runs load them ahead (``programs.prefetch``)
    and list the same. Every run writes the same bytes."""
    import os
    import subprocess
    import sys

    from roofcal.cli.main import command_name

    assert command_name(build_parser().parse_args(["workload", "validate", "runs"])) == "workload-validate"
    steps = tmp_path / "steps.jsonl"
    steps.write_text('{"prefill": [[2048, 0]], "decode": [512, 1024]}\n')
    env = {**os.environ, "ROOFCAL_CACHE": str(tmp_path / "cache"), "ROOFCAL_PROGRAMS": "on"}
    outs, lists = [], []
    for i in range(3):
        out = tmp_path / f"pred{i}.csv"
        subprocess.run([sys.executable, "-m", "roofcal.cli", "predict", "--model", "llama-3.1-70b-instruct",
                        "--gpu", "h100_sxm", "--tp", "4", "--steps", str(steps), "--coeffs",
                        "coeffs/h100_sxm.yaml", "--out", str(out)], env=env, check=True,
                       capture_output=True)
        outs.append(out.read_bytes())
        (here,) = (tmp_path / "cache" / "programs").iterdir()
        lists.append((here / "predict.uses").read_text().split())
    assert sorted(lists[0]) == sorted(p.name for p in here.glob("*.xla")) and lists[0]
    assert sorted(lists[1]) == sorted(lists[0]) and lists[2] == lists[1]
    assert outs[0] == outs[1] == outs[2]
