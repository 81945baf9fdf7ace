"""Plain-text tables for the terminal and Markdown reports."""

from __future__ import annotations


def count(n, unit: str) -> str:
    """``n`` with its unit, singular for one: ``count(1, "steps")`` → ``1 step``, ``3 steps``."""
    n = int(n)
    return f"{n} {unit[:-1] if n == 1 and unit.endswith('s') else unit}"


def table(rows: list[dict], columns: list[str], floats: str = "{:.2f}") -> str:
    """A Markdown table (also readable in a terminal) of ``rows`` restricted to ``columns``."""
    def cell(v):
        if isinstance(v, float):
            return floats.format(v)
        return "" if v is None else str(v)
    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(columns)]
    line = lambda cells: "| " + " | ".join(x.ljust(w) for x, w in zip(cells, widths)) + " |"
    out = [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(b) for b in body]
    return "\n".join(out)


def metrics_table(metrics: dict, kernel_sets: dict | None = None) -> str:
    """Held-out and train MAPE (and held-out p90, bias, n) per kernel and step phase; with
    ``kernel_sets`` ({set name: per-op metrics}), first each set's kernels, the set named."""
    rows = []
    parts = [(name, m) for name, m in (kernel_sets or {}).items()] + [("", metrics)]
    for name, m in parts:
        for key, h in m.get("heldout", {}).items():
            t = m.get("train", {}).get(key, {})
            rows.append({"kernels": name, "component": key, "held-out MAPE %": h.get("mape"),
                         "p90 %": h.get("p90"), "bias %": h.get("bias"), "n held out": h.get("n"),
                         "train MAPE %": t.get("mape"), "n train": t.get("n")})
    cols = ["component", "held-out MAPE %", "p90 %", "bias %", "n held out", "train MAPE %", "n train"]
    return table(rows, (["kernels"] if kernel_sets else []) + cols)
