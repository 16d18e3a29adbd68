r"""Has a pair's target answer a prompt set through its chat template: token shards for training
its drafters on the target's own text (specsamp/training/regenerate.py).

  python scripts/regenerate.py --config=configs/smollm2_pair.py
  python scripts/regenerate.py --config=configs/smollm2_pair.py --split=held_out
  python scripts/regenerate.py --config=configs/smollm2_pair.py --prompts=~/my_prompts.jsonl \
      --out=workdir/mine --settings=greedy --max_new_tokens=512 --batch_size=32

The prompts are the standard library's functions (explain / document / complete each) and
configs/prompts/chat.txt, or --prompts (JSONL: {"prompt": ...} or {"messages": [...]} per
line); HumanEval is never among them. About 2% of the prompts, by a hash of their id, form the
held-out split (--split=held_out), on which training measures tau. Shards go to --out (default
WORKDIR/regenerated/SPLIT) with a manifest; a stopped run (Ctrl-C, a lost machine) resumes
where it stopped when started again with the same flags (the batch size may change: a
larger machine answers more at once). --max_shards stops after that many new shards,
--max_seconds starts none after that many seconds.

A pair whose config names answers.shipped_dir (configs/smollm2_pair.py: the answers shipped in
specsamp/shipped/smollm2_answers) starts from the shards shipped there, so only the ones they
lack are answered; --ship_to merges what this run added back into such a folder:

  python scripts/regenerate.py --config=configs/smollm2_pair.py --max_seconds=3600 \
      --ship_to=specsamp/shipped/smollm2_answers/train
"""

import os

from absl import flags

from specsamp.experiments import cli
from specsamp.experiments.jobs import pair
from specsamp.training import instructions, regenerate

_PAIR = cli.define_pair_flags()
_OUT = flags.DEFINE_string("out", None, "Shard directory; default WORKDIR/regenerated/SPLIT.")
_PROMPTS = flags.DEFINE_string("prompts", None, "A JSONL prompt file instead of the default set.")
_SPLIT = flags.DEFINE_enum("split", "train", ["train", "held_out"], "Which prompts to answer.")
_SETTINGS = flags.DEFINE_list(
  "settings",
  ["greedy", "nucleus"],
  f"Sampling settings, alternating by shard: {regenerate.SETTINGS}",
)
_BATCH = flags.DEFINE_integer("batch_size", 64, "Prompts answered together.")
_MAX_PROMPT = flags.DEFINE_integer("max_prompt_tokens", 384, "Longer prompts are skipped.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256, "Answer tokens at most.")
_SHARD = flags.DEFINE_integer("shard_prompts", 128, "Prompts per shard.")
_MAX_SHARDS = flags.DEFINE_integer(
  "max_shards", None, "Stop after this many new shards.", lower_bound=0
)
_MAX_SECONDS = flags.DEFINE_float(
  "max_seconds",
  None,
  "Start no new shard after this many seconds (a lent machine's time).",
  lower_bound=0,
)
_WIDTH_STEP = flags.DEFINE_integer(
  "width_step",
  regenerate.WIDTH_STEP,
  "Pad each batch's prompts to a multiple of this many tokens (each width compiles once; on a "
  "GPU, --width_step=MAX_PROMPT_TOKENS compiles one).",
)
_PASSES = flags.DEFINE_integer(
  "passes",
  1,
  "Times the prompts are answered, each pass with the next setting (2 with greedy and nucleus: "
  "every prompt once each); a resumed run may ask for more.",
)
_COMPACT = flags.DEFINE_bool(
  "compact",
  True,
  "Once no prompt waits to refill the batch, finished rows leave it between chunks of steps "
  "(smaller batches, each a program to compile); --nocompact keeps the batch's size to the end "
  "(a GPU with minutes to run: one decode program). Waiting prompts refill the batch either "
  "way.",
)
_SEED = flags.DEFINE_integer("seed", 0, "Prompt order and sampling seed.")
_SEED_FROM = flags.DEFINE_string(
  "seed_from",
  None,
  "Shards to start from when --out has none, if this very run made them (default: the "
  "config's answers.shipped_dir/SPLIT, the answers shipped in the repository; '' for none).",
)
_SHIP_TO = flags.DEFINE_string(
  "ship_to",
  None,
  "Then merge every shard into this directory (e.g. specsamp/shipped/smollm2_answers/train: "
  "what the next checkout starts from).",
)
_MAX_PROMPTS = flags.DEFINE_integer(
  "max_prompts", 0, "Answer only the first this many prompts of the shuffled split (0: all)."
)

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _PAIR.pair_config()
  # The plan and the prompts first: a wrong plan or --prompts is refused before the pair is
  # trained or imported (minutes for a first run).
  plan = regenerate.Plan(
    settings=tuple(_SETTINGS.value),
    batch_size=_BATCH.value,
    max_prompt_tokens=_MAX_PROMPT.value,
    max_new_tokens=_MAX_NEW.value,
    shard_prompts=_SHARD.value,
    split=_SPLIT.value,
    seed=_SEED.value,
    max_prompts=_MAX_PROMPTS.value,
    passes=_PASSES.value,
  )
  if _WIDTH_STEP.value < 1:
    raise ValueError(f"--width_step must be >= 1 token, got {_WIDTH_STEP.value}.")
  prompts = (
    instructions.jsonl_prompts(os.path.expanduser(_PROMPTS.value))
    if _PROMPTS.value
    else instructions.default_prompts()
  )
  prepared = pair.prepare(config, _PAIR.workdir.value, drafts=False)
  workdir = os.path.abspath(_PAIR.workdir.value or pair.default_workdir(config))
  out = _OUT.value or os.path.join(workdir, "regenerated", _SPLIT.value)
  seed_dir = _SEED_FROM.value
  if seed_dir is None and config.answers.get("shipped_dir"):
    seed_dir = os.path.join(config.answers.shipped_dir, _SPLIT.value)
  ship_to = os.path.expanduser(_SHIP_TO.value) if _SHIP_TO.value else None
  target_id = config.target.get("gguf") or config.target.get("checkpoint") or "trained"
  try:
    manifest = regenerate.regenerate(
      prepared.target,
      prepared.tokenizer,
      prompts,
      out,
      plan,
      target_id=f"{target_id}:{prepared.target.config.num_layers}x{prepared.target.config.d_model}",
      max_shards=_MAX_SHARDS.value,
      max_seconds=_MAX_SECONDS.value,
      width_step=_WIDTH_STEP.value,
      seed_dir=seed_dir or None,
      compact=_COMPACT.value,
      merge_into=ship_to,
    )
  except KeyboardInterrupt:
    # The shards written are kept: merged before the stop (a Ctrl-C'd run merged nothing, and
    # the answers it had written waited in the workdir for a later run; 2026-11-30).
    if ship_to and regenerate.read_manifest(out) is not None:
      regenerate.merge(out, ship_to)
    raise
  if ship_to:
    regenerate.merge(out, ship_to)
  shards = manifest["shards"]
  answers = sum(s["answer_tokens"] for s in shards)
  repeated = regenerate.repetition(shards)
  print(
    f"{out}: {len(shards)} shards, {sum(s['prompts'] for s in shards):,} answers, "
    f"{answers:,} answer tokens ({manifest['prompts']:,} prompts in the {plan.split} split, "
    f"{manifest['skipped']} longer than {plan.max_prompt_tokens} tokens skipped)"
    + (
      f"; {repeated:.0%} of their {regenerate.REPEAT_NGRAM}-grams repeated"
      if repeated is not None
      else ""
    ),
    flush=True,
  )


if __name__ == "__main__":
  cli.run(main)
