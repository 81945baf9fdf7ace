"""Bad input on every ``roofcal`` command: one line ``roofcal: error: …`` on stderr naming the file
and field at fault, exit status 2, no traceback, and nothing written.

Every case runs ``roofcal.cli.main.main(argv)`` in-process, in a folder (the current folder during
the call, and the folder of :mod:`tempfile`) holding a copy of the inputs the cases need
(:func:`make_inputs`, made once per module; the copy is made again after a case that changed it).
A case passes when

* ``main`` returns 2 (or argparse raises ``SystemExit(2)`` with its two-line usage + error form),
* stderr is exactly one line, starting with ``roofcal: error:`` (argparse: ``roofcal …: error:``),
  and holds no ``Traceback``,
* every file and folder of that copy (hidden ones included) is as it was before the call:
  no output, no temporary, no backup, no modified input.

An exception escaping ``main`` is left to propagate: that is the traceback a user would see.
Each case runs under a time guard (``timeout``, seconds): a command that works for minutes before
it notices bad input fails the case (cases known to be slow say so in a comment).

A few cases (:data:`SUBPROCESS_CASES`) are replayed end to end as ``python -m roofcal.cli``.
Inputs are read from the project (``coeffs/``, ``model_configs/``, ``data/``) and from
``../shared`` (experiment folders, the BLIS binary); nothing is written outside pytest's temporary
folders.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
COEFFS = ROOT / "coeffs" / "h100_sxm.yaml"
BLIS_DEFAULTS = ROOT / "data" / "blis" / "defaults.yaml"
BLIS_HARDWARE = ROOT / "data" / "blis" / "hardware_config.json"
L4_DATASHEET = ROOT / "roofcal" / "physics" / "hardware" / "l4.yaml"
EXP_NAME = "20260217-155451-llama-2-7b-tp1-codegen"
EXP = str(SHARED / "workload" / "default_args" / EXP_NAME)
BLIS = str(SHARED / "tools" / "blis")
PROC = "/proc/roofcal-bad-input"          # even root cannot create anything under /proc

#: a deployment for step files without one
M7 = ["--model", "llama-2-7b-hf", "--gpu", "h100_sxm", "--tp", "1"]
CAP = ["capacity", "--model", "llama-2-7b-hf", "--gpu", "h100_sxm"]
WHATIF = ["whatif", "--steps", "steps.jsonl", *M7]
STEPS_D = ["--data", "stepsd.jsonl", "--model", "llama-2-7b-hf", "--tp", "1"]   # small measured steps
RES = ["residuals", "--coeffs", "coeffs.yaml", *STEPS_D, "--no-plots"]
FIT = ["fit", "--quiet", "--gpu", "h100_sxm"]
BFIT = ["blis", "fit", "--coeffs", "coeffs.yaml", "--model", "llama-2-7b-hf:1"]
EXPB = ["export", "blis", "--coeffs", "coeffs.yaml", "--defaults", "defaults.yaml"]
VAL = ["workload", "validate", EXP, "--blis", BLIS]
CAL = ["workload", "calibrate", EXP, "--blis", BLIS, "--coeffs", "coeffs.yaml"]
LOMO = ["workload", "lomo", EXP, "--blis", BLIS, "--coeffs", "coeffs.yaml"]
TREAD = ["traces", "read", "trace.json", "-q"]
SAT = ["workload", "saturation", "--model", "llama-2-7b-hf", "--tp", "1", "--prompt", "512", "--output", "128"]


# ------------------------------------------------------------------------------------- inputs

def _edit(src: Path, dst: Path, old: str, new: str) -> None:
    text = src.read_text(encoding="utf-8")
    assert old in text, f"{src}: '{old}' not found (fixture out of date)"
    dst.write_text(text.replace(old, new, 1), encoding="utf-8")


def make_inputs(tmp: Path) -> None:
    """Every input the cases use, good and bad, in ``tmp``."""
    w = lambda name, text: (tmp / name).write_text(text, encoding="utf-8")   # noqa: E731
    # generic bad files and folders
    w("afile", "a plain file, not a folder\n")
    (tmp / "adir").mkdir()
    for name in ("empty.yaml", "empty.jsonl", "empty.json", "empty.csv"):
        w(name, "")
    w("list.yaml", "- a\n- b\n")
    w("bad.yaml", "a: [1, 2\n")
    w("table.csv", "a,b\n1,2\n")
    w("ops.csv", "gpu,op,dtype,m,n,k,latency_us\nh100_sxm,gemm,bf16,64,4096,4096,20.0\n")
    w("list.json", "[]\n")
    w("object.json", '{"x": 1}\n')
    # coefficient files: a good copy and edited copies
    shutil.copy(COEFFS, tmp / "coeffs.yaml")
    text = COEFFS.read_text(encoding="utf-8")
    w("c_topkey.yaml", text + "bogus_key: 1\n")
    _edit(COEFFS, tmp / "c_opkey.yaml", "      allreduce/custom:\n", "      allreduce/custom:\n        bogus_field: 3\n")
    _edit(COEFFS, tmp / "c_opkind.yaml", "    ops:\n", "    ops:\n      bogus/kind:\n        latency_us: 1.0\n")
    _edit(COEFFS, tmp / "c_schema.yaml", "schema: roofcal-coeffs/3", "schema: roofcal-coeffs/99")
    first = re.search(r"\n {8}latency_us: [^\n]+\n", text).group(0)
    _edit(COEFFS, tmp / "c_nan.yaml", first, "\n        latency_us: .nan\n")
    ratio = re.search(r"\n {12}log_ratio: [^\n]+\n", text).group(0)
    _edit(COEFFS, tmp / "c_curve_text.yaml", ratio, "\n            log_ratio: 0.01 fast 0.02\n")
    at = re.search(r"\n {12}at: [^\n]+\n", text).group(0)
    _edit(COEFFS, tmp / "c_curve_order.yaml", at, "\n            at: 4 2 1\n")
    shrink = re.search(r"\n {10}shrink: [^\n]+\n", text).group(0)
    _edit(COEFFS, tmp / "c_curve_shrink.yaml", shrink, "\n          shrink: 1.5\n")
    kernels = re.search(r"\nkernels: [^\n]+\n", text).group(0)
    _edit(COEFFS, tmp / "c_kernels.yaml", kernels, "\nkernels: vllm-9.9.9\n")
    gamma = re.search(r"\n {6}voltage_exponent: [^\n]+\n", text).group(0)
    _edit(COEFFS, tmp / "c_power.yaml", gamma, "\n      voltage_exponent: 9.0\n")
    # step files
    w("steps.jsonl", '{"prefill": [[2048, 0]], "decode": []}\n{"prefill": [], "decode": [512, 1024]}\n')
    w("stepsd.jsonl", '{"prefill": [[2048, 0]], "decode": [], "duration_us": 90000}\n'
                      '{"prefill": [], "decode": [512, 1024], "duration_us": 12000}\n')
    w("steps_unknown.jsonl", '{"foo": 1}\n')
    w("steps_neg.jsonl", '{"prefill": [[-5, 0]], "decode": []}\n')
    w("steps_nan.jsonl", '{"prefill": [], "decode": [NaN]}\n')
    w("steps_tp3.jsonl", '{"prefill": [[512, 0]], "decode": []}\n{"prefill": [], "decode": [64], "tp": 3}\n')
    w("steps_ep_dense.jsonl", '{"prefill": [], "decode": [64], "dp": 2, "ep": true}\n')
    w("steps_ep_str.jsonl", '{"prefill": [], "decode": [64], "ep": "yes"}\n')
    w("stepsd_dp2.jsonl", '{"prefill": [[2048, 0]], "decode": [], "duration_us": 90000, "dp": 2}\n')
    w("stepsd_tp3.jsonl", '{"prefill": [[2048, 0]], "decode": [], "duration_us": 90000, "tp": 3}\n')
    # datasheets
    ds = L4_DATASHEET.read_text(encoding="utf-8")
    assert "hbm_bandwidth_tbs: 0.3\n" in ds
    w("ds_missing.yaml", ds.replace("hbm_bandwidth_tbs: 0.3\n", ""))
    w("ds_negative.yaml", ds.replace("hbm_bandwidth_tbs: 0.3\n", "hbm_bandwidth_tbs: -0.3\n"))
    w("ds_nan.yaml", ds.replace("hbm_bandwidth_tbs: 0.3\n", "hbm_bandwidth_tbs: .nan\n"))
    w("ds_unknown.yaml", ds + "bogus_field: 1\n")
    assert "power_limit_w: 72\n" in ds
    w("ds_power.yaml", ds.replace("power_limit_w: 72\n", "power_limit_w: -72\n"))
    # model configs
    w("cfg_empty.json", "{}\n")
    # BLIS files (copies: some cases would rewrite them in place)
    shutil.copy(BLIS_DEFAULTS, tmp / "defaults.yaml")
    shutil.copy(BLIS_HARDWARE, tmp / "hw.json")
    # traces: a small synthetic vLLM trace, JSON that is not OTLP, OTLP without a single step
    from roofcal.bench.traces import generate
    generate(tmp / "trace.json", 0.03)
    w("not_otlp.json", '{"a": 1}\n')
    w("otlp_no_steps.json", '{"resourceSpans": []}\n')
    # experiment folders that are not runs
    (tmp / "exp_list").mkdir()
    w("exp_list/exp-config.yaml", "- a\n")
    (tmp / "exp_noresults").mkdir()
    if Path(EXP).is_dir():
        shutil.copy(Path(EXP) / "exp-config.yaml", tmp / "exp_noresults" / "exp-config.yaml")
    # multi-output destinations of which one output is a folder
    for name in ("rep_csvdir/residuals.csv", "rep_pqdir/residuals.parquet", "rep_mddir/summary.md", f"tr_onebad/{EXP_NAME}.csv",
                 "dd_onebad/llama-2-7b-hf-tp2.yaml"):
        (tmp / name).mkdir(parents=True)


def snapshot(root: Path) -> dict:
    """{relative path: (size, mtime in ns, inode) of a file, or 'dir'} of everything under ``root``,
    hidden included: any write changes it — a new file, an atomic replace (a new inode), a write
    in place, even of the same bytes — without reading the 43 MB of inputs twice a case."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            st = os.stat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def changes(before: dict, after: dict) -> list[str]:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return [f"+ {k}" for k in added] + [f"- {k}" for k in removed] + [f"~ {k}" for k in changed]


