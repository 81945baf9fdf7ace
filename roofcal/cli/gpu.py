"""``roofcal gpu list|show|template|bootstrap|plan`` and ``roofcal whatif``: GPUs known by their datasheets.

* ``gpu list``: every bundled datasheet (dense peaks, bandwidths, SMs, balance point) and its
  sources.
* ``gpu show NAME|FILE.yaml``: one datasheet in full; a file is validated (missing fields and
  sparsity figures are refused with the field named; each optional field it leaves out is named
  on stderr with the default it takes). ``--yaml [--out FILE]``: the datasheet as the YAML file
  every ``--gpu`` / ``--datasheet`` reads back to the same GPU, each field's unit and meaning
  beside it (:func:`roofcal.physics.hardware.datasheet.datasheet_yaml`).
* ``gpu template NAME [--like REF] [--out FILE]``: a new GPU's blank datasheet: its name, empty
  ``sources``, every figure blank with its unit and meaning, REF's value beside it as a marked
  hint (:func:`roofcal.physics.hardware.datasheet.template_yaml`).
* ``gpu bootstrap --datasheet NAME|FILE.yaml --from REF.yaml --out NEW.yaml``: zero-shot
  coefficients for a new GPU (:mod:`roofcal.transfer.bootstrap`), marked ``calibrated: false``.
* ``gpu plan --gpu NAME|FILE.yaml --rows N --out plan.csv``: which shapes to time on a new GPU
  for a few-shot refit, N per kernel spread over its box of shapes
  (:func:`roofcal.transfer.design.plan`); a CSV whose ``latency_us`` the user fills in.
* ``whatif --steps S --set field=value ...``: step times before and after a datasheet change and
  the elasticity of each phase's time to every field (:mod:`roofcal.transfer.whatif`).
"""

from __future__ import annotations

from roofcal.resources import here

#: SI prefixes of the units in :data:`roofcal.physics.hardware.NUMERIC_FIELDS`
PREFIXES = {"1e12 ": "T", "1e9 ": "G"}


def shown_fields() -> dict:
    """{field: unit} of the numbers ``gpu show`` prints: the datasheet's numeric fields
    (:data:`roofcal.physics.hardware.NUMERIC_FIELDS`), units with SI prefixes (``1e12 B/s`` → ``TB/s``)."""
    from roofcal.physics.hardware import NUMERIC_FIELDS
    out = {}
    for f, unit in NUMERIC_FIELDS.items():
        for power, prefix in PREFIXES.items():
            unit = unit.replace(power, prefix)
        out[f] = unit
    return out


def gpu_rows(gpus) -> list[dict]:
    """One summary row per GPU for ``gpu list``."""
    return [{"name": g.name, "display name": g.display_name, "BF16 TFLOP/s": g.bf16_tflops,
             "FP8 TFLOP/s": g.fp8_tflops or "-", "HBM TB/s": g.hbm_bandwidth_tbs,
             "GiB": g.hbm_capacity_gib, "link": g.interconnect,
             "link GB/s": g.interconnect_bandwidth_gbs, "SMs": g.sm_count,
             "balance FLOP/B": g.balance_flops_per_byte} for g in gpus]


def list_text() -> str:
    """``roofcal gpu list``: the bundled datasheets and their sources."""
    from roofcal.physics.hardware import bundled_gpus
    from roofcal.tables import table
    gpus = bundled_gpus()
    rows = gpu_rows(gpus)
    lines = [table(rows, list(rows[0]), floats="{:g}"), "", "sources:"]
    for g in gpus:
        lines.append(f"  {g.name}:")
        lines += [f"    - {s}" for s in g.sources]
    return "\n".join(lines)


#: GPUSpec field → the datasheet key of :data:`~roofcal.physics.hardware.datasheet.OMITTED` that
#: says what its absence (0) means
ABSENT_KEY = {"fp16_tflops": "dense_tflops.fp16", "fp8_tflops": "dense_tflops.fp8",
              "int8_tops": "dense_tflops.int8", "fp4_tflops": "dense_tflops.fp4",
              "power_limit_w": "power_limit_w",
              "boost_clock_mhz": "boost_clock_mhz"}


