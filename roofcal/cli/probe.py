"""``roofcal probe``: measure a GPU's burst peaks, HBM bandwidth and its clock, power and step time
under a back-to-back load (:func:`roofcal.measurements.probe.run_probe`; a CUDA GPU and PyTorch,
``pip install -e '.[probe]'``), or turn such a measurement into a datasheet overlay
(:func:`roofcal.measurements.probe.write_overlay`; no GPU needed).

Examples::

    roofcal probe run --out probe-h100/                  # ~3 minutes on the GPU
    roofcal probe overlay --from data/sustained/h100_sxm --base h100_sxm --out h100-overlay.yaml
    roofcal power fit --coeffs coeffs/h100_sxm.yaml --gpu probe-h100/overlay.yaml --out mine.yaml
    roofcal predict --steps steps.jsonl --gpu probe-h100/overlay.yaml --coeffs mine.yaml --clock sustained ...

Read-only towards the GPU: it never changes clocks, power limits or any other setting.
"""

from __future__ import annotations


def cmd_run(a) -> None:
    from roofcal.measurements.probe import run_probe
    out = run_probe(a.out, model=a.model, base=a.base)
    print(f"wrote the measurement into {a.out} and its overlay {out}; next, the power model fitted on it:")
    for line in power_fit_commands(a.out, out):
        print(f"  {line}")


def power_fit_commands(folder, overlay) -> list[str]:
    """The commands that fit the power model on ``probe run``'s measurement, runnable as printed:
    the shipped coefficient file of the overlay's GPU (``coeffs/<gpu>.yaml``) if there is one, else
    its coefficients bootstrapped from the H100 fit first; written to ``<folder>-coeffs.yaml``
    beside the measurement folder."""
    import shlex
    from pathlib import Path

    from roofcal.cli.gpu import reference_coeffs
    from roofcal.physics.hardware import load_gpu
    from roofcal.resources import COEFFS, here
    folder = Path(folder)
    mine = shlex.quote(here(folder.parent / f"{folder.name}-coeffs.yaml"))
    gpu = shlex.quote(here(overlay))
    shipped = COEFFS / f"{load_gpu(str(overlay)).name}.yaml"
    if shipped.is_file():
        return [f"roofcal power fit --coeffs {shlex.quote(here(shipped))} --gpu {gpu} --out {mine}"]
    return [f"roofcal gpu bootstrap --datasheet {gpu} --from {shlex.quote(reference_coeffs())} --out {mine}",
            f"roofcal power fit --coeffs {mine} --gpu {gpu}"]


def cmd_overlay(a) -> None:
    from roofcal.measurements.probe import write_overlay
    from roofcal.physics.hardware import load_gpu
    load_gpu(a.base)                                   # a known datasheet, or a one-line error
    out = write_overlay(a.source, a.base, a.out)
    print(f"wrote {out}: {a.base} with the power limit and boost clock measured in {a.source}")


def register(sub) -> None:
    """Add ``probe run`` and ``probe overlay``."""
    p = sub.add_parser("probe", help="measure a GPU's peaks and its clock and power under load (read-only)")
    ps = p.add_subparsers(dest="probe_command", required=True)
    s = ps.add_parser("run", help="measure this machine's GPU (CUDA, PyTorch) into a folder with its overlay",
                      description="Time one model's layer GEMMs in bursts and back to back while nvidia-smi samples "
                                  "clock and power; 8192^3 GEMM and HBM-read peaks. Read-only towards the GPU.")
    s.add_argument("--out", required=True, metavar="DIR", help="folder to write the measurement into")
    s.add_argument("--model", default="qwen3-14b", help="dense model whose layer GEMMs to run (default qwen3-14b)")
    s.add_argument("--base", help="datasheet the overlay measures (default: the bundled one nvidia-smi's name aliases)")
    s.set_defaults(func=cmd_run, outputs=[("out", "dir", "measurement folder (--out)")])
    s = ps.add_parser("overlay", help="a measurement folder → a datasheet overlay (no GPU needed)",
                      description="Read a sustained-load measurement folder (roofcal probe run's, or "
                                  "data/sustained/h100_sxm) and write the datasheet overlay: the base datasheet "
                                  "with the measured power limit and boost clock, and what else was measured.")
    s.add_argument("--from", dest="source", required=True, metavar="DIR", help="measurement folder")
    s.add_argument("--base", required=True, help="bundled GPU name or datasheet path the overlay measures")
    s.add_argument("--out", metavar="FILE", help="overlay to write (default <DIR>/overlay.yaml)")
    s.set_defaults(func=cmd_overlay, outputs=[("out", "file", "overlay (--out)")])
