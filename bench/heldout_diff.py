"""Print the held-out MAPE (%) of every kernel and step set of two or more coefficient files side by
side, and the largest difference: ``python bench/heldout_diff.py A.yaml B.yaml [...]``.

Used to compare fits of the same data on different backends or machines (bench/gpu_fit.sh)."""

import sys

import yaml


def heldout(path: str) -> dict[str, float]:
    """{'<kernel set> <kind>' or '<kind>': held-out MAPE in %} of one coefficient file."""
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    out = {k: v["mape"] for k, v in (doc.get("metrics") or {}).get("heldout", {}).items()}
    for name, ks in (doc.get("kernel_sets") or {}).items():
        for k, v in (ks.get("metrics") or {}).get("heldout", {}).items():
            out[f"{name} {k}"] = v["mape"]
    return out


def main(paths: list[str]) -> None:
    runs = [heldout(p) for p in paths]
    keys = sorted(set().union(*runs))
    worst = 0.0
    for k in keys:
        vals = [r.get(k) for r in runs]
        line = " ".join(f"{v:8.3f}" if v is not None else "       -" for v in vals)
        if all(v is not None for v in vals):
            worst = max(worst, max(vals) - min(vals))
        print(f"{k:48s} {line}")
    print(f"largest spread: {worst:.3f} points over {len(keys)} sets")


if __name__ == "__main__":
    main(sys.argv[1:])