def show_text(name: str) -> str:
    """``roofcal gpu show``: every field of one datasheet, with units and sources; a field it
    leaves out (0) says what it is taken as and what that changes."""
    from roofcal.physics.hardware import load_gpu
    from roofcal.physics.hardware.datasheet import OMITTED
    g = load_gpu(name)
    lines = [f"{g.name}: {g.display_name}"]
    if g.aliases:
        lines.append(f"  aliases: {', '.join(g.aliases)}")
    for f, unit in shown_fields().items():
        v = getattr(g, f)
        default, effect = OMITTED.get(ABSENT_KEY.get(f, ""), ("0", ""))
        shown = f"{v:g} {unit}" if v else f"- (absent: {effect})" if effect else "-"
        lines.append(f"  {f}: {shown}")
    lines.append(f"  interconnect: {g.interconnect} (link bandwidth per GPU, one direction)")
    lines.append(f"  balance point (BF16 / HBM): {g.balance_flops_per_byte:.1f} FLOP/byte")
    lines.append(f"  datasheet sha256: {g.sha256()}")
    lines.append("  sources:")
    lines += [f"    - {s}" for s in g.sources]
    return "\n".join(lines)


def template_command(like: str) -> str:
    """The ``gpu template`` command that writes a blank datasheet with ``like``'s figures as hints,
    as it runs: a new GPU named ``my_gpu`` (any name no bundled datasheet answers to), printed."""
    return f"roofcal gpu template my_gpu --like {like}"


def coeffs_beside(datasheet) -> str:
    """Where the hints put the coefficients bootstrapped for the datasheet file ``datasheet``:
    ``<its stem>_coeffs.yaml`` beside it (``my_gpu.yaml``: ``my_gpu_coeffs.yaml``)."""
    from pathlib import Path
    p = Path(str(datasheet))
    return str(p.with_name(f"{p.stem}_coeffs.yaml"))


def reference_coeffs() -> str:
    """The shipped H100 coefficient file, as :func:`~roofcal.resources.here` names it: the
    reference of a bootstrap."""
    from roofcal.resources import REFERENCE_COEFFS
    return here(REFERENCE_COEFFS)


def yaml_text(name: str) -> str:
    """``roofcal gpu show NAME --yaml``: the datasheet as the YAML file that every ``--gpu`` and
    ``--datasheet`` reads back to the same GPU (:func:`roofcal.physics.hardware.datasheet_yaml`),
    headed by how to make a new GPU's datasheet from it."""
    from roofcal.physics.hardware import datasheet_yaml, load_gpu
    g = load_gpu(name)
    return datasheet_yaml(g, header=(
        f"The {g.name} datasheet as roofcal reads it (roofcal gpu show {name} --yaml).\n"
        f"A new GPU's blank datasheet, these figures as hints: {template_command(g.name)}"))


def template_text(name: str, like: str) -> str:
    """``roofcal gpu template NAME --like REF``: a new GPU's blank datasheet
    (:func:`roofcal.physics.hardware.datasheet.template_yaml`), REF's figures as hints; refused
    for a name a bundled datasheet answers to (``gpu show NAME --yaml`` writes that one)."""
    from roofcal.errors import RoofcalError
    from roofcal.physics.hardware import bundled_gpus, gpu_key, load_gpu
    from roofcal.physics.hardware.datasheet import template_yaml
    for g in bundled_gpus():
        if gpu_key(name) in {gpu_key(g.name), *map(gpu_key, g.aliases)}:
            raise RoofcalError(f"gpu template: {name!r} names the bundled datasheet {g.name}; give "
                               f"the new GPU a name of its own (roofcal gpu show {g.name} --yaml: that one)")
    return template_yaml(name, load_gpu(like))