# -------------------------------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple
    timeout: float = 60.0
    needs_shared: bool = False
    says: str = ""             # a regular expression the error line must match: the right input named


def C(id, *argv, timeout=60.0, says=""):
    argv = tuple(str(a) for a in argv)
    return Case(id, argv, timeout, any(a.startswith(str(SHARED)) for a in argv), says)


CASES = [
    # ---- predict
    C("predict-dp-0", "predict", "--steps", "steps.jsonl", *M7, "--dp", "0", "--out", "o.csv",
      says=r"--dp: data-parallel size must be a positive integer, got 0"),
    C("predict-ep-dense", "predict", "--steps", "steps.jsonl", *M7, "--dp", "2", "--enable-expert-parallel",
      "--out", "o.csv", says=r"expert parallelism needs an MoE model"),
    C("predict-moe-comm-unknown", "predict", "--steps", "steps.jsonl", *M7, "--dp", "2",
      "--moe-comm-backend", "bogus", "--out", "o.csv", says=r"unknown MoE comm backend 'bogus'"),
    C("predict-steps-ep-dense", "predict", "--steps", "steps_ep_dense.jsonl", *M7, "--out", "o.csv",
      says=r"steps_ep_dense.jsonl: step 1 'dp', 'ep': expert parallelism needs an MoE model"),
    C("predict-steps-ep-not-bool", "predict", "--steps", "steps_ep_str.jsonl", *M7, "--out", "o.csv",
      says=r"field 'ep' must be true or false, got 'yes'"),
    C("predict-steps-missing", "predict", "--steps", "nope.jsonl", *M7, "--out", "o.csv"),
    C("predict-steps-is-dir", "predict", "--steps", "adir", *M7, "--out", "o.csv"),
    C("predict-steps-empty", "predict", "--steps", "empty.jsonl", *M7, "--out", "o.csv"),
    C("predict-steps-csv", "predict", "--steps", "table.csv", *M7, "--out", "o.csv"),
    C("predict-steps-yaml-list", "predict", "--steps", "list.yaml", *M7, "--out", "o.csv"),
    C("predict-steps-unknown-field", "predict", "--steps", "steps_unknown.jsonl", *M7, "--out", "o.csv"),
    C("predict-steps-negative-tokens", "predict", "--steps", "steps_neg.jsonl", *M7, "--out", "o.csv"),
    C("predict-steps-nan-context", "predict", "--steps", "steps_nan.jsonl", *M7, "--out", "o.csv"),
    C("predict-ops-missing", "predict", "--ops", "nope.csv", "--coeffs", "coeffs.yaml", "--out", "o.csv"),
    C("predict-ops-is-dir", "predict", "--ops", "adir", "--coeffs", "coeffs.yaml", "--out", "o.csv"),
    C("predict-ops-empty", "predict", "--ops", "empty.csv", "--coeffs", "coeffs.yaml", "--out", "o.csv"),
    C("predict-ops-yaml", "predict", "--ops", "list.yaml", "--coeffs", "coeffs.yaml", "--out", "o.csv"),
    C("predict-coeffs-missing", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "nope.yaml", "--out", "o.csv"),
    C("predict-coeffs-is-dir", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "adir", "--out", "o.csv"),
    C("predict-coeffs-empty", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "empty.yaml", "--out", "o.csv"),
    C("predict-coeffs-csv", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "table.csv", "--out", "o.csv"),
    C("predict-coeffs-yaml-list", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "list.yaml", "--out", "o.csv"),
    C("predict-coeffs-bad-yaml", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "bad.yaml", "--out", "o.csv"),
    C("predict-coeffs-unknown-top-key", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "c_topkey.yaml",
      "--out", "o.csv"),
    C("predict-coeffs-unknown-op-key", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "c_opkey.yaml",
      "--out", "o.csv"),
    C("predict-coeffs-unknown-op-kind", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "c_opkind.yaml",
      "--out", "o.csv"),
    C("predict-coeffs-wrong-schema", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "c_schema.yaml",
      "--out", "o.csv"),
    C("predict-coeffs-nan-latency", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "c_nan.yaml",
      "--out", "o.csv"),
    C("predict-coeffs-curve-not-a-number", "predict", "--steps", "steps.jsonl", *M7, "--coeffs",
      "c_curve_text.yaml", "--out", "o.csv"),
    C("predict-coeffs-curve-descending", "predict", "--steps", "steps.jsonl", *M7, "--coeffs",
      "c_curve_order.yaml", "--out", "o.csv"),
    C("predict-coeffs-curve-shrink-above-1", "predict", "--steps", "steps.jsonl", *M7, "--coeffs",
      "c_curve_shrink.yaml", "--out", "o.csv"),
    C("predict-tp-0", "predict", "--steps", "steps.jsonl", "--model", "llama-2-7b-hf", "--gpu", "h100_sxm",
      "--tp", "0", "--out", "o.csv"),
    C("predict-tp-negative", "predict", "--steps", "steps.jsonl", "--model", "llama-2-7b-hf", "--gpu", "h100_sxm",
      "--tp", "-2", "--out", "o.csv"),
    C("predict-tp-1000", "predict", "--steps", "steps.jsonl", "--model", "llama-2-7b-hf", "--gpu", "h100_sxm",
      "--tp", "1000", "--out", "o.csv"),
    # the TP that does not divide the heads is blamed on where it came from: the option or the line
    C("predict-tp-3-of-32-heads", "predict", "--steps", "steps.jsonl", "--model", "llama-2-7b-hf", "--gpu",
      "h100_sxm", "--tp", "3", "--out", "o.csv", says=r"^roofcal: error: --tp: TP 3 does not divide"),
    C("predict-steps-tp-3-of-32-heads", "predict", "--steps", "steps_tp3.jsonl", *M7, "--out", "o.csv",
      says=r"^roofcal: error: steps_tp3\.jsonl: step 2 'tp': TP 3 does not divide"),
    C("predict-tp-not-int", "predict", "--steps", "steps.jsonl", "--model", "llama-2-7b-hf", "--gpu", "h100_sxm",
      "--tp", "1.5", "--out", "o.csv"),
    C("predict-model-unknown", "predict", "--steps", "steps.jsonl", "--model", "no-such-model", "--gpu", "h100_sxm",
      "--tp", "1", "--out", "o.csv"),
    C("predict-model-config-empty", "predict", "--steps", "steps.jsonl", "--model", "cfg_empty.json", "--gpu",
      "h100_sxm", "--tp", "1", "--out", "o.csv"),
    C("predict-gpu-unknown", "predict", "--steps", "steps.jsonl", "--model", "llama-2-7b-hf", "--gpu", "z100",
      "--tp", "1", "--out", "o.csv"),
    C("predict-gpu-datasheet-missing-field", "predict", "--steps", "steps.jsonl", "--model", "llama-2-7b-hf",
      "--gpu", "ds_missing.yaml", "--tp", "1", "--out", "o.csv"),
    C("predict-stack-unknown", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "coeffs.yaml",
      "--stack", "nosuch", "--out", "o.csv"),
    C("predict-kernels-unknown", "predict", "--steps", "steps.jsonl", *M7, "--coeffs", "coeffs.yaml",
      "--kernels", "vllm-9.9.9", "--out", "o.csv"),
    C("predict-ops-kernels-unknown", "predict", "--ops", "ops.csv", "--coeffs", "coeffs.yaml",
      "--kernels", "vllm-9.9.9", "--out", "o.csv"),
    C("predict-coeffs-default-kernels-missing", "predict", "--steps", "steps.jsonl", *M7, "--coeffs",
      "c_kernels.yaml", "--out", "o.csv"),
    C("predict-no-input", "predict", "--out", "o.csv"),
    C("predict-out-under-file", "predict", "--steps", "steps.jsonl", *M7, "--out", "afile/o.csv"),
    C("predict-out-is-dir", "predict", "--steps", "steps.jsonl", *M7, "--out", "adir"),
    C("predict-out-unwritable", "predict", "--steps", "steps.jsonl", *M7, "--out", f"{PROC}/o.csv",
      says=r"the folder /proc exists but accepts no new files"),      # not "No such file or directory"

    # ---- fit (never without --out: the default is a file of the project)
    C("fit-data-missing", *FIT, "--data", "nope.jsonl", "--out", "f.yaml"),
    C("fit-data-empty-dir", *FIT, "--data", "adir", "--out", "f.yaml"),
    C("fit-data-empty-file", *FIT, "--data", "empty.jsonl", "--out", "f.yaml"),
    C("fit-data-yaml", *FIT, "--data", "list.yaml", "--out", "f.yaml"),
    C("fit-gpu-unknown", "fit", "--quiet", "--gpu", "z100", *STEPS_D, "--out", "f.yaml"),
    C("fit-steps-dp", *FIT, "--data", "stepsd_dp2.jsonl", "--model", "llama-2-7b-hf", "--tp", "1",
      "--out", "f.yaml", says=r"stepsd_dp2.jsonl: step 1 'dp': a data- or expert-parallel step is predicted"),
    C("fit-prior-missing", *FIT, *STEPS_D, "--prior", "nope.yaml", "--out", "f.yaml"),
    C("fit-prior-csv", *FIT, *STEPS_D, "--prior", "table.csv", "--out", "f.yaml"),
    C("fit-prior-unknown-top-key", *FIT, *STEPS_D, "--prior", "c_topkey.yaml", "--out", "f.yaml"),
    C("fit-prior-unknown-op-key", *FIT, *STEPS_D, "--prior", "c_opkey.yaml", "--out", "f.yaml"),
    C("fit-tp-3-of-32-heads", *FIT, "--data", "stepsd.jsonl", "--model", "llama-2-7b-hf", "--tp", "3",
      "--out", "f.yaml", says=r"^roofcal: error: --tp: TP 3 does not divide"),
    C("fit-steps-tp-3-of-32-heads", *FIT, "--data", "stepsd_tp3.jsonl", "--model", "llama-2-7b-hf", "--tp", "1",
      "--out", "f.yaml", says=r"stepsd_tp3\.jsonl: step 1 'tp': TP 3 does not divide"),
    C("fit-tp-0", *FIT, "--data", "stepsd.jsonl", "--model", "llama-2-7b-hf", "--tp", "0", "--out", "f.yaml"),
    C("fit-holdout-above-1", *FIT, *STEPS_D, "--holdout", "1.5", "--out", "f.yaml"),
    C("fit-holdout-negative", *FIT, *STEPS_D, "--holdout", "-0.2", "--out", "f.yaml"),
    C("fit-holdout-nan", *FIT, *STEPS_D, "--holdout", "nan", "--out", "f.yaml"),
    C("fit-prior-weight-negative", *FIT, *STEPS_D, "--prior", "coeffs.yaml", "--prior-weight", "-1",
      "--out", "f.yaml"),
    C("fit-prior-weight-nan", *FIT, *STEPS_D, "--prior", "coeffs.yaml", "--prior-weight", "nan", "--out", "f.yaml"),
    C("fit-stack-from-no-name", *FIT, *STEPS_D, "--stack-from", "coeffs.yaml", "--out", "f.yaml"),
    C("fit-stack-from-missing-file", *FIT, *STEPS_D, "--stack-from", "nope.yaml:vllm", "--out", "f.yaml"),
    C("fit-requests-missing", *FIT, *STEPS_D, "--requests", "nope.csv", "--out", "f.yaml"),
    C("fit-step-target-unknown", *FIT, *STEPS_D, "--step-target", "bogus", "--out", "f.yaml"),
    C("fit-kernels-unknown", *FIT, *STEPS_D, "--prior", "coeffs.yaml", "--kernels", "vllm-9.9.9", "--out", "f.yaml"),
    C("fit-max-rows-0", *FIT, *STEPS_D, "--max-rows", "0", "--out", "f.yaml"),
    C("fit-out-under-file", *FIT, *STEPS_D, "--out", "afile/f.yaml"),
    C("fit-out-is-dir", *FIT, *STEPS_D, "--out", "adir"),
    C("fit-out-unwritable", *FIT, *STEPS_D, "--out", f"{PROC}/f.yaml"),
    # the bundled data: root passes os.access on /proc, so the whole fit (~85 s) runs before the write fails
    C("fit-bundled-out-unwritable", *FIT, "--out", f"{PROC}/f.yaml", timeout=60),

    # ---- bench: cheap argument errors only (a full bench runs for minutes; the guard is short)
    C("bench-out-under-file", "bench", "--no-transfer", "--out", "afile/b.md", timeout=30),
    C("bench-out-is-dir", "bench", "--no-transfer", "--out", "adir", timeout=30),
    C("bench-out-unwritable", "bench", "--no-transfer", "--out", f"{PROC}/b.md", timeout=30),
    C("bench-traces-mb-negative", "bench", "--no-transfer", "--traces-mb", "-5", "--out", "b.md", timeout=30),
    C("bench-traces-mb-nan", "bench", "--no-transfer", "--traces-mb", "nan", "--out", "b.md", timeout=30),
    C("bench-unknown-flag", "bench", "--bogus"),

    # ---- blis check
    C("blis-check-goldens-missing", "blis", "check", "--goldens", "nope.json"),
    C("blis-check-goldens-is-dir", "blis", "check", "--goldens", "adir"),
    C("blis-check-goldens-empty", "blis", "check", "--goldens", "empty.json"),
    C("blis-check-goldens-csv", "blis", "check", "--goldens", "table.csv"),
    C("blis-check-goldens-json-list", "blis", "check", "--goldens", "list.json"),
    C("blis-check-goldens-json-no-cases", "blis", "check", "--goldens", "object.json"),

    # ---- blis fit
    C("blis-fit-coeffs-missing", "blis", "fit", "--coeffs", "nope.yaml", "--model", "llama-2-7b-hf:1",
      "--out", "f.yaml"),
    C("blis-fit-coeffs-unknown-top-key", "blis", "fit", "--coeffs", "c_topkey.yaml", "--model", "llama-2-7b-hf:1",
      "--out", "f.yaml"),
    C("blis-fit-coeffs-unknown-op-key", "blis", "fit", "--coeffs", "c_opkey.yaml", "--model", "llama-2-7b-hf:1",
      "--out", "f.yaml"),
    C("blis-fit-nothing-to-fit", "blis", "fit", "--out", "f.yaml"),
    C("blis-fit-defaults-missing", *BFIT, "--defaults", "nope.yaml", "--out", "f.yaml"),
    C("blis-fit-defaults-yaml-list", *BFIT, "--defaults", "list.yaml", "--out", "f.yaml"),
    C("blis-fit-hardware-config-missing", *BFIT, "--hardware-config", "nope.json", "--out", "f.yaml"),
    C("blis-fit-hardware-config-csv", *BFIT, "--hardware-config", "table.csv", "--out", "f.yaml"),
    C("blis-fit-hardware-unknown", *BFIT, "--hardware", "Z100", "--out", "f.yaml"),
    C("blis-fit-samples-negative", *BFIT, "--samples", "-1", "--out", "f.yaml"),
    C("blis-fit-samples-huge", *BFIT, "--samples", "1000000000000", "--out", "f.yaml", timeout=30),
    C("blis-fit-holdout-1", *BFIT, "--holdout", "1", "--out", "f.yaml"),
    C("blis-fit-iters-0", *BFIT, "--iters", "0", "--out", "f.yaml"),
    C("blis-fit-tp-0", "blis", "fit", "--coeffs", "coeffs.yaml", "--model", "llama-2-7b-hf", "--tp", "0",
      "--out", "f.yaml"),
    C("blis-fit-model-unknown", "blis", "fit", "--coeffs", "coeffs.yaml", "--model", "no-such-model:1",
      "--out", "f.yaml"),
    C("blis-fit-steps-missing", *BFIT, "--steps", "nope.jsonl", "--out", "f.yaml"),
    C("blis-fit-out-under-file", *BFIT, "--out", "afile/f.yaml"),
    C("blis-fit-out-is-dir", *BFIT, "--out", "adir"),
    C("blis-fit-out-unwritable", *BFIT, "--out", f"{PROC}/f.yaml"),

    # ---- export blis
    C("export-blis-coeffs-missing", "export", "blis", "--coeffs", "nope.yaml", "--defaults", "defaults.yaml",
      "--out", "n.yaml"),
    C("export-blis-coeffs-unknown-top-key", "export", "blis", "--coeffs", "c_topkey.yaml", "--defaults",
      "defaults.yaml", "--out", "n.yaml"),
    C("export-blis-coeffs-unknown-op-key-in-place", "export", "blis", "--coeffs", "c_opkey.yaml", "--defaults",
      "defaults.yaml", "--in-place"),
    C("export-blis-defaults-missing", "export", "blis", "--coeffs", "coeffs.yaml", "--defaults", "nope.yaml",
      "--out", "n.yaml"),
    C("export-blis-defaults-empty", "export", "blis", "--coeffs", "coeffs.yaml", "--defaults", "empty.yaml",
      "--out", "n.yaml"),
    C("export-blis-defaults-bad-yaml", "export", "blis", "--coeffs", "coeffs.yaml", "--defaults", "bad.yaml",
      "--out", "n.yaml"),
    C("export-blis-no-output", *EXPB),
    C("export-blis-samples-negative", *EXPB, "--samples", "-1", "--out", "n.yaml"),
    C("export-blis-tp-0", *EXPB, "--model", "llama-2-7b-hf", "--tp", "0", "--out", "n.yaml"),
    C("export-blis-model-unknown", *EXPB, "--model", "no-such-model:1", "--out", "n.yaml"),
    C("export-blis-out-under-file", *EXPB, "--out", "afile/n.yaml"),
    C("export-blis-out-is-dir", *EXPB, "--out", "adir"),
    C("export-blis-out-unwritable", *EXPB, "--out", f"{PROC}/n.yaml"),
    C("export-blis-out-dir-is-file", *EXPB, "--out-dir", "afile"),
    C("export-blis-out-dir-under-file", *EXPB, "--out-dir", "afile/sub"),
    C("export-blis-out-dir-unwritable", *EXPB, "--out-dir", f"{PROC}/d"),
    C("export-blis-for-missing-run", *EXPB, "--out-dir", "d", "--for", "nope"),
    C("export-blis-for-in-place", *EXPB, "--for", EXP, "--in-place"),
    C("export-blis-for-global-missing-run", *EXPB, "--for", "nope", "--out", "o.yaml"),
    C("export-blis-kernels-unknown", *EXPB, "--model", "llama-2-7b-hf:1", "--kernels", "vllm-9.9.9",
      "--out", "o.yaml"),
    # two outputs (tp1, tp2), the second one a folder: nothing may be written
    C("export-blis-out-dir-one-output-is-dir", *EXPB, "--model", "llama-2-7b-hf:1,2", "--out-dir", "dd_onebad",
      timeout=90),

    # ---- export hardware
    C("export-hardware-gpu-unknown", "export", "hardware", "--gpu", "z100"),
    C("export-hardware-gpu-datasheet-list", "export", "hardware", "--gpu", "list.yaml", "--out", "h.json"),
    C("export-hardware-coeffs-missing", "export", "hardware", "--gpu", "h100_sxm", "--coeffs", "nope.yaml"),
    C("export-hardware-coeffs-unknown-key-into", "export", "hardware", "--gpu", "h100_sxm", "--coeffs",
      "c_topkey.yaml", "--into", "hw.json"),
    C("export-hardware-into-missing", "export", "hardware", "--gpu", "h100_sxm", "--into", "nope.json"),
    C("export-hardware-into-is-dir", "export", "hardware", "--gpu", "h100_sxm", "--into", "adir"),
    C("export-hardware-into-csv", "export", "hardware", "--gpu", "h100_sxm", "--into", "table.csv"),
    C("export-hardware-into-json-list", "export", "hardware", "--gpu", "h100_sxm", "--into", "list.json"),
    C("export-hardware-out-under-file", "export", "hardware", "--gpu", "h100_sxm", "--out", "afile/h.json"),
    C("export-hardware-out-is-dir", "export", "hardware", "--gpu", "h100_sxm", "--into", "hw.json", "--out", "adir"),
    C("export-hardware-out-unwritable", "export", "hardware", "--gpu", "h100_sxm", "--into", "hw.json",
      "--out", f"{PROC}/h.json"),

    # ---- residuals
    C("residuals-coeffs-missing", "residuals", "--coeffs", "nope.yaml", *STEPS_D, "--out", "rep"),
    C("residuals-coeffs-is-dir", "residuals", "--coeffs", "adir", *STEPS_D, "--out", "rep"),
    C("residuals-coeffs-unknown-op-key", "residuals", "--coeffs", "c_opkey.yaml", *STEPS_D, "--out", "rep"),
    C("residuals-nothing-to-inspect", "residuals", "--out", "rep"),
    C("residuals-data-missing", "residuals", "--coeffs", "coeffs.yaml", "--data", "nope.jsonl", "--out", "rep"),
    C("residuals-data-empty-file", "residuals", "--coeffs", "coeffs.yaml", "--data", "empty.jsonl", "--out", "rep"),
    C("residuals-data-empty-dir", "residuals", "--coeffs", "coeffs.yaml", "--data", "adir", "--out", "rep"),
    C("residuals-blis-missing", "residuals", "--blis", "nope.yaml", *STEPS_D, "--out", "rep"),
    C("residuals-gpu-unknown", *RES, "--gpu", "z100", "--out", "rep"),
    C("residuals-tp-0", "residuals", "--coeffs", "coeffs.yaml", "--data", "stepsd.jsonl", "--model",
      "llama-2-7b-hf", "--tp", "0", "--no-plots", "--out", "rep"),
    C("residuals-worst-negative", *RES, "--worst", "-1", "--out", "rep"),
    C("residuals-top-negative", *RES, "--top", "-3", "--out", "rep"),
    C("residuals-out-is-file", *RES, "--out", "afile"),
    C("residuals-out-under-file", *RES, "--out", "afile/rep"),
    C("residuals-out-unwritable", *RES, "--out", f"{PROC}/rep"),
    C("residuals-kernels-unknown", *RES, "--kernels", "vllm-9.9.9", "--out", "rep"),
    C("residuals-out-one-output-is-dir-csv", *RES, "--csv", "--out", "rep_csvdir"),
    C("residuals-out-one-output-is-dir-parquet", *RES, "--out", "rep_pqdir"),
    C("residuals-out-one-output-is-dir-md", *RES, "--out", "rep_mddir"),

    # ---- gpu list / show
    C("gpu-list-extra-argument", "gpu", "list", "h100_sxm"),
    C("gpu-show-unknown", "gpu", "show", "z100"),
    C("gpu-show-missing-yaml", "gpu", "show", "nope.yaml"),
    C("gpu-show-is-dir", "gpu", "show", "adir"),
    C("gpu-show-empty", "gpu", "show", "empty.yaml"),
    C("gpu-show-csv", "gpu", "show", "table.csv"),
    C("gpu-show-yaml-list", "gpu", "show", "list.yaml"),
    C("gpu-show-bad-yaml", "gpu", "show", "bad.yaml"),
    C("gpu-show-missing-field", "gpu", "show", "ds_missing.yaml"),
    C("gpu-show-negative-field", "gpu", "show", "ds_negative.yaml"),
    C("gpu-show-nan-field", "gpu", "show", "ds_nan.yaml"),
    C("gpu-show-unknown-field", "gpu", "show", "ds_unknown.yaml"),
    C("gpu-show-out-without-yaml", "gpu", "show", "l4", "--out", "l4.yaml", says=r"give --yaml"),
    C("gpu-show-yaml-out-is-dir", "gpu", "show", "l4", "--yaml", "--out", "adir"),
    C("gpu-show-yaml-out-unwritable", "gpu", "show", "l4", "--yaml", "--out", f"{PROC}/l4.yaml",
      says=r"accepts no new files"),
    C("gpu-show-yaml-of-a-bad-datasheet", "gpu", "show", "ds_missing.yaml", "--yaml", "--out", "o.yaml",
      says=r"ds_missing\.yaml: missing field 'hbm_bandwidth_tbs'"),

    # ---- gpu template
    C("gpu-template-bad-name", "gpu", "template", "bad name!", says=r"a GPU name is letters"),
    C("gpu-template-like-unknown", "gpu", "template", "g1", "--like", "z100", says=r"unknown GPU 'z100'"),
    C("gpu-template-like-missing-yaml", "gpu", "template", "g1", "--like", "nope.yaml"),
    C("gpu-template-out-is-dir", "gpu", "template", "g1", "--out", "adir"),
    C("gpu-template-out-under-file", "gpu", "template", "g1", "--out", "afile/g1.yaml"),

    # ---- gpu bootstrap
    C("gpu-bootstrap-datasheet-unknown", "gpu", "bootstrap", "--datasheet", "z100", "--from", "coeffs.yaml",
      "--out", "b.yaml"),
    C("gpu-bootstrap-datasheet-missing-field", "gpu", "bootstrap", "--datasheet", "ds_missing.yaml", "--from",
      "coeffs.yaml", "--out", "b.yaml"),
    C("gpu-bootstrap-from-missing", "gpu", "bootstrap", "--datasheet", "l4", "--from", "nope.yaml", "--out", "b.yaml"),
    C("gpu-bootstrap-from-is-dir", "gpu", "bootstrap", "--datasheet", "l4", "--from", "adir", "--out", "b.yaml"),
    C("gpu-bootstrap-from-csv", "gpu", "bootstrap", "--datasheet", "l4", "--from", "table.csv", "--out", "b.yaml"),
    C("gpu-bootstrap-from-unknown-top-key", "gpu", "bootstrap", "--datasheet", "l4", "--from", "c_topkey.yaml",
      "--out", "b.yaml"),
    C("gpu-bootstrap-from-unknown-op-key", "gpu", "bootstrap", "--datasheet", "l4", "--from", "c_opkey.yaml",
      "--out", "b.yaml"),
    C("gpu-bootstrap-from-datasheet-missing", "gpu", "bootstrap", "--datasheet", "l4", "--from", "coeffs.yaml",
      "--from-datasheet", "nope.yaml", "--out", "b.yaml"),
    C("gpu-bootstrap-rule-unknown", "gpu", "bootstrap", "--datasheet", "l4", "--from", "coeffs.yaml",
      "--rule", "bogus", "--out", "b.yaml"),
    C("gpu-bootstrap-out-under-file", "gpu", "bootstrap", "--datasheet", "l4", "--from", "coeffs.yaml",
      "--out", "afile/b.yaml"),
    C("gpu-bootstrap-out-is-dir", "gpu", "bootstrap", "--datasheet", "l4", "--from", "coeffs.yaml", "--out", "adir"),
    C("gpu-bootstrap-out-unwritable", "gpu", "bootstrap", "--datasheet", "l4", "--from", "coeffs.yaml",
      "--out", f"{PROC}/b.yaml"),

    # ---- gpu plan
    C("gpu-plan-gpu-unknown", "gpu", "plan", "--gpu", "z100", "--shapes", "ops.csv", "--out", "p.csv",
      says=r"unknown GPU 'z100'"),
    C("gpu-plan-rows-0", "gpu", "plan", "--gpu", "l4", "--shapes", "ops.csv", "--rows", "0", "--out", "p.csv",
      says=r"--rows must be at least 1, got 0"),
    C("gpu-plan-shapes-missing", "gpu", "plan", "--gpu", "l4", "--shapes", "nope.csv", "--out", "p.csv",
      says=r"nope.csv: no such file"),
    C("gpu-plan-shapes-not-per-op", "gpu", "plan", "--gpu", "l4", "--shapes", "table.csv", "--out", "p.csv",
      says=r"table.csv: missing column 'gpu'"),
    C("gpu-plan-variant-unknown", "gpu", "plan", "--gpu", "l4", "--shapes", "ops.csv", "--variants", "gemm/fp9",
      "--out", "p.csv", says=r"--variants: no shapes of gemm/fp9 \(there are: gemm/bf16\)"),
    C("gpu-plan-out-is-dir", "gpu", "plan", "--gpu", "l4", "--shapes", "ops.csv", "--out", "adir"),
    C("gpu-plan-out-under-file", "gpu", "plan", "--gpu", "l4", "--shapes", "ops.csv", "--out", "afile/p.csv"),

    # ---- gpu transfer-bands (never without --out: the default is a shipped file)
    C("gpu-transfer-bands-h100-missing", "gpu", "transfer-bands", "--h100", "nope.yaml", "--out", "t.yaml"),
    C("gpu-transfer-bands-h100-unknown-top-key", "gpu", "transfer-bands", "--h100", "c_topkey.yaml",
      "--out", "t.yaml"),
    C("gpu-transfer-bands-a100-csv", "gpu", "transfer-bands", "--a100", "table.csv", "--out", "t.yaml"),
    # the three below measure the bands (H100 <-> A100 fits) before they look at --out: slow
    C("gpu-transfer-bands-out-under-file", "gpu", "transfer-bands", "--out", "afile/t.yaml", timeout=90),
    C("gpu-transfer-bands-out-is-dir", "gpu", "transfer-bands", "--out", "adir", timeout=90),
    C("gpu-transfer-bands-out-unwritable", "gpu", "transfer-bands", "--out", f"{PROC}/t.yaml", timeout=90),

    # ---- whatif
    C("whatif-steps-missing", "whatif", "--steps", "nope.jsonl", *M7, "--set", "hbm_bandwidth_tbs=4"),
    C("whatif-steps-is-dir", "whatif", "--steps", "adir", *M7, "--set", "hbm_bandwidth_tbs=4"),
    C("whatif-steps-empty", "whatif", "--steps", "empty.jsonl", *M7, "--set", "hbm_bandwidth_tbs=4"),
    C("whatif-coeffs-unknown-op-key", *WHATIF, "--coeffs", "c_opkey.yaml", "--set", "hbm_bandwidth_tbs=4"),
    C("whatif-set-unknown-field", *WHATIF, "--set", "bogus=1"),
    C("whatif-set-no-value", *WHATIF, "--set", "hbm_bandwidth_tbs"),
    C("whatif-set-not-a-number", *WHATIF, "--set", "hbm_bandwidth_tbs=fast"),
    C("whatif-set-negative", *WHATIF, "--set", "hbm_bandwidth_tbs=-1"),
    C("whatif-set-zero", *WHATIF, "--set", "sm_count=0"),
    C("whatif-set-nan", *WHATIF, "--set", "hbm_bandwidth_tbs=nan"),
    C("whatif-set-inf", *WHATIF, "--set", "bf16_tflops=inf"),
    C("whatif-tp-0", "whatif", "--steps", "steps.jsonl", "--model", "llama-2-7b-hf", "--gpu", "h100_sxm",
      "--tp", "0", "--set", "hbm_bandwidth_tbs=4"),
    C("whatif-model-unknown", "whatif", "--steps", "steps.jsonl", "--model", "no-such-model", "--gpu", "h100_sxm",
      "--tp", "1", "--set", "hbm_bandwidth_tbs=4"),
    C("whatif-out-under-file", *WHATIF, "--set", "hbm_bandwidth_tbs=4", "--out", "afile/w.csv"),
    C("whatif-out-is-dir", *WHATIF, "--set", "hbm_bandwidth_tbs=4", "--out", "adir"),
    C("whatif-out-unwritable", *WHATIF, "--set", "hbm_bandwidth_tbs=4", "--out", f"{PROC}/w.csv"),

    # ---- workload trace
    C("workload-trace-exp-missing", "workload", "trace", "nope", "--out", "tr"),
    C("workload-trace-exp-empty-dir", "workload", "trace", "adir", "--out", "tr"),
    C("workload-trace-exp-is-file", "workload", "trace", "afile", "--out", "tr"),
    C("workload-trace-exp-config-list", "workload", "trace", "exp_list", "--out", "tr"),
    C("workload-trace-exp-no-results", "workload", "trace", "exp_noresults", "--out", "tr"),
    C("workload-trace-defaults-missing", "workload", "trace", EXP, "--defaults", "nope.yaml", "--out", "tr"),
    C("workload-trace-model-configs-missing", "workload", "trace", EXP, "--model-configs", "nope", "--out", "tr"),
    C("workload-trace-out-is-file", "workload", "trace", EXP, "--out", "afile"),
    C("workload-trace-out-under-file", "workload", "trace", EXP, "--out", "afile/tr"),
    C("workload-trace-out-unwritable", "workload", "trace", EXP, "--out", f"{PROC}/tr"),
    C("workload-trace-out-one-output-is-dir", "workload", "trace", EXP, "--out", "tr_onebad"),

    # ---- workload validate (each would replay BLIS for seconds to minutes if it did not stop first)
    C("workload-validate-exp-missing", "workload", "validate", "nope", "--blis", BLIS),
    C("workload-validate-blis-missing", "workload", "validate", EXP, "--blis", "nope"),
    C("workload-validate-blis-not-executable", "workload", "validate", EXP, "--blis", "table.csv"),
    C("workload-validate-workers-0", *VAL, "--workers", "0"),
    C("workload-validate-timeout-0", *VAL, "--timeout", "0"),
    C("workload-validate-timeout-nan", *VAL, "--timeout", "nan"),
    C("workload-validate-coeffs-missing", *VAL, "--coeffs", "nope.yaml"),
    C("workload-validate-coeffs-unknown-top-key", *VAL, "--coeffs", "c_topkey.yaml"),
    C("workload-validate-samples-negative", *VAL, "--coeffs", "coeffs.yaml", "--samples", "-1", timeout=120),
    C("workload-validate-out-under-file", *VAL, "--out", "afile/v.csv"),
    C("workload-validate-out-is-dir", *VAL, "--out", "adir"),
    C("workload-validate-out-unwritable", *VAL, "--out", f"{PROC}/v.csv", timeout=120),
    C("workload-validate-keep-is-file", *VAL, "--keep", "afile"),
    C("workload-validate-kernels-unknown", *VAL, "--coeffs", "coeffs.yaml", "--kernels", "vllm-9.9.9", timeout=120),
    C("workload-saturation-coeffs-missing", *SAT, "--coeffs", "nope.yaml"),
    C("workload-saturation-kernels-unknown", *SAT, "--coeffs", "coeffs.yaml", "--kernels", "vllm-9.9.9"),
    C("workload-saturation-prompt-0", *SAT, "--coeffs", "coeffs.yaml", "--prompt", "0"),
    C("workload-saturation-cached-all", *SAT, "--coeffs", "coeffs.yaml", "--cached", "512"),
    C("workload-saturation-tp-0", "workload", "saturation", "--model", "llama-2-7b-hf", "--tp", "0", "--prompt",
      "512", "--output", "128", "--coeffs", "coeffs.yaml"),
    C("workload-saturation-model-unknown", "workload", "saturation", "--model", "no-such-model", "--tp", "1",
      "--prompt", "512", "--output", "128", "--coeffs", "coeffs.yaml"),
    C("workload-saturation-gpu-other", *SAT, "--coeffs", "coeffs.yaml", "--gpu", "a100_sxm"),
    C("workload-saturation-clock-unknown", *SAT, "--coeffs", "coeffs.yaml", "--clock", "turbo"),

    # ---- power fit (the GPU's power model on a sustained-load measurement)
    C("power-fit-coeffs-missing", "power", "fit", "--coeffs", "nope.yaml", "--out", "c.yaml"),
    C("power-fit-power-block-bad", "power", "fit", "--coeffs", "c_power.yaml", "--out", "c.yaml"),
    C("power-fit-sustained-missing", "power", "fit", "--coeffs", "coeffs.yaml", "--sustained", "nowhere",
      "--out", "c.yaml"),
    C("power-fit-sustained-empty", "power", "fit", "--coeffs", "coeffs.yaml", "--sustained", "adir", "--out", "c.yaml"),
    C("power-fit-sustained-is-file", "power", "fit", "--coeffs", "coeffs.yaml", "--sustained", "afile",
      "--out", "c.yaml"),
    C("power-fit-out-is-dir", "power", "fit", "--coeffs", "coeffs.yaml", "--out", "adir"),
    C("probe-run-out-is-file", "probe", "run", "--out", "afile"),
    C("probe-run-without-torch-or-gpu", "probe", "run", "--out", "probe_out"),
    C("probe-overlay-from-missing", "probe", "overlay", "--from", "nowhere", "--base", "h100_sxm", "--out", "o.yaml"),
    C("probe-overlay-base-unknown", "probe", "overlay", "--from", "adir", "--base", "h900", "--out", "o.yaml"),
    C("probe-overlay-from-empty", "probe", "overlay", "--from", "adir", "--base", "h100_sxm", "--out", "o.yaml"),
    C("predict-clock-unknown", "predict", "--steps", "steps.jsonl", *M7, "--clock", "turbo", "--out", "o.csv"),
    C("predict-datasheet-power-negative", "predict", "--steps", "steps.jsonl", "--model", "llama-2-7b-hf",
      "--tp", "1", "--gpu", "ds_power.yaml", "--out", "o.csv"),

    # ---- workload calibrate (never without --out or with the project's file: it writes in place)
    C("workload-calibrate-coeffs-missing", "workload", "calibrate", EXP, "--blis", BLIS, "--coeffs", "nope.yaml",
      "--out", "c.yaml"),
    C("workload-calibrate-coeffs-unknown-top-key-in-place", "workload", "calibrate", EXP, "--blis", BLIS,
      "--coeffs", "c_topkey.yaml"),
    C("workload-calibrate-exp-missing", "workload", "calibrate", "nope", "--blis", BLIS, "--coeffs", "coeffs.yaml",
      "--out", "c.yaml"),
    C("workload-calibrate-refreshes-negative", *CAL, "--refreshes", "-1", "--out", "c.yaml", timeout=120),
    C("workload-calibrate-samples-negative", *CAL, "--samples", "-1", "--out", "c.yaml", timeout=120),
    C("workload-calibrate-first-token-cycles-nan", *CAL, "--first-token-cycles", "nan", "--out", "c.yaml",
      timeout=120),
    C("workload-calibrate-holdout-unknown-model", *CAL, "--holdout", "no-such-model", "--out", "c.yaml",
      timeout=120),
    C("workload-calibrate-out-under-file", *CAL, "--out", "afile/c.yaml"),
    C("workload-calibrate-out-is-dir", *CAL, "--out", "adir"),
    # root passes os.access on /proc: the calibration runs (BLIS replays) before the write fails
    C("workload-calibrate-out-unwritable", *CAL, "--out", f"{PROC}/c.yaml", timeout=120),

    # ---- workload lomo
    C("workload-lomo-coeffs-missing", "workload", "lomo", EXP, "--blis", BLIS, "--coeffs", "nope.yaml"),
    C("workload-lomo-exp-missing", "workload", "lomo", "nope", "--blis", BLIS, "--coeffs", "coeffs.yaml"),
    C("workload-lomo-refreshes-0", *LOMO, "--refreshes", "0", "--out", "l.csv", timeout=120),
    C("workload-lomo-samples-negative", *LOMO, "--samples", "-1", "--out", "l.csv", timeout=120),
    C("workload-lomo-out-under-file", *LOMO, "--out", "afile/l.csv"),
    C("workload-lomo-out-is-dir", *LOMO, "--out", "adir"),
    C("workload-lomo-out-unwritable", *LOMO, "--out", f"{PROC}/l.csv", timeout=120),

    # ---- capacity
    C("capacity-tp-0", *CAP, "--tp", "0"),
    C("capacity-tp-negative", *CAP, "--tp", "-4"),
    C("capacity-tp-1000", *CAP, "--tp", "1000"),
    C("capacity-model-unknown", "capacity", "--model", "no-such-model", "--gpu", "h100_sxm", "--tp", "1"),
    C("capacity-model-is-dir", "capacity", "--model", "adir", "--gpu", "h100_sxm", "--tp", "1"),
    C("capacity-model-config-empty", "capacity", "--model", "cfg_empty.json", "--gpu", "h100_sxm", "--tp", "1"),
    C("capacity-gpu-unknown", "capacity", "--model", "llama-2-7b-hf", "--gpu", "z100", "--tp", "1"),
    C("capacity-gpu-datasheet-negative", "capacity", "--model", "llama-2-7b-hf", "--gpu", "ds_negative.yaml",
      "--tp", "1"),
    C("capacity-context-1e9-float-syntax", *CAP, "--tp", "1", "--context", "1e9"),
    C("capacity-context-1e9", *CAP, "--tp", "1", "--context", "1000000000"),
    C("capacity-context-0", *CAP, "--tp", "1", "--context", "0"),
    C("capacity-context-negative", *CAP, "--tp", "1", "--context", "-1"),
    C("capacity-gpu-memory-utilization-above-1", *CAP, "--tp", "1", "--gpu-memory-utilization", "1.5"),
    C("capacity-gpu-memory-utilization-0", *CAP, "--tp", "1", "--gpu-memory-utilization", "0"),
    C("capacity-gpu-memory-utilization-nan", *CAP, "--tp", "1", "--gpu-memory-utilization", "nan"),
    C("capacity-block-size-0", *CAP, "--tp", "1", "--block-size", "0"),
    C("capacity-kv-dtype-unknown", *CAP, "--tp", "1", "--kv-dtype", "fp3"),
    C("capacity-weight-dtype-unknown", *CAP, "--tp", "1", "--weight-dtype", "fp3"),
    C("capacity-max-num-seqs-0", *CAP, "--tp", "1", "--max-num-seqs", "0"),
    C("capacity-max-num-batched-tokens-negative", *CAP, "--tp", "1", "--max-num-batched-tokens", "-1"),

    # ---- traces read
    C("traces-read-missing", "traces", "read", "nope.json", "-q", "--out-steps", "s.jsonl"),
    C("traces-read-second-missing", *TREAD, "nope.json", "--out-steps", "s.jsonl"),
    C("traces-read-is-dir", "traces", "read", "adir", "-q", "--out-steps", "s.jsonl"),
    C("traces-read-empty", "traces", "read", "empty.json", "-q", "--out-steps", "s.jsonl"),
    C("traces-read-csv", "traces", "read", "table.csv", "-q", "--out-steps", "s.jsonl"),
    C("traces-read-json-not-otlp", "traces", "read", "not_otlp.json", "-q", "--out-steps", "s.jsonl"),
    C("traces-read-otlp-no-steps", "traces", "read", "otlp_no_steps.json", "-q", "--out-steps", "s.jsonl"),
    C("traces-read-not-otlp-with-progress-bar", "traces", "read", "not_otlp.json", "--out-steps", "s.jsonl"),
    C("traces-read-warmup-negative", *TREAD, "--warmup-steps", "-1", "--out-steps", "s.jsonl"),
    C("traces-read-max-preempted-0", *TREAD, "--max-preempted", "0", "--out-steps", "s.jsonl"),
    C("traces-read-out-steps-under-file", *TREAD, "--out-steps", "afile/s.jsonl"),
    C("traces-read-out-steps-is-dir", *TREAD, "--out-steps", "adir"),
    C("traces-read-out-steps-unwritable", *TREAD, "--out-steps", f"{PROC}/s.jsonl"),
    # several outputs, one bad: nothing at all may be written
    C("traces-read-out-requests-under-file", *TREAD, "--out-steps", "s.jsonl", "--out-requests", "afile/r.csv"),
    C("traces-read-out-requests-is-dir", *TREAD, "--out-steps", "s.jsonl", "--out-requests", "adir"),
    C("traces-read-out-requests-unwritable", *TREAD, "--out-steps", "s.jsonl", "--out-requests", f"{PROC}/r.csv"),
    C("traces-read-out-context-is-dir", *TREAD, "--out-steps", "s.jsonl", "--out-context", "adir"),
    C("traces-read-out-context-under-file", *TREAD, "--out-steps", "s.jsonl", "--out-context", "afile/c.csv"),
    C("traces-read-out-steps-is-the-trace", *TREAD, "--out-steps", "trace.json"),
    C("traces-read-out-context-is-the-trace", *TREAD, "--out-steps", "s.jsonl", "--out-context", "trace.json"),
    C("traces-read-context-and-requests-one-file", *TREAD, "--out-steps", "s.jsonl", "--out-context", "r.csv",
      "--out-requests", "r.csv"),
    C("traces-read-requests-is-derived-context", *TREAD, "--out-steps", "s.jsonl", "--out-requests",
      "s.context.csv"),
]

