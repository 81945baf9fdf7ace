"""How wrong a zero-shot GPU is, measured: the prediction bands of a bootstrapped file.

A bootstrap (:mod:`roofcal.transfer.bootstrap`) has no held-out rows of its own GPU, so its bands
come from the one measured case: the bundled H100 and A100 fits, each carried to the other GPU
with the default rule and scored on every per-op row of that GPU. Per kernel kind, the band is
symmetric in log space, ``[e^−a, e^a]`` with ``a`` the conformal 80 % quantile of
|log(measured / predicted)| over both directions — symmetric because the sign of a transfer's
bias depends on the pair of GPUs (A100 memory-bound kernels run slower than the bandwidth ratio
says, the H100's faster). Variants one GPU lacks (FP8 on the A100) are left out: their
prediction falls back to another variant and is flagged ``no_kernel_data`` instead.

``coeffs/transfer_bands.yaml`` holds the result with its provenance (``roofcal gpu
transfer-bands`` rewrites it); :func:`roofcal.transfer.bootstrap.bootstrap` joins each kernel's
own band with its kind's transfer band (:func:`roofcal.calibration.conformal.widen`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from roofcal import resources
from roofcal.errors import RoofcalError
from roofcal.io import read_yaml, sha256_file, write_text_atomic, yaml_text
from roofcal.model import correction as K
from roofcal.model.intervals import LEVEL, Band
from roofcal.physics.kernels import groups

#: the shipped transfer bands
DEFAULT_PATH = resources.TRANSFER_BANDS
SCHEMA = "roofcal-transfer-bands/1"


def symmetric_band(log_ratios, level: float = LEVEL) -> Band | None:
    """``[e^−a, e^a]`` with ``a`` the conformal ``level`` quantile of |log ratio| (rank
    ⌈(n + 1)·level⌉), or None with too few values."""
    a = np.sort(np.abs(np.asarray(log_ratios, np.float64)))
    k = int(math.ceil((len(a) + 1) * level - 1e-9))
    if len(a) == 0 or k > len(a):
        return None
    return Band(float(math.exp(-a[k - 1])), float(math.exp(a[k - 1])), len(a))


def transfer_residuals(ref, ref_gpu, new_gpu, table, rule: str | None = None) -> dict:
    """{kind: log(measured / predicted)} of every row of ``new_gpu``'s per-op ``table`` predicted
    by ``ref`` (fitted on ``ref_gpu``) bootstrapped to ``new_gpu``; variants ``ref`` lacks are
    skipped."""
    from roofcal.model.coeffs import roundtrip
    from roofcal.model.predict import predict_table
    from roofcal.transfer.bootstrap import DEFAULT_RULE, bootstrap
    c = roundtrip(bootstrap(ref, ref_gpu, new_gpu, rule or DEFAULT_RULE, transfer_bands=False))
    pred = predict_table(table, c.params, new_gpu)
    out: dict = {}
    for _, op, dt, idx in groups(pred):
        if K.op_key(op, dt) not in ref.params["ops"]:
            continue
        r = np.log(pred["latency_us"].values[idx] / pred["predicted_us"].values[idx])
        out.setdefault(op, []).append(r)
    return {k: np.concatenate(v) for k, v in out.items()}


def common_kernels(a, b) -> str:
    """The newest kernel set two coefficient files both have: GPU transfer is measured between
    the same kernel library on both GPUs, so a change of library does not pass for one of GPU."""
    from roofcal.model.coeffs import newest_kernel_set
    from roofcal.errors import RoofcalError
    both = set(a.kernel_sets) & set(b.kernel_sets)
    if not both:
        raise RoofcalError(f"{a.source} and {b.source} share no kernel set ({', '.join(a.kernel_sets)} vs "
                           f"{', '.join(b.kernel_sets)})")
    return newest_kernel_set(both)


def measure(h100_path=None, a100_path=None) -> dict:
    """The transfer-bands document: per kind, the symmetric band over both directions between
    the bundled H100 and A100 fits (``*_path``: their coefficient files, default the bundled
    ones), with the per-direction bands and provenance."""
    from roofcal.measurements.datasets import microbench_table
    from roofcal.model import coeffs as coeff_io
    from roofcal.physics.hardware import load_gpu
    from roofcal.transfer.bootstrap import DEFAULT_RULE
    H, A = load_gpu("h100_sxm"), load_gpu("a100_sxm")
    paths = {"h100_sxm": Path(h100_path or resources.COEFFS / "h100_sxm.yaml"),
             "a100_sxm": Path(a100_path or resources.COEFFS / "a100_sxm.yaml")}
    h, a = coeff_io.load(paths["h100_sxm"], H), coeff_io.load(paths["a100_sxm"], A)
    ks = common_kernels(h, a)
    h, a = coeff_io.with_kernels(h, ks), coeff_io.with_kernels(a, ks)
    res = {"a100_sxm <- h100_sxm": transfer_residuals(h, H, A, microbench_table(A.name, ks)),
           "h100_sxm <- a100_sxm": transfer_residuals(a, A, H, microbench_table(H.name, ks))}
    kinds = sorted(set().union(*res.values()))
    bands, per_dir = {}, {}
    for kind in kinds:
        both = np.concatenate([r[kind] for r in res.values() if kind in r])
        b = symmetric_band(both)
        if b is not None:
            bands[kind] = b.to_dict()
        per_dir[kind] = {d: symmetric_band(r[kind]).to_dict() for d, r in res.items()
                         if kind in r and symmetric_band(r[kind]) is not None}
    return {"schema": SCHEMA, "level": LEVEL, "rule": DEFAULT_RULE, "kernels": ks,
            "method": "symmetric conformal band of |log(measured/predicted)| of every per-op row "
                      "of one bundled GPU predicted by the other's fit bootstrapped to it, both "
                      "directions pooled; variants the reference lacks left out",
            "from": {g: {"file": resources.display(p), "sha256": sha256_file(p)} for g, p in paths.items()},
            "bands": bands, "per_direction": per_dir}


def write(doc: dict, out=DEFAULT_PATH) -> None:
    """Write a transfer-bands document as YAML, atomically."""
    header = ("# roofcal zero-shot transfer bands (roofcal/transfer/bands.py): how far a GPU's\n"
              "# bootstrapped predictions land from measurements, per kernel kind.\n")
    write_text_atomic(out, header + yaml_text(doc, sort_keys=False, width=100))


def load(path=DEFAULT_PATH) -> dict:
    """{kind: Band} of a transfer-bands file, validated."""
    doc = read_yaml(Path(path), "transfer-bands file")
    src = str(path)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise RoofcalError(f"{src}: field 'schema' must be {SCHEMA!r}")
    raw = doc.get("bands")
    if not isinstance(raw, dict):
        raise RoofcalError(f"{src}: field 'bands' must map kernel kinds to bands")
    out = {}
    for kind, b in raw.items():
        if kind not in K.OP_KINDS:
            raise RoofcalError(f"{src}: field 'bands.{kind}' is not a kernel kind ({', '.join(K.OP_KINDS)})")
        out[kind] = Band.from_dict(b, f"{src}: field 'bands.{kind}")
    return out


def source(path=DEFAULT_PATH) -> dict:
    """Provenance of a transfer-bands file for the files that use it."""
    return {"transfer_bands": resources.display(Path(path)), "sha256": sha256_file(path)}
