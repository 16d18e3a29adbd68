#!/usr/bin/env bash
# The GPU benchmark in one call: the correctness gate, then everything timed, on the one
# accelerator of this machine (configs/device_benchmark.py; docs/benchmarks.md "On a GPU").
#
#   bash scripts/device_benchmark.sh        # on a lent machine: its tool's $OUT comes back
#   OUT=benchmark_results/device bash scripts/device_benchmark.sh    # a GPU of your own
#   bash scripts/device_benchmark.sh --tiny                          # tiny sizes, any CPU
#   bash scripts/device_benchmark.sh -- --config.sections=gate,shaped    # these, one process
#
# Writes $OUT/results.json and $OUT/log.txt and prints a table last. Packages missing from the
# machine travel as wheels in .wheels/ or .whl/ (e.g. ml-collections; the device README), and
# are installed into a temporary folder, never the system. On a GPU, alongside the benchmark,
# the exactness and loop tests run on the host's CPU cores with that machine's jax
# ($OUT/pytest.log): how a new jax release is checked before CI moves to it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmark_results/device}"
mkdir -p "$OUT"
CONFIG=configs/device_benchmark.py
if [[ "${1:-}" == "--tiny" ]]; then CONFIG=configs/device_benchmark.py:tiny; shift; fi
[[ "${1:-}" == "--" ]] && shift
# The sections timed after the gate's own process. Before scripts/device_answers.sh on the same
# 15 minutes, leave out the default pair and its peer (docs/training_on_answers.md section 10):
#   SPECSAMP_DEVICE_TESTS=0 TIMED_SECTIONS=bandwidth,warping,shaped bash scripts/device_benchmark.sh
TIMED_SECTIONS="${TIMED_SECTIONS:-bandwidth,warping,shaped,pairs,pair_peer}"

source scripts/device_wheels.sh
install_wheels /tmp/specsamp_site ml_collections || exit 2
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
# JAX takes half of the GPU's memory, so transformers (the peer) fits beside it.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.5}"

GPU=0
if [[ "$CONFIG" != *:tiny ]] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  GPU=1
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/log.txt"
fi
BENCH_CPUS=() TEST_CPUS=()
if [[ $GPU == 1 ]] && command -v taskset >/dev/null && (( $(nproc) >= 12 )); then
  BENCH_CPUS=(taskset -c 0-5) TEST_CPUS=(taskset -c "6-$(( $(nproc) - 1 ))")
fi
if [[ $GPU == 1 && "${SPECSAMP_DEVICE_TESTS:-1}" != 0 ]]; then
  # The exactness and loop tests on this machine's jax, on CPU cores the benchmark leaves
  # (SPECSAMP_DEVICE_TESTS=0 skips them).
  (JAX_PLATFORMS=cpu "${TEST_CPUS[@]}" timeout 420 python3 -m pytest -q -x -n 4 \
    -p no:cacheprovider tests/test_verification.py tests/test_speculative.py \
    tests/test_autoregressive.py tests/test_tree_verification.py tests/test_draws.py \
    tests/test_warping.py tests/test_tree.py tests/test_sampler.py tests/test_dynamic_tree.py \
    tests/test_feature_drafter.py >"$OUT/pytest.log" 2>&1; echo "pytest exit status $?" >>"$OUT/pytest.log") &
fi
bench() { "${BENCH_CPUS[@]}" python3 scripts/device_benchmark.py --config="$CONFIG" --out="$OUT" "$@"; }
if [[ " $* " == *" --config.sections="* ]]; then  # The sections the caller named, in one process.
  bench "$@" 2>&1 | tee -a "$OUT/log.txt"
  status=${PIPESTATUS[0]}
else
  # The gate in a process of its own, on a GPU with XLA's GEMM autotuning off: autotuning
  # decides speed, never results, and on an H200 the gate's loops took over 80 s, mostly
  # compiling. If this XLA does not take the flag, the gate runs again without it.
  GATE_FLAGS=""
  [[ $GPU == 1 ]] && GATE_FLAGS="--xla_gpu_autotune_level=0"
  if [[ -n "$GATE_FLAGS" ]]; then
    XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }$GATE_FLAGS" bench --config.sections=environment,gate \
      "$@" 2>&1 | tee -a "$OUT/log.txt"
  else
    bench --config.sections=environment,gate "$@" 2>&1 | tee -a "$OUT/log.txt"
  fi
  status=${PIPESTATUS[0]}
  if [[ $status != 0 && $status != 3 && -n "$GATE_FLAGS" ]]; then
    echo "the gate's process failed with $GATE_FLAGS: again without it" | tee -a "$OUT/log.txt"
    bench --config.sections=environment,gate "$@" 2>&1 | tee -a "$OUT/log.txt"
    status=${PIPESTATUS[0]}
  fi
  if [[ $status == 0 ]]; then  # 3: the gate failed, and nothing is timed.
    bench --append --config.sections="$TIMED_SECTIONS" "$@" \
      2>&1 | tee -a "$OUT/log.txt"
    status=${PIPESTATUS[0]}
  fi
fi
wait
if [[ -f "$OUT/pytest.log" ]]; then echo "tests on this machine's jax: $(tail -n 2 "$OUT/pytest.log" | tr '\n' ' ')"; fi
exit "$status"
