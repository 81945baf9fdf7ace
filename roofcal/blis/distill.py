"""Distillation into BLIS's basis: fit a BLIS-form file from a roofcal coefficient file (and/or
measured steps) and write it into a BLIS ``defaults.yaml``.

:func:`fit_form` samples steps for the deployments, predicts them with the calibrated native model
and fits BLIS's betas to them (:mod:`roofcal.blis.fit`); :func:`export_blis` rewrites the
coefficients of a ``defaults.yaml`` (:mod:`roofcal.blis.defaults_yaml`) with a provenance comment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from roofcal import __version__, resources
from roofcal.blis.defaults_yaml import (check_written, coefficient_spans, read_defaults_coefficients,
                                        read_text_exact, replace_coefficients)
from roofcal.blis.fit import (
    BETA_NAMES,
    BlisFitSettings,
    Deployment,
    build_rows,
    deployments_from_records,
    fit_blis,
    resolve_deployment,
    score_rows,
)
from roofcal.blis.form import (BLIS_FORM_SCHEMA, BlisForm, blis_flags, form_from_dict,
                               read_coefficient_doc, source_note, validate_export_coeffs)
from roofcal.blis.hardware_json import hardware_for_gpu
from roofcal.errors import RoofcalError
from roofcal.io import backup_path, file_record, sha256_file, write_bytes_atomic


def _coeff_step_data(c) -> tuple[list, list]:
    """Measured step files a coefficient file was fitted on, if still present and unchanged:
    (StepData list, provenance notes).

    Step JSONL rows without their own model / TP get the coefficient file's deployment when it
    records exactly one (``fit.deployments``); a file that still cannot be read is skipped with a
    note (it is only scored)."""
    from roofcal.measurements import datasets

    from roofcal.model.coeffs import stack_fitted_on
    recorded = c.fit.get("deployments")
    only = recorded[0] if isinstance(recorded, list) and len(recorded) == 1 and isinstance(recorded[0], dict) else {}
    steps, notes = [], []
    for rec in c.data:
        if not isinstance(rec, dict) or not str(rec.get("kind", "")).startswith("steps"):
            continue
        own = stack_fitted_on(c, rec.get("sha256"))
        if own is not None and own != c.stack:
            notes.append(f"{rec.get('path')}: not scored — its steps belong to serving stack '{own}', "
                         f"the export is of '{c.stack or 'none'}'")
            continue
        path = Path(rec.get("path", ""))
        path = path if path.is_absolute() else resources.ROOT / path
        if not path.is_file() or sha256_file(path) != rec.get("sha256"):
            notes.append(f"{rec.get('path')}: missing or changed since the fit; not scored")
            continue
        try:
            steps.extend(datasets.load([path], gpu=c.gpu, model=only.get("model"), tp=only.get("tp")).steps)
        except RoofcalError as err:
            notes.append(f"{rec.get('path')}: not scored ({err})")
            continue
        notes.append(f"{rec.get('path')}: scored with serving stack '{c.stack or 'none'}' (held-out "
                     "configurations as in the coefficient fit)")
    return steps, notes


def fit_form(coeffs_path: str | Path | None, defaults_path: str | Path = resources.BLIS_DEFAULTS,
             hardware_config: str | Path = resources.BLIS_HARDWARE, hardware: str | None = None,
             deployments: Sequence[Deployment] | None = None, steps_paths: Sequence[str | Path] = (),
             settings: BlisFitSettings = BlisFitSettings(), steps_gpu: str | None = None,
             stack: str | None = None, kernels: str | None = None) -> BlisForm:
    """Fit BLIS-form coefficients (see :mod:`roofcal.blis.fit`) from files.

    ``coeffs_path``: a roofcal coefficient file to distil (None: measured steps only), with its
    serving stack ``stack`` and kernel set ``kernels`` (:func:`roofcal.model.coeffs.resolve_stack`;
    default the file's own stack and that stack's kernel set);
    ``deployments``: what to distil for (default: the coefficient file's ``fit.deployments``);
    ``steps_paths``: measured whole-step files to fit as well. Alphas come from the stack when it
    was calibrated on serving runs (it records them), else they are kept from ``defaults_path``,
    whose betas also centre the prior. ``steps_gpu`` names the GPU of step JSONL rows that do not
    name one (default: the coefficient file's)."""
    from roofcal.model import coeffs as coeff_io
    from roofcal.measurements import datasets
    from roofcal.physics.hardware import load_gpu

    defaults_path, hardware_config = Path(defaults_path), Path(hardware_config)
    alpha, input_beta = read_defaults_coefficients(defaults_path)
    validate_export_coeffs(alpha, input_beta, f"{defaults_path}: trained_physics_coefficients")
    c = coeff_io.load(coeffs_path) if coeffs_path is not None else None
    if c is not None:
        c = coeff_io.resolve_stack(c, stack, required=True, kernels=kernels)
    gpu = load_gpu(c.gpu) if c is not None else None
    if c is not None:
        c.check_gpu(gpu)
        if steps_paths and steps_gpu is not None and load_gpu(steps_gpu).name != gpu.name:
            raise RoofcalError(f"--gpu {steps_gpu}: {c.source} is for GPU '{gpu.name}'; steps to fit must be on it")
    # datasets.load refuses steps on another GPU than the one named (the coefficient file's)
    loaded = datasets.load([Path(p) for p in steps_paths], gpu=c.gpu if c is not None else steps_gpu) \
        if steps_paths else None
    measured = loaded.steps if loaded is not None else []
    if steps_paths and not measured:
        raise RoofcalError(f"{', '.join(map(str, steps_paths))}: no whole-step measurements (per-op tables cannot fit BLIS betas)")
    if gpu is None:
        if not measured:
            raise RoofcalError("blis fit: give --coeffs FILE (distillation) and/or --steps FILE (measurements)")
        gpu = load_gpu(measured[0].gpu)
        other = [d for d in measured if d.gpu != gpu.name] if steps_gpu is None else []  # else the loader checked
        if other:
            raise RoofcalError(f"{other[0].source}: steps are for GPU '{other[0].gpu}', not '{gpu.name}'")
    hw_name, hw = hardware_for_gpu(hardware_config, gpu, hardware)

    method, resolved = [], []
    if c is not None and settings.samples > 0:
        if deployments:
            deps = list(deployments)
        else:
            recorded, where = default_deployments(c)
            if not recorded:
                raise RoofcalError(f"{c.source}: records no step deployments (fit.deployments); name the "
                                   "deployments to distil with --model M --tp T")
            deps = deployments_from_records(recorded, f"{c.source}: field '{where}'")
        resolved = [resolve_deployment(d, hw) for d in deps]
        method.append("distillation")
    if measured:
        method.append("measured")
    if not method:
        raise RoofcalError("blis fit: nothing to fit (distillation disabled with --samples 0 and no --steps)")
    holdout = float(c.fit.get("holdout", settings.holdout)) if c is not None else settings.holdout
    seed = int(c.fit.get("seed", settings.seed)) if c is not None else settings.seed
    params = c.params if c is not None else None
    scored, notes = (measured, []) if measured or c is None else _coeff_step_data(c)
    rows = build_rows(params, gpu, resolved, settings, scored, hw, measured_split=(holdout, seed))
    result = fit_blis([rows[s] for s in ("distill", "measured") if s in rows and (s != "measured" or measured)],
                      input_beta, settings)
    metrics = result.metrics
    if scored and not measured:  # the coefficient file's own measurements: scored, not fitted
        s = score_rows(rows["measured"], result.beta, input_beta)
        for split in metrics:
            metrics[split]["measured"] = s[split]
    # what the betas were fitted for: the distilled deployments, then the measured ones
    deps = [Deployment(r.spec.ref, r.deployment.tp, r.deployment.parallel) for r in resolved]
    deps += sorted({Deployment(d.model.ref, d.tp, d.model.parallel) for d in measured} - set(deps),
                   key=lambda d: (d.model, d.tp, d.label))
    provenance = {
        "method": " + ".join(method),
        "coeffs": None if c is None else {**file_record(Path(coeffs_path)), "gpu": c.gpu},
        "defaults": file_record(defaults_path),
        "hardware_config": file_record(hardware_config),
        "steps": loaded.provenance if loaded is not None else [],
        "scored_only": notes,
        "beta_kept_from_defaults": [BETA_NAMES[i] for i in result.kept],
        "rows": result.n_rows,
        "fit": settings.record(),
        "measured_split": {"holdout": holdout, "seed": seed},
    }
    alpha_source = f"kept from {resources.display(defaults_path)} (no request-level data)"
    st = c.stacks.get(c.stack) if c is not None and c.stack is not None else None
    if st is not None and stack_alphas_calibrated(st):
        alpha = [float(st.alphas_us[n]) for n in coeff_io.ALPHAS]
        how = "calibrated on serving runs" if str(st.source.get("kind", "")).startswith("workload") \
            else "measured from request journeys: " + ", ".join(st.source["alphas"]["measured"])
        ft = st.source.get("first_token") or {}
        if ft.get("cycles"):               # BLIS has no per-request step-time term: α0 carries it
            alpha[0] += float(ft["cycles"]) * float(ft["mean_cycle_us"])
            how += (f"; alpha0 includes a first-token delay of {ft['cycles']:g} x "
                    f"{float(ft['mean_cycle_us']):.0f} us, the mean cycle of the calibration runs")
        alpha_source = f"from serving stack '{c.stack}' ({how})"
    provenance["stack"] = c.stack if c is not None else None
    provenance["kernels"] = c.kernels if c is not None else None
    return BlisForm(tuple(alpha), tuple(result.beta), hw_name, hw, tuple(deps), alpha_source, provenance, metrics)


def default_deployments(c) -> tuple[list, str]:
    """(deployment records, the field they come from) to distil for when none are named: those
    of the serving runs the active stack was calibrated on (``stacks.<name>.source.deployments``),
    else those of the file's measured steps (``fit.deployments``)."""
    st = c.stacks.get(c.stack) if c.stack is not None else None
    recorded = (st.source.get("deployments") if st is not None else None) or []
    if recorded:
        return recorded, f"stacks.{c.stack}.source.deployments"
    return c.fit.get("deployments") or [], "fit.deployments"


def stack_alphas_calibrated(st) -> bool:
    """Whether a stack's alphas were fitted or measured on request-level data: a workload
    calibration, or a request table of traces (``roofcal fit --requests``)."""
    return str(st.source.get("kind", "")).startswith("workload") or \
        bool((st.source.get("alphas") or {}).get("measured"))


def _mape(metrics: dict, source: str, key: str) -> float | None:
    return metrics.get("heldout", {}).get(source, {}).get("all", {}).get(key)


def provenance_comment(form: BlisForm, form_path: str | Path | None = None) -> str:
    """One line for defaults.yaml: roofcal version, source file hashes, held-out errors."""
    p = form.provenance
    c = p.get("coeffs") or {}
    parts = [f"roofcal {__version__}: fitted in BLIS's basis by {p.get('method', 'unknown method')}"]
    if c:
        parts.append(source_note(c.get("path"), c.get("sha256"), p.get("kernels")))
    if form_path is not None:
        parts.append(f"via {resources.display(Path(form_path))} (sha256 {sha256_file(form_path)[:12]})")
    deps = ", ".join(f"{d.model} {d.title}" for d in form.deployments)
    parts.append(f"for {deps} on {form.hardware};")
    m = form.metrics
    held = []
    d = _mape(m, "distill", "blis_mape")
    if d is not None:
        held.append(f"{d:.1f}% vs native model (distillation)")
    b, n = _mape(m, "measured", "blis_mape"), _mape(m, "measured", "native_mape")
    if b is not None:
        held.append(f"{b:.1f}% on measured steps" + (f" (native {n:.1f}%)" if n is not None else ""))
    if held:
        parts.append("held-out MAPE " + ", ".join(held) + ";")
    parts.append("alphas " + (form.alpha_source or "from the BLIS-form file"))
    return " ".join(parts)


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_blis` did: the coefficients, output and backup paths (None when not
    written), the flags line and the provenance comment."""

    form: BlisForm
    out: Path | None
    backup: Path | None
    flags: str
    comment: str


def export_blis(coeffs_path: str | Path, defaults_path: str | Path, out: str | Path | None = None,
                in_place: bool = False, deployments: Sequence[Deployment] | None = None,
                hardware_config: str | Path = resources.BLIS_HARDWARE, hardware: str | None = None,
                settings: BlisFitSettings = BlisFitSettings(), stack: str | None = None,
                kernels: str | None = None) -> ExportResult:
    """Write ``defaults_path`` with BLIS-form betas to ``out`` (or in place, keeping a backup).

    ``coeffs_path`` is a roofcal coefficient file (betas fitted here by distillation for
    ``deployments``) or a BLIS-form file (used as is). Everything is validated before anything
    is written."""
    coeffs_path, defaults_path = Path(coeffs_path), Path(defaults_path)
    if in_place and out is not None:
        raise RoofcalError("export blis: give either --out FILE or --in-place, not both")
    target = defaults_path if in_place else (Path(out) if out is not None else None)
    if target is not None and not in_place and target.resolve() == defaults_path.resolve():
        raise RoofcalError(f"{target}: --out is the --defaults file; use --in-place to overwrite it (keeps a backup)")
    text = read_text_exact(defaults_path, "BLIS defaults file")
    coefficient_spans(text, str(defaults_path))  # refuse a bad defaults file before any fitting
    schema, doc = read_coefficient_doc(coeffs_path)
    if schema == BLIS_FORM_SCHEMA:
        if stack is not None or kernels is not None:
            raise RoofcalError(f"{coeffs_path}: a BLIS-form file has no serving stacks or kernel sets; --stack and "
                               "--kernels apply to a roofcal coefficient file")
        if deployments:
            raise RoofcalError(f"{coeffs_path}: a BLIS-form file is already fitted; --model/--tp apply to a roofcal coefficient file")
        form = form_from_dict(doc, str(coeffs_path))  # validated, coefficients included
        for d in form.deployments:
            resolve_deployment(d, form.hardware_calib, where=f"{coeffs_path}: deployment {d.model} tp {d.tp}")
        comment = provenance_comment(form, coeffs_path)
    else:
        form = fit_form(coeffs_path, defaults_path, hardware_config, hardware, deployments, (), settings,
                        stack=stack, kernels=kernels)
        validate_export_coeffs(form.alpha, form.beta, str(coeffs_path))
        comment = provenance_comment(form)
    new = replace_coefficients(text, form.alpha, form.beta, comment, str(defaults_path))
    check_written(new, form.alpha, form.beta, str(target or defaults_path))
    backup = None
    if target is not None:
        if in_place:
            backup = backup_path(defaults_path)
            write_bytes_atomic(backup, text.encode("utf-8"))
        write_bytes_atomic(target, new.encode("utf-8"))
    return ExportResult(form, target, backup, blis_flags(form.alpha, form.beta), comment)