def gpu_argument(name: str) -> str:
    """How a later command names the GPU ``name`` (a bundled name, an alias or a datasheet path)
    given to this one: the path as given for a file, else the bundled datasheet's own name."""
    from pathlib import Path

    from roofcal.physics.hardware import load_gpu
    if str(name).endswith((".yaml", ".yml")) or Path(str(name)).is_file():
        return str(name)
    return load_gpu(name).name


#: the step the hints predict and its deployment, as the README's new-GPU section: its decode step,
#: a bundled model and TP
EXAMPLE_STEP = '{"prefill": [], "decode": [512, 1024, 1024, 4096]}'
EXAMPLE_DEPLOYMENT = ("llama-3.1-70b-instruct", 4)


def next_steps(datasheet: str, coeffs: str) -> list[str]:
    """The commands that follow a bootstrap (``roofcal gpu bootstrap`` prints them), each runnable
    as printed: a one-step file (:data:`EXAMPLE_STEP`) and its prediction with the new file for a
    bundled model (:data:`EXAMPLE_DEPLOYMENT`), then, where kernels measured on that GPU are
    bundled, the few-shot refit on them (else ``[]`` for it: the user's tables, which the caller
    says in words). Files are named after the coefficient file, beside it (``<stem>-steps.jsonl``,
    ``<stem>-pred.csv``: a plain ``pred.csv`` would replace the README's)."""
    import shlex
    from pathlib import Path

    from roofcal.measurements.datasets import BUNDLED
    from roofcal.physics.hardware import load_gpu
    gpu, c = shlex.quote(gpu_argument(datasheet)), shlex.quote(str(coeffs))
    steps = shlex.quote(str(Path(coeffs).with_name(f"{Path(coeffs).stem}-steps.jsonl")))
    pred = shlex.quote(str(Path(coeffs).with_name(f"{Path(coeffs).stem}-pred.csv")))
    model, tp = EXAMPLE_DEPLOYMENT
    out = [f"printf '%s\\n' {shlex.quote(EXAMPLE_STEP)} > {steps}",
           f"roofcal predict --gpu {gpu} --coeffs {c} --model {model} --tp {tp} --steps {steps} --out {pred}"]
    tables = [p for p in BUNDLED.get(load_gpu(datasheet).name, []) if "/microbench/" in p]
    if tables:
        from roofcal.resources import ROOT
        out.append(f"roofcal fit --gpu {gpu} --prior {c} --data "
                   + " ".join(shlex.quote(here(ROOT / p)) for p in tables))
    return out


def cmd_gpu_list(a) -> None:
    print(list_text())


def cmd_gpu_show(a) -> None:
    from roofcal.errors import RoofcalError
    if a.out and not a.yaml:
        raise RoofcalError("gpu show: --out writes the datasheet YAML; give --yaml too")
    if not a.yaml:
        print(show_text(a.name))
        return
    text = yaml_text(a.name)
    if not a.out:
        print(text, end="")
        return
    import shlex

    from roofcal.io import write_text_atomic
    write_text_atomic(a.out, text)
    name = gpu_argument(a.name)
    print(f"wrote {a.out} ({len(text.encode()):,} bytes): the {name} datasheet (a new GPU's blank one, "
          f"these figures as hints: {template_command(name)}); its coefficients from the H100 fit:")
    print(f"  roofcal gpu bootstrap --datasheet {shlex.quote(a.out)} --from "
          f"{shlex.quote(reference_coeffs())} --out {shlex.quote(coeffs_beside(a.out))}")


def cmd_gpu_template(a) -> None:
    text = template_text(a.name, a.like)
    if not a.out:
        print(text, end="")
        return
    import shlex

    from roofcal.io import write_text_atomic
    write_text_atomic(a.out, text)
    print(f"wrote {a.out}: a blank datasheet for {a.name}; fill in its figures and sources from the "
          f"spec sheet, check it, then bootstrap coefficients:")
    print(f"  roofcal gpu show {shlex.quote(a.out)}")
    print(f"  roofcal gpu bootstrap --datasheet {shlex.quote(a.out)} --from "
          f"{shlex.quote(reference_coeffs())} --out {shlex.quote(coeffs_beside(a.out))}")


