"""``roofcal probe``: measure on a GPU what its datasheet does not say — the peaks it reaches in
bursts, the HBM bandwidth it achieves, and how its clock, power and step time settle under a
back-to-back load — and write them as a sustained-load measurement
(:mod:`roofcal.measurements.sustained`'s folder) with a datasheet overlay.

Read-only towards the GPU: it runs CUDA kernels through PyTorch (an optional dependency:
``pip install -e '.[probe]'``) and queries ``nvidia-smi --query-gpu`` — never a clock, power
limit, persistence or application-clock setting.

The timing path (:func:`run_probe`) needs a CUDA GPU and PyTorch. What turns a measurement folder
into datasheet fields (:func:`overlay_of`) needs neither, and is tested on the bundled H100
measurement.

Folder written by :func:`run_probe` (the same layout as ``data/sustained/h100_sxm``)::

    burst_gemm_<model>_tp1.csv   the model's layer GEMMs timed in bursts (per-op CSV, latency_us)
    sustained.json               phases replayed back to back (t_start, ms, duty, windows, first5)
    smi_trace.csv                nvidia-smi every 200 ms: timestamp, SM clock, memory clock, power, temperature
    burst_peaks.json             8192³ GEMM bf16 / fp8 TFLOP/s, HBM read TB/s, nvidia-smi's limits
    overlay.yaml                 the datasheet overlay (:func:`overlay_of`)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from roofcal.errors import RoofcalError

from roofcal.physics.hardware.datasheet import OVERLAY_SCHEMA  # noqa: E402  (a base datasheet + measured fields)
#: the phases a probe runs by default: (name, token counts of one step's GEMM stacks, seconds,
#: duty) — memory-bound, compute-bound, a mix, a full 8,192-token budget, and the same with idle
#: gaps (the H100 measurement's, shortened)
PHASES = (("m64", (64,), 20.0, 1.0), ("m1024", (1024,), 20.0, 1.0), ("mixed_2048_then_256", (2048, 256), 20.0, 1.0),
          ("m8192", (8192,), 25.0, 1.0), ("m8192_duty50", (8192,), 20.0, 0.5))
#: token counts of the burst table
BURST_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: nvidia-smi's read-only queries: the board's limits, and the trace's columns
SMI_LIMITS = "name,power.limit,power.default_limit,clocks.max.sm,clocks.max.mem"
SMI_TRACE = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu"


def overlay_of(folder, base: str) -> dict:
    """The datasheet overlay of a measurement folder: ``base`` (a bundled GPU name or datasheet
    path) with ``power_limit_w`` (nvidia-smi's ``power.limit`` when the probe recorded it, else
    the median power of the phases that sat at their limit — the plateau — rounded to the watt)
    and ``boost_clock_mhz`` (``clocks.max.sm``, else the highest SM clock sampled), the folder as
    ``sustained``, and what was measured (``measured``: burst peaks, HBM bandwidth, and per
    back-to-back phase the sustained step over its first steps')."""
    from roofcal.measurements.sustained import read_sustained
    folder = Path(folder)
    meas = read_sustained(folder)
    peaks = {}
    pk = folder / "burst_peaks.json"
    if pk.is_file():
        try:
            peaks = json.loads(pk.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise RoofcalError(f"{pk}: not JSON ({err})") from None
    limit = peaks.get("power_limit_w")
    how_limit = "nvidia-smi power.limit"
    if not _number(limit):
        capped = [p.power_w for p in meas.phases if p.duty >= 1.0 and math.isfinite(p.sm_clock_mhz)
                  and p.sm_clock_mhz < 0.97 * meas.max_clock_mhz and math.isfinite(p.power_w)]
        if not capped:
            raise RoofcalError(f"{folder}: no power limit recorded and no phase sat at one (every phase kept "
                               f"its maximum clock): run a longer or heavier phase, or give power_limit_w")
        limit, how_limit = float(round(np.median(capped))), "the plateau of the power-limited phases"
    boost = peaks.get("max_sm_clock_mhz")
    how_boost = "nvidia-smi clocks.max.sm"
    if not _number(boost):
        boost, how_boost = meas.max_clock_mhz, "the highest SM clock sampled"
    measured = {k: round(float(peaks[k]), 4) for k in ("bf16_tflops_8192", "fp8_tflops_8192", "read_tbs", "copy_tbs_rw")
                if _number(peaks.get(k))}
    measured["sustained_over_first_steps"] = {
        p.name: round(p.step_ms / p.first_ms, 4) for p in meas.phases
        if p.duty >= 1.0 and math.isfinite(p.first_ms) and p.first_ms > 0}
    return {"schema": OVERLAY_SCHEMA, "base": str(base), "power_limit_w": float(limit),
            "boost_clock_mhz": float(boost), "sustained": ".",
            "notes": [f"power_limit_w: {how_limit}; boost_clock_mhz: {how_boost}",
                      "measured: burst peaks in TFLOP/s and TB/s; sustained_over_first_steps: a phase's step "
                      "after 5 s over its first steps' (> 1: slower once the power limit binds)"],
            "measured": measured}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def write_overlay(folder, base: str, out=None) -> Path:
    """Write :func:`overlay_of` as ``out`` (default ``<folder>/overlay.yaml``), atomically."""
    from roofcal.io import write_text_atomic, yaml_text
    out = Path(out) if out else Path(folder) / "overlay.yaml"
    doc = overlay_of(folder, base)
    if out.resolve().parent != Path(folder).resolve():
        doc["sustained"] = str(Path(folder).resolve())
    write_text_atomic(out, yaml_text(doc, sort_keys=False, allow_unicode=True, width=100))
    return out


# --------------------------------------------------------------------------------------------
# the timing path: a CUDA GPU and PyTorch

def _smi(args: list) -> str:
    import subprocess
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise RoofcalError(f"nvidia-smi: {err}") from None


def _limits() -> dict:
    """nvidia-smi's read-only view of the board: name, power limit (W), maximum SM clock (MHz)."""
    first = _smi([f"--query-gpu={SMI_LIMITS}", "--format=csv,noheader,nounits"]).splitlines()[0]
    name, limit, default, sm, mem = [x.strip() for x in first.split(",")]
    num = lambda x: float(x) if x.replace(".", "", 1).isdigit() else math.nan   # noqa: E731
    return {"name": name, "power_limit_w": num(limit), "default_power_limit_w": num(default),
            "max_sm_clock_mhz": num(sm), "max_mem_clock_mhz": num(mem)}


def layer_gemms(model: str, tp: int = 1) -> list[tuple[str, int, int]]:
    """(projection, n, k) of one layer's dense GEMMs of a bundled model at TP ``tp``: fused QKV,
    O, fused gate/up, down (a dense model's; an MoE model's experts are not GEMMs here)."""
    from roofcal.physics.config import load_model
    s = load_model(model)
    if s.num_experts:
        raise RoofcalError(f"probe: model '{model}' is MoE; give a dense model (e.g. qwen3-14b)")
    d, hd = s.hidden, s.head_dim
    q, kv = s.num_heads // tp, max(1, s.num_kv_heads // tp)
    inter = s.intermediate // tp
    up = 2 * inter if s.gated_mlp else inter
    return [("qkv_proj", (q + 2 * kv) * hd, d), ("o_proj", d, q * hd), ("gate_up_proj", up, d),
            ("down_proj", d, inter)]


def run_probe(out, model: str = "qwen3-14b", phases=PHASES, burst_tokens=BURST_TOKENS, base: str | None = None,
              log=print) -> Path:  # pragma: no cover - needs a CUDA GPU
    """Measure the GPU of ``torch.cuda`` into the folder ``out`` (module docstring) and write its
    overlay; ``base``: the datasheet it overlays (default: the bundled one whose alias matches
    nvidia-smi's name)."""
    import subprocess
    import time

    try:
        import torch
    except ImportError:
        raise RoofcalError("probe: PyTorch is not installed (pip install -e '.[probe]')") from None
    if not torch.cuda.is_available():
        raise RoofcalError("probe: no CUDA GPU visible to PyTorch")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    limits = _limits()
    if base is None:
        from roofcal.physics.hardware import load_gpu
        try:
            base = load_gpu(limits["name"].lower().replace(" ", "-")).name
        except RoofcalError:
            raise RoofcalError(f"probe: no bundled datasheet for '{limits['name']}'; give --base DATASHEET") from None
    from roofcal.physics.config import load_model
    gemms = layer_gemms(model)
    layers = load_model(model).num_layers
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 * 2 ** 20)

    def timed_graph(fn, calls: int, replays: int = 5) -> float:
        """Median µs per call of ``fn`` captured ``calls`` times in one CUDA graph."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(0)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                fn(i)
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / calls)
        return float(np.median(times))

    # burst peaks
    log("probe: burst peaks")
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    us = timed_graph(lambda i: torch.matmul(x, w), 10)
    peaks = {"name": limits["name"], "sms": props.multi_processor_count, "mem_gb": props.total_memory / 2 ** 30,
             "torch": torch.__version__, "bf16_tflops_8192": 2 * 8192 ** 3 / us / 1e6, **limits}
    if hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
        try:
            x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)
            us8 = timed_graph(lambda i: torch._scaled_mm(x8, w8, scale_a=one, scale_b=one,
                                                          out_dtype=torch.bfloat16), 10)
            peaks["fp8_tflops_8192"] = 2 * 8192 ** 3 / us8 / 1e6
        except RuntimeError:
            pass                                  # no FP8 tensor cores
    big = torch.empty(2 ** 30, device=dev, dtype=torch.float32)       # 4 GiB
    us_read = timed_graph(lambda i: big.sum(), 3)
    peaks["read_tbs"] = big.numel() * 4 / us_read / 1e6
    big = x = w = None                            # free the GPU memory
    # the burst table: each GEMM over weight copies beyond 3x the L2, as inside a model
    log("probe: burst table")
    rows = []
    for m in burst_tokens:
        for proj, n, k in gemms:
            copies = max(2, math.ceil(3 * l2 / (n * k * 2)) + 1)
            ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
            xm = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ym = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            t = timed_graph(lambda i: torch.matmul(xm, ws[i % copies].t(), out=ym), max(copies, 4))
            rows.append(f"{base},gemm,bf16,{m},{n},{k},{t:.3f},cold,{proj}")
            ws = None
    (out / f"burst_gemm_{model}_tp1.csv").write_text("gpu,op,dtype,m,n,k,latency_us,mode,proj\n" + "\n".join(rows) + "\n")
    # sustained phases, nvidia-smi sampling beside them
    W = [[torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _, n, k in gemms] for _ in range(layers)]
    trace = open(out / "smi_trace.csv", "w")
    import os
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_TRACE}", "--format=csv,noheader", "-lms", "200"],
                           stdout=trace, stderr=subprocess.DEVNULL,
                           env={**os.environ, "TZ": "UTC"})     # timestamps in UTC, as the reader takes them
    res = {}
    try:
        for name, ms, seconds, duty in phases:
            log(f"probe: phase {name} ({seconds:g} s)")
            xs = {(m, k): torch.randn(m, k, device=dev, dtype=torch.bfloat16) for m in ms for _, _, k in gemms}
            ys = {(m, n): torch.empty(m, n, device=dev, dtype=torch.bfloat16) for m in ms for _, n, _ in gemms}

            def step():
                for lw in W:
                    for m in ms:
                        for (_, n, k), wt in zip(gemms, lw):
                            torch.matmul(xs[(m, k)], wt.t(), out=ys[(m, n)])
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            time.sleep(3.0)                          # rest: each phase starts from a cool, idle board
            t_start = time.time()
            steps = []
            while time.time() - t_start < seconds:
                evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(5)]
                for a, b in evs:
                    a.record()
                    g.replay()
                    b.record()
                    if duty < 1.0:
                        torch.cuda.synchronize()
                        time.sleep(a.elapsed_time(b) / 1e3 * (1.0 / duty - 1.0))
                torch.cuda.synchronize()
                now = time.time() - t_start
                steps += [(now, a.elapsed_time(b)) for a, b in evs]
            wins: dict = {}
            for t, v in steps:
                wins.setdefault(int(t // 5) * 5, []).append(v)
            flops = 2 * sum(ms) * sum(n * k for _, n, k in gemms) * layers
            res[name] = {"ms": list(ms), "flops": flops, "duty": duty, "t_start": t_start,
                         "windows": [{"t": t0, "n": len(v), "step_ms": round(float(np.median(v)), 3),
                                      "tflops": round(flops / float(np.median(v)) / 1e9, 1)} for t0, v in sorted(wins.items())],
                         "first5": [v for _, v in steps[:5]]}
            del g
    finally:
        smi.terminate()
        smi.wait()
        trace.close()
    (out / "sustained.json").write_text(json.dumps(res, indent=1))
    (out / "burst_peaks.json").write_text(json.dumps(peaks, indent=1))
    return write_overlay(out, base)