assert len({c.id for c in CASES}) == len(CASES), "duplicate case ids"


# ------------------------------------------------------------------------------------ harness

class CaseTimeout(BaseException):
    """Raised by the time guard (a BaseException: no ``except Exception`` in roofcal swallows it)."""


@contextmanager
def time_guard(seconds: float):
    def on_alarm(signum, frame):
        raise CaseTimeout(f"no error after {seconds:g} s: the command was still working")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Every case's inputs (:func:`make_inputs`), made once; each case works on a copy."""
    root = tmp_path_factory.mktemp("bad-input-inputs")
    make_inputs(root)
    return root


def fresh_copy(inputs: Path, dest: Path) -> dict:
    """``dest`` made a copy of ``inputs`` with an empty ``.tmp/``; its snapshot."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(inputs, dest)
    (dest / ".tmp").mkdir()
    return snapshot(dest)


@pytest.fixture(scope="module")
def copied(tmp_path_factory, inputs):
    """One copy of the inputs (43 MB) for the module's cases: [folder, its snapshot]. A case that
    leaves it as it found it (every case that passes: nothing written or changed) hands it on as
    it is; after any other the next case gets a fresh copy (:func:`workdir`)."""
    dest = tmp_path_factory.mktemp("bad-input-work") / "w"
    return [dest, fresh_copy(inputs, dest)]


@pytest.fixture
def workdir(copied, monkeypatch, inputs):
    """A copy of the inputs, as it was made, as the current folder and the temporary folder."""
    root, made = copied
    monkeypatch.chdir(root)
    monkeypatch.setenv("ROOFCAL_CACHE", "off")
    monkeypatch.setenv("COLUMNS", "100000")      # argparse's usage on one line
    monkeypatch.setenv("TMPDIR", str(root / ".tmp"))
    monkeypatch.delenv("ROOFCAL_BLIS", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(root / ".tmp"))
    yield root
    monkeypatch.undo()                           # out of the folder before it may be replaced
    if snapshot(root) != made:                   # the case wrote or changed something (and failed)
        copied[1] = fresh_copy(inputs, root)


def invoke(argv, timeout):
    """``main(argv)`` under the time guard: (return code or SystemExit code, was SystemExit, seconds)."""
    from roofcal.cli.main import main
    t0 = time.perf_counter()
    with time_guard(timeout):
        try:
            code, exited = main(list(argv)), False
        except SystemExit as e:
            code, exited = e.code, True
    return code, exited, time.perf_counter() - t0


def check_outcome(case, code, exited, seconds, err, before, after):
    """Assert the promise; the message says what broke it."""
    where = f"[{case.id}] roofcal {shlex.join(case.argv)} ({seconds:.1f} s)"
    lines = err.splitlines()
    assert "Traceback" not in err, f"{where}: traceback on stderr:\n{err}"
    if exited:
        assert code not in (0, None), f"{where}: SystemExit({code!r}) on bad input"
        assert lines and len(lines) <= 2 and ": error:" in lines[-1], \
            f"{where}: SystemExit({code!r}) without argparse's usage + error on stderr:\n{err}"
    else:
        assert isinstance(code, int) and code != 0, f"{where}: returned {code!r}: bad input accepted"
        assert code == 2, f"{where}: returned {code!r}, not 2"
        assert len(lines) == 1, f"{where}: stderr has {len(lines)} lines, not 1:\n{err}"
        assert lines[-1].startswith("roofcal: error:"), f"{where}: stderr is not 'roofcal: error: …':\n{err}"
    if case.says:
        assert re.search(case.says, lines[-1]), f"{where}: the error does not say /{case.says}/:\n{err}"
    assert after == before, f"{where}: files written or changed: {changes(before, after)}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, workdir, capsys):
    if case.needs_shared and not (Path(EXP).is_dir() and os.access(BLIS, os.X_OK)):
        pytest.skip(f"needs {SHARED} (experiment folders and the BLIS binary)")
    before = snapshot(workdir)
    capsys.readouterr()
    try:
        code, exited, seconds = invoke(case.argv, case.timeout)
    except CaseTimeout as e:
        pytest.fail(f"[{case.id}] roofcal {shlex.join(case.argv)}: {e}; files so far: "
                    f"{changes(before, snapshot(workdir))}")
    err = capsys.readouterr().err
    check_outcome(case, code, exited, seconds, err, before, snapshot(workdir))


# ------------------------------------------------------------------ end to end, as a user runs it

SUBPROCESS_CASES = ["predict-out-under-file", "predict-steps-is-dir", "capacity-tp-0", "gpu-show-csv",
                    "export-hardware-into-is-dir", "blis-check-goldens-csv", "residuals-out-is-file",
                    "traces-read-out-requests-under-file", "workload-trace-out-is-file"]


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_bad_input_subprocess(case_id, workdir):
    case = next(c for c in CASES if c.id == case_id)
    if case.needs_shared and not (Path(EXP).is_dir() and os.access(BLIS, os.X_OK)):
        pytest.skip(f"needs {SHARED}")
    before = snapshot(workdir)
    env = dict(os.environ, ROOFCAL_CACHE="off", JAX_PLATFORMS="cpu", COLUMNS="100000",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "roofcal.cli", *case.argv], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=case.timeout + 60)
    check_outcome(case, proc.returncode, False, time.perf_counter() - t0, proc.stderr, before,
                  snapshot(workdir))


def test_every_command_is_covered():
    """Every subcommand ``roofcal -h`` lists has at least one bad-input case."""
    import argparse
    from roofcal.cli.main import build_parser

    def leaves(parser, prefix=()):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield prefix
            return
        for name, p in subs[0].choices.items():
            yield from leaves(p, prefix + (name,))

    commands = set(leaves(build_parser()))
    covered = {cmd for cmd in commands for c in CASES if c.argv[:len(cmd)] == cmd}
    assert commands - covered == set(), f"commands without a bad-input case: {sorted(commands - covered)}"
    assert len(CASES) >= 110


def test_the_snapshot_sees_every_kind_of_write(tmp_path):
    """What ``check_outcome`` compares: a new file, an atomic replace and a write in place show,
    even when they write the bytes the file already held."""
    import time as _time
    (tmp_path / "a.yaml").write_text("x: 1\n")
    (tmp_path / "b.yaml").write_text("y: 2\n")
    before = snapshot(tmp_path)
    assert snapshot(tmp_path) == before                       # reading changes nothing
    _time.sleep(0.05)                                         # past the clock's tick
    tmp = tmp_path / ".a.tmp"
    tmp.write_text("x: 1\n")
    os.replace(tmp, tmp_path / "a.yaml")                      # atomic replace, same bytes
    with open(tmp_path / "b.yaml", "r+") as fh:               # in place, same bytes
        fh.write("y: 2\n")
    (tmp_path / "c.csv").write_text("")
    assert changes(before, snapshot(tmp_path)) == ["+ c.csv", "~ a.yaml", "~ b.yaml"]