def cmd_gpu_bootstrap(a) -> None:
    from roofcal.transfer.bootstrap import bootstrap_file
    c = bootstrap_file(a.from_, a.datasheet, a.out, ref_datasheet=a.from_datasheet, rule=a.rule)
    print(f"wrote {a.out}: zero-shot coefficients for {c.gpu} (calibrated: false), "
          f"{len(c.params['ops'])} kernel kinds/variants")
    for n in c.notes:
        print(f"  - {n}")
    import shlex
    lines = next_steps(a.datasheet, a.out)
    print("next, a step predicted with it, then a few-shot refit on kernels measured on the GPU:")
    for line in lines:
        print(f"  {line}")
    if not lines[-1].startswith("roofcal fit"):
        plan = plan_beside(a.out, c.kernels)
        gpu = shlex.quote(gpu_argument(a.datasheet))
        print(f"  roofcal gpu plan --gpu {gpu} --out {shlex.quote(plan)}")
        print(f"  (no kernels of {c.gpu} are bundled: time the planned shapes into its latency_us, or "
              f"give your own tables, docs/formats.md#per-op-measurements-csv; the refit is roofcal fit "
              f"--gpu {gpu} --prior {shlex.quote(a.out)} --data {shlex.quote(plan)})")


def plan_beside(coeffs, kernels: str) -> str:
    """Where the bootstrap's hint puts the plan of shapes to time: ``plan.csv`` in a folder named
    after the file's kernel library, beside the coefficient file (``vllm-0.24.0/plan.csv``), so the
    refit reads it as that kernel set; beside the file itself if its set has no such name."""
    from pathlib import Path

    from roofcal.measurements.ops import KERNEL_SET_NAME
    folder = Path(str(coeffs)).parent
    if kernels and KERNEL_SET_NAME.fullmatch(kernels):
        folder = folder / kernels
    return str(folder / "plan.csv")


def cmd_gpu_plan(a) -> None:
    import shlex

    from roofcal.errors import RoofcalError
    from roofcal.measurements.ops import kernel_set_of
    from roofcal.physics.hardware import load_gpu
    from roofcal.transfer.design import only_variants, plan, read_shapes, write_plan
    if a.rows < 1:
        raise RoofcalError(f"gpu plan: --rows must be at least 1, got {a.rows}")
    gpu = load_gpu(a.gpu)
    rows = plan(only_variants(read_shapes(a.shapes), a.variants), gpu, a.rows, a.seed)
    write_plan(rows, a.out)
    counts = (rows["op"] + "/" + rows["dtype"]).value_counts().sort_index()
    print(f"wrote {a.out}: {len(rows):,} shapes to time on {gpu.name}, spread over each kernel's box of shapes "
          f"({', '.join(f'{k} {v}' for k, v in counts.items())})")
    kset = kernel_set_of(a.out)
    print(f"read as kernel set {kset} (its folder's name)" if kset else
          "read as no kernel set: its folder is not named after a kernel library (vllm-0.24.0/), "
          "so a prior's kernels of a set are not matched to it")
    name, coeffs = gpu_argument(a.gpu), coeffs_beside(gpu_argument(a.gpu))
    print("fill latency_us with the measured µs; then the bootstrap and its refit on them:")
    print(f"  roofcal gpu bootstrap --datasheet {shlex.quote(name)} --from {shlex.quote(reference_coeffs())} "
          f"--out {shlex.quote(coeffs)}")
    print(f"  roofcal fit --gpu {shlex.quote(name)} --prior {shlex.quote(coeffs)} --data {shlex.quote(a.out)}")


