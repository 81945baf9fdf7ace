#!/usr/bin/env bash
# The README's main job (`roofcal fit`) and the few-shot fit, timed on JAX's CUDA backend and on
# the same machine's CPU (all its cores, then 2), cold (empty compilation cache) and warm, then on
# the GPU with XLA's command buffers for while loops; each fit's held-out errors side by side, and
# whether two warm runs wrote the same bytes. Give it fresh cache folders (/tmp/cache_*).
# Run from the project's root on a machine with a CUDA GPU and jax[cuda]: bench/gpu_fit.sh
# Writes logs and coefficient files under $OUT (default /tmp/gpu_fit). Measured: docs/limits.md#fit-speed.
set -u
OUT=${OUT:-/tmp/gpu_fit}
mkdir -p "$OUT/o"
export PYTHONUNBUFFERED=1
FIT=(python3 -m roofcal.cli fit --quiet)
FEW=(--gpu a100_sxm --prior coeffs/a100_sxm.yaml --max-rows 50)

# one timed run: NAME then the command; prints NAME, exit status and wall seconds
timed() {
  local name=$1; shift
  local s=$EPOCHREALTIME
  "$@" >"$OUT/o/$name.log" 2>&1; local rc=$?
  printf '%-16s rc=%d %7.2f s\n' "$name" "$rc" "$(awk "BEGIN { print $EPOCHREALTIME - $s }")"
  [ "$rc" = 0 ] || tail -5 "$OUT/o/$name.log"
  return "$rc"
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
echo "cores: $(nproc)"
python3 -c "import jax, optax; print('jax', jax.__version__, 'optax', optax.__version__, jax.devices())"

# roofcal runs JAX on the CPU unless told otherwise, and asks for deterministic GPU programs
# (cli.main.jax_defaults); the measurement in docs/limits.md#fit-speed compares both, the
# non-deterministic one as XLA_FLAGS=--xla_gpu_deterministic_ops=false
gpu() { JAX_PLATFORMS=cuda ROOFCAL_CACHE=/tmp/cache_gpu "$@"; }
cpu() { JAX_PLATFORMS=cpu ROOFCAL_CACHE=/tmp/cache_cpu "$@"; }
two() { JAX_PLATFORMS=cpu ROOFCAL_CACHE=/tmp/cache_cpu taskset -c 0,1 "$@"; }

timed gpu_few_cold  gpu "${FIT[@]}" "${FEW[@]}" --out "$OUT/o/gpu_few.yaml" || exit 1
timed gpu_cold      gpu "${FIT[@]}" --out "$OUT/o/gpu_cold.yaml"
timed gpu_warm1     gpu "${FIT[@]}" --out "$OUT/o/gpu_warm1.yaml"
timed gpu_warm2     gpu "${FIT[@]}" --out "$OUT/o/gpu_warm2.yaml"
timed gpu_few_warm  gpu "${FIT[@]}" "${FEW[@]}" --out "$OUT/o/gpu_few2.yaml"
timed cpu_few_cold  cpu "${FIT[@]}" "${FEW[@]}" --out "$OUT/o/cpu_few.yaml"
timed cpu_cold      cpu "${FIT[@]}" --out "$OUT/o/cpu_cold.yaml"
timed cpu_warm1     cpu "${FIT[@]}" --out "$OUT/o/cpu_warm1.yaml"
timed cpu_warm2     cpu "${FIT[@]}" --out "$OUT/o/cpu_warm2.yaml"
timed cpu_few_warm  cpu "${FIT[@]}" "${FEW[@]}" --out "$OUT/o/cpu_few2.yaml"
timed cpu2_warm     two "${FIT[@]}" --out "$OUT/o/cpu2_warm.yaml"
timed cpu2_few_warm two "${FIT[@]}" "${FEW[@]}" --out "$OUT/o/cpu2_few.yaml"

# Last, as it may be refused: XLA's command buffers (CUDA graphs) for whole while loops, so that an
# L-BFGS block runs as one graph launch instead of one launch per fusion and one read-back of the
# loop's condition per turn (the GPU's ≈ 0.4 ms an iteration, docs/limits.md#fit-speed)
CMDBUF="--xla_gpu_deterministic_ops=true --xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
graphs() { JAX_PLATFORMS=cuda XLA_FLAGS="$CMDBUF" ROOFCAL_CACHE=/tmp/cache_graphs "$@"; }
timed graphs_cold   graphs "${FIT[@]}" --out "$OUT/o/graphs_cold.yaml"
timed graphs_warm   graphs "${FIT[@]}" --out "$OUT/o/graphs_warm.yaml"

cd "$OUT/o" || exit 1
for p in "gpu_warm1 gpu_warm2" "gpu_cold gpu_warm1" "cpu_warm1 cpu_warm2" "cpu_warm1 cpu2_warm" "gpu_few cpu_few" \
         "graphs_cold graphs_warm" "gpu_warm1 graphs_warm"; do
  set -- $p
  cmp -s "$1.yaml" "$2.yaml" && echo "same bytes: $1 $2" || echo "differ: $1 $2"
done
cd - >/dev/null
echo "held out (%): gpu_warm1 cpu_warm1"
python3 bench/heldout_diff.py "$OUT/o/gpu_warm1.yaml" "$OUT/o/cpu_warm1.yaml"
echo "few-shot held out (%): gpu cpu"
python3 bench/heldout_diff.py "$OUT/o/gpu_few.yaml" "$OUT/o/cpu_few.yaml" | tail -3
tar czf "$OUT/gpu_fit.tgz" -C "$OUT" o
