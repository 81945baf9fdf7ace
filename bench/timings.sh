#!/usr/bin/env bash
# How long the README's commands take for a newcomer: a fresh clone of this repository's last
# commit (with ../shared beside it, as CI has it); each command is run once with an empty home
# folder of its own, so nothing is cached (first run: JAX compiles, programs are cached there),
# then RUNS more times with that home (later runs). Prints a Markdown table (the first run, the
# median and range of the later runs; the machine's cores and its load, the 1-minute average read
# before the first command and after every run) for the README's "How long"; also written to OUT.
#
#   bench/timings.sh [RUNS=2] [OUT=bench/TIMINGS.md]    # about 20 min on 2 cores with RUNS=1
#   TIMINGS_LONG=1 bench/timings.sh                     # also workload validate (+3-15 min)
set -euo pipefail
RUNS=${1:-2}
OUT=$(realpath -m "${2:-bench/TIMINGS.md}")
REPO=$(cd "$(dirname "$0")/.." && pwd)
SHARED=$(realpath "$REPO/../shared")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/home" "$WORK/w"
ln -s "$SHARED" "$WORK/w/shared"
git clone -q "$REPO" "$WORK/w/roofcal"
cd "$WORK/w/roofcal"
export HOME="$WORK/home" PIP_RETRIES=0
# caches found through the home folder only (roofcal's and JAX's, matplotlib's, pip's)
unset XDG_CACHE_HOME ROOFCAL_CACHE ROOFCAL_PROGRAMS JAX_COMPILATION_CACHE_DIR MPLCONFIGDIR PIP_CACHE_DIR
load() { cut -d' ' -f1 /proc/loadavg; }
loads=("$(load)")

seconds() {   # seconds a command takes (its output to a log; a failure stops the script)
  local t0 t1
  t0=$(date +%s.%N)
  bash -c "$1" >>"$WORK/log" 2>&1 || { echo "failed: $1 (log: $(tail -5 "$WORK/log"))" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}

cat > steps.jsonl <<'EOF'
{"prefill": [[2048, 0]], "decode": []}
{"prefill": [], "decode": [512, 1024, 1024, 4096]}
{"prefill": [[512, 1536]], "decode": [100, 2000, 3000]}
EOF
install=$(seconds "python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[dev]' -c requirements-lock.txt")
. .venv/bin/activate
export ROOFCAL_BLIS="$SHARED/tools/blis"

declare -a NAMES=(
  "roofcal fit (the main job)"
  "the test command (quick tier)"
  "the slow tier"
  "roofcal predict (the README's 3 steps)"
  "roofcal export blis --out-dir for the 3 deployments"
)
declare -a CMDS=(
  "roofcal fit"
  "python -m pytest -q"
  "python -m pytest -q -m slow"
  "roofcal predict --model llama-3.1-70b-instruct --gpu h100_sxm --tp 4 --steps steps.jsonl --coeffs coeffs/h100_sxm.yaml --out pred.csv"
  "roofcal export blis --coeffs coeffs/h100_sxm.yaml --defaults data/blis/defaults.yaml --out-dir blis/ --for ../shared/workload/default_args"
)
if [[ -n "${TIMINGS_LONG:-}" ]]; then
  NAMES+=("roofcal workload validate of the 9 runs")
  CMDS+=("roofcal workload validate ../shared/workload/default_args --coeffs coeffs/h100_sxm.yaml")
fi

fmt() {   # "first | median (min–max) of later"
  python3 - "$@" <<'EOF'
import statistics, sys
first, *later = map(float, sys.argv[1:])
unit = (lambda s: f"{s:.1f} s") if max([first, *later]) < 120 else (lambda s: f"{s / 60:.1f} min")
rest = (f"{unit(statistics.median(later))} ({unit(min(later))}–{unit(max(later))}, {len(later)} runs)"
        if len(later) > 1 else f"{unit(later[0])} (1 run)" if later else "—")
print(f"{unit(first)} | {rest}")
EOF
}

rows=()
for i in "${!CMDS[@]}"; do
  export HOME="$WORK/home-$i"            # the first run of every command: an empty home, nothing cached
  mkdir -p "$HOME"
  times=()
  for ((r = 0; r <= RUNS; r++)); do
    times+=("$(seconds "${CMDS[$i]}")")
    loads+=("$(load)")
  done
  rows+=("| ${NAMES[$i]} | $(fmt "${times[@]}") |")
done
range=$(printf '%s\n' "${loads[@]}" | sort -g | sed -n '1p;$p' | paste -sd' ')
{
  echo "How long, measured by bench/timings.sh on $(date -u +%Y-%m-%d): $(nproc) cores, load" \
       "${range% *}–${range#* } (the 1-minute average before the first command and after each run);" \
       "a fresh clone, each command's first run with an empty home (install $(printf '%.0f' "$install") s)."
  echo
  echo "| command | first run (empty home, compiling) | later runs: median (range) |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
