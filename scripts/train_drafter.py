r"""Trains a pair's draft on the target's regenerated answers, keeping the best by tau
(specsamp/experiments/jobs/answer_training.py).

  python scripts/regenerate.py --config=configs/smollm2_pair.py --split=held_out --settings=greedy
  python scripts/regenerate.py --config=configs/smollm2_pair.py
  python scripts/train_drafter.py --config=configs/smollm2_pair.py
  python scripts/train_drafter.py --config=configs/smollm2_pair.py \
      --config.answers.train.steps=4000 --config.mesh.data=4 --config.mesh.fsdp=2

Reads WORKDIR/regenerated/train (the shards there when it starts) and measures tau at each
evaluation on WORKDIR/regenerated/held_out; checkpoints go to WORKDIR/draft_answers (resumed
from the newest; Ctrl-C saves first) and the best evaluation's parameters to
WORKDIR/draft_answers/best, with best.json. On a multi-host slice, start it on every host with
--distributed (each host reads the same shards and places its rows of each batch).
"""

from absl import flags

from specsamp.experiments import cli
from specsamp.experiments.jobs import answer_training

_PAIR = cli.define_pair_flags()
_STOP_AFTER = flags.DEFINE_integer(
  "stop_after", None, "Stop (with a checkpoint) after this many steps in this run."
)

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _PAIR.pair_config()
  best = answer_training.train_draft(config, _PAIR.workdir.value, stop_after=_STOP_AFTER.value)
  if best.get("step") is None:
    print("no evaluation yet: nothing kept as best", flush=True)
  else:
    acc = " ".join(f"{a:.2f}" for a in best["acc"])
    print(
      f"best: step {best['step']}, tau {best['tau']:.3f} (acc {acc}) after "
      f"{best['tokens_seen']:,} training tokens",
      flush=True,
    )


if __name__ == "__main__":
  cli.run(main)
