# JAX set up as every roofcal command sets it (on the CPU, XLA's flags as the commands' own, so
# that the tests and the commands they run share compiled programs), and compiled programs kept
# on disk as every command keeps them (ROOFCAL_CACHE; "off": none), before JAX is imported: a
# process whose first program compiles without the cache never reads it afterwards, so the tests
# compiled most programs afresh in every worker
#
# Python's cycle collector tuned as in a roofcal process (cli.main.batch_gc): the test command
# 2:02 → 1:39 (870 passed, programs on disk), the largest worker's peak memory 3.40 → 3.52 GB
#
# roofcal.programs' store is off here and in the commands the tests run (ROOFCAL_PROGRAMS=off;
# tests/test_programs.py turns it on in a folder of its own): it keys programs by roofcal's
# source, so after every edit the suite compiled its ≈ 500 programs afresh (2:30–2:38 instead of
# 1:34–1:39) where JAX's cache, keyed by the lowered program, still had most; warm, it gains
# little (1:30 with it, 1:34–1:42 without)
#
# ROOFCAL_BLIS, which the README has a user export, is not the tests': they name the binary they
# run (../shared/tools/blis) and test what a command says without one
import os

from roofcal.cli.main import batch_gc, enable_compilation_cache, jax_defaults

os.environ["ROOFCAL_PROGRAMS"] = "off"
os.environ.pop("ROOFCAL_BLIS", None)
jax_defaults()
enable_compilation_cache()
batch_gc()
