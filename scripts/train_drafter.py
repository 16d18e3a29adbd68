r"""Trains a pair's drafter on the target's regenerated answers, keeping the best by tau
(specsamp/experiments/jobs/answer_training.py).

  python scripts/regenerate.py --config=configs/smollm2_pair.py --split=held_out --settings=greedy
  python scripts/regenerate.py --config=configs/smollm2_pair.py
  python scripts/train_drafter.py --config=configs/smollm2_pair.py
  python scripts/train_drafter.py --config=configs/smollm2_pair.py --config.answers.drafter=draft \
      --config.answers.train.steps=4000 --config.mesh.data=4 --config.mesh.fsdp=2

--config.answers.drafter picks the drafter: 'feature' (the feature head of config.feature.head),
'draft' (the model of config.draft.model), 'parallel' (a parallel draft of that shape, K
tokens from one call) or 'parallel_head' (the feature head as a parallel head). Reads
WORKDIR/regenerated/train (the shards there when it starts) and measures tau at each evaluation
on WORKDIR/regenerated/held_out; checkpoints go to WORKDIR/feature_head_answers,
WORKDIR/draft_answers, WORKDIR/parallel_answers or WORKDIR/parallel_head_answers (resumed from
the newest; Ctrl-C saves first) and the best evaluation's parameters to .../best, with
best.json. --ship_to=FOLDER then writes the best in bfloat16 with a card and SHA256SUMS (load
it with --config.feature.checkpoint=FOLDER, --config.draft.checkpoint=FOLDER,
--config.draft.parallel_checkpoint=FOLDER or --config.feature.parallel_checkpoint=FOLDER). On a
multi-host slice, start it on every host with --distributed (each host reads the same shards and
places its rows of each batch).
"""

import os

from absl import flags

from specsamp.experiments import cli
from specsamp.experiments.jobs import answer_training
from specsamp.experiments.jobs import pair as pair_lib

_PAIR = cli.define_pair_flags()
_STOP_AFTER = flags.DEFINE_integer(
  "stop_after", None, "Stop (with a checkpoint) after this many steps in this run."
)
_MAX_SECONDS = flags.DEFINE_float(
  "max_seconds",
  None,
  "Stop (with an evaluation and a checkpoint) after this many seconds of training.",
)
_SHIP_TO = flags.DEFINE_string(
  "ship_to", None, "Write the best drafter here (bfloat16, CARD.md, SHA256SUMS) when done."
)
_SHIP_ONLY = flags.DEFINE_bool(
  "ship_only", False, "Train nothing: ship the best evaluation so far (a stopped run's)."
)

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _PAIR.pair_config()
  workdir = os.path.abspath(_PAIR.workdir.value or pair_lib.default_workdir(config))
  drafter, directory, _ = answer_training.drafter_sections(config)
  ship_to = os.path.expanduser(_SHIP_TO.value) if _SHIP_TO.value else None
  if _SHIP_ONLY.value and not ship_to:
    raise ValueError("--ship_only ships the best so far: give --ship_to=FOLDER.")
  if ship_to:  # Refused now, not after the training.
    answer_training.check_ship_folder(ship_to)
  if not _SHIP_ONLY.value:  # Refused now, not after a first run's training or import.
    answer_training.check_optimisation(config, drafter)
    answer_training.check_answers_exist(config, workdir)
  # The target, once: training reads it, and shipping a head reads the head with it.
  prepared = None
  if not _SHIP_ONLY.value or drafter in answer_training.HEADS:
    prepared = pair_lib.prepare(config, workdir, drafts=False)
  if _SHIP_ONLY.value:
    best = answer_training.read_best(os.path.join(workdir, directory)) or {}
  else:
    best = answer_training.train_on_answers(
      config,
      workdir,
      stop_after=_STOP_AFTER.value,
      max_seconds=_MAX_SECONDS.value,
      prepared=prepared,
    )
  if best.get("step") is None:
    if _SHIP_ONLY.value:
      raise ValueError(
        f"--ship_only: {os.path.join(workdir, directory)} has no evaluation kept as best (no "
        f"{answer_training.BEST}/{answer_training.BEST_JSON}): nothing to ship. Train first, or "
        "check --config.answers.drafter."
      )
    print("no evaluation yet: nothing kept as best", flush=True)
    return
  acc = " ".join(f"{a:.2f}" for a in best["acc"])
  print(
    f"best: step {best['step']}, tau {best['tau']:.3f} (acc {acc}) after "
    f"{best['tokens_seen']:,} training tokens",
    flush=True,
  )
  if ship_to:
    answer_training.ship(
      os.path.join(workdir, directory, answer_training.BEST),
      ship_to,
      answer_training.card(config, workdir, best, drafter),
      target=prepared.target if drafter in answer_training.HEADS else None,
    )
    print(f"shipped to {ship_to}", flush=True)


if __name__ == "__main__":
  cli.run(main)