def cmd_gpu_transfer_bands(a) -> None:
    from roofcal.transfer import bands
    doc = bands.measure(a.h100, a.a100)
    bands.write(doc, a.out)
    print(f"wrote {a.out}: 80 % zero-shot bands per kernel kind (H100 <-> A100, rule {doc['rule']})")
    for kind, b in doc["bands"].items():
        print(f"  {kind:13s} x{b['p10']:.3f} .. x{b['p90']:.3f}  ({b['n']} rows)")


def cmd_whatif(a) -> None:
    from roofcal.io import write_csv_atomic
    from roofcal.tables import table
    from roofcal.transfer.whatif import FIELDS, by_phase, describe, parse_changes, whatif
    changes = parse_changes(a.set)
    from roofcal.cli.main import parallel_of
    df = whatif(a.steps, coeffs=a.coeffs, model=a.model, gpu=a.gpu, tp=a.tp, changes=changes,
                rule=None if a.fixed_efficiency else a.rule, parallel=parallel_of(a))
    phases = by_phase(df)
    what = ", ".join(f"{k}={v:g}" for k, v in changes.items()) or "no change"
    how = "fixed in shape" if a.fixed_efficiency else f"carried by bootstrap rule '{a.rule}'"
    print(f"what-if: {what} (coefficients: {a.coeffs or 'neutral roofline'}; efficiency "
          f"surfaces {how})")
    times = phases.rename(columns={"before_us": "before µs (mean)", "after_us": "after µs (mean)",
                                   "change_pct": "change % (total)"})
    print(table(times.to_dict("records"), ["phase", "steps", "before µs (mean)", "after µs (mean)",
                                           "change % (total)"], floats="{:.1f}"))
    used = [f for f in FIELDS if phases[f"d_{f}"].abs().max() >= 5e-4]
    zero = [f for f in FIELDS if f not in used]
    print("\nelasticity ∂ log t / ∂ log field at the current datasheet (per phase, time-weighted):")
    el = phases.rename(columns={f"d_{f}": f for f in FIELDS}).rename(
        columns={"fixed_share": "fixed share"})
    print(table(el.to_dict("records"), ["phase"] + used + ["fixed share"], floats="{:.3f}"))
    if zero:
        print(f"elasticity 0 in every phase: {', '.join(zero)}")
    for line in describe(phases):
        print(line)
    if a.out:
        write_csv_atomic(df, a.out)
        print(f"wrote {len(df)} rows to {a.out}")


def register(sub) -> None:
    """Add ``gpu`` (list, show, template, bootstrap, plan, transfer-bands) and ``whatif`` to the ``roofcal`` subcommands."""
    from roofcal.transfer import DEFAULT_RULE, RULES
    g = sub.add_parser("gpu", help="GPU datasheets: list, show, a new GPU's template, bootstrap coefficients")
    gs = g.add_subparsers(dest="gpu_command", required=True)
    s = gs.add_parser("list", help="bundled datasheets with their sources")
    s.set_defaults(func=cmd_gpu_list)
    s = gs.add_parser("show", help="one datasheet in full (bundled name, alias or .yaml path), a "
                                   "file checked (a missing optional field: a warning naming its "
                                   "default); --yaml: as a datasheet file, units beside each field")
    s.add_argument("name")
    s.add_argument("--yaml", action="store_true",
                   help="print the datasheet as the YAML file roofcal reads (every --gpu and "
                        "--datasheet accepts it)")
    s.add_argument("--out", metavar="FILE", help="with --yaml: write it to FILE instead")
    s.set_defaults(func=cmd_gpu_show, outputs=[("out", "file", "datasheet file (--out)")])
    s = gs.add_parser("template", help="a new GPU's blank datasheet: its name, empty sources, each "
                                       "field's unit and meaning, a bundled GPU's values as hints")
    s.add_argument("name", help="the new GPU's name (letters, digits, _ . -)")
    s.add_argument("--like", default="h100_sxm", metavar="REF",
                   help="bundled GPU (or datasheet) whose values the comments give as hints of "
                        "scale (default h100_sxm)")
    s.add_argument("--out", metavar="FILE", help="write it to FILE instead of printing it")
    s.set_defaults(func=cmd_gpu_template, outputs=[("out", "file", "datasheet template (--out)")])
    s = gs.add_parser("bootstrap", help="zero-shot coefficients for a GPU from its datasheet")
    s.add_argument("--datasheet", required=True, help="new GPU: bundled name or datasheet .yaml")
    s.add_argument("--from", dest="from_", required=True, help="reference coefficient file")
    s.add_argument("--from-datasheet", help="datasheet of the reference GPU when not bundled")
    s.add_argument("--rule", default=DEFAULT_RULE, choices=RULES,
                   help=f"how efficiency surfaces transfer (default {DEFAULT_RULE}; see "
                        f"roofcal/transfer/bootstrap.py)")
    s.add_argument("--out", required=True, help="coefficient file to write")
    s.set_defaults(func=cmd_gpu_bootstrap, outputs=[("out", "file", "coefficient file (--out)")])
    s = gs.add_parser("plan", help="which shapes to time on a new GPU for a few-shot refit: N per "
                                   "kernel, spread over the box of shapes (a CSV to fill in)")
    s.add_argument("--gpu", required=True, help="the GPU to time them on: bundled name or datasheet .yaml")
    s.add_argument("--rows", type=int, default=300, help="shapes per kernel kind/variant (default 300)")
    s.add_argument("--shapes", nargs="+", metavar="D",
                   help="per-op tables or folders to choose shapes from (default: the bundled H100 "
                        "tables, the collector's and nccl-tests' sweeps)")
    s.add_argument("--variants", nargs="+", metavar="KIND/VARIANT",
                   help="only these kernels, e.g. gemm/bf16 attn_decode/bf16 (default: every one)")
    s.add_argument("--seed", type=int, default=0, help="chooses each kernel's first shape (default 0)")
    s.add_argument("--out", required=True, help="CSV to write (per-op interchange columns, latency_us empty)")
    s.set_defaults(func=cmd_gpu_plan, outputs=[("out", "file", "plan CSV (--out)")])
    from roofcal.resources import TRANSFER_BANDS
    s = gs.add_parser("transfer-bands", help="measure the zero-shot error bands bootstraps carry "
                                             "(H100 <-> A100 fits on the bundled per-op rows)")
    s.add_argument("--h100", help="H100 coefficient file (default coeffs/h100_sxm.yaml)")
    s.add_argument("--a100", help="A100 coefficient file (default coeffs/a100_sxm.yaml)")
    s.add_argument("--out", default=str(TRANSFER_BANDS),
                   help="file to write (default the shipped one, coeffs/transfer_bands.yaml)")
    s.set_defaults(func=cmd_gpu_transfer_bands, outputs=[("out", "file", "bands file (--out)")])

    s = sub.add_parser("whatif", help="step times on a changed datasheet, and sensitivities")
    s.add_argument("--steps", required=True, help="step JSONL file")
    s.add_argument("--coeffs", help="coefficient file (default: neutral roofline defaults)")
    s.add_argument("--model", help="bundled model name or config.json (for steps without one)")
    s.add_argument("--gpu", help="bundled GPU name or datasheet (for steps without one)")
    s.add_argument("--tp", type=int, help="tensor-parallel degree (for steps without one)")
    from roofcal.cli.main import add_parallel_options
    add_parallel_options(s)
    s.add_argument("--set", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
                   help="datasheet changes, e.g. hbm_bandwidth_tbs=4.8")
    s.add_argument("--rule", default=DEFAULT_RULE, choices=RULES,
                   help="how efficiency surfaces follow the datasheet (as gpu bootstrap)")
    s.add_argument("--fixed-efficiency", action="store_true",
                   help="keep efficiency surfaces fixed in shape whatever changes")
    s.add_argument("--out", help="per-step CSV (before, after, elasticities)")
    s.set_defaults(func=cmd_whatif, outputs=[("out", "file", "what-if CSV (--out)")])

