r"""Trains a pair config's tokenizer, target and drafts (resuming), then reports each draft.

  python scripts/train.py --config=configs/code_pair.py --drafts=none,token
  python scripts/train.py --config=configs/code_pair.py:large --workdir=gs://bucket/pair \
      --config.mesh.data=4 --config.mesh.tensor=4
  python scripts/train.py --config=configs/code_pair.py --corpus='~/src/**/*.py' \
      --workdir=workdir/my_code --drafts=none,token,sequence

--drafts lists distillation modes, one draft each: 'none' (trained from scratch
on the corpus), 'token' (token-level KL to the target), 'sequence' (trained on
target samples). Progress lines show step, loss, tokens/s and ETA; Ctrl-C saves
a checkpoint and the next run resumes from it. At the end, each draft's
acceptance against the target on the held-out prompts is printed, greedy and at
temperature 1.
"""

from absl import flags

from specsamp.experiments import cli
from specsamp.experiments.jobs import drafter_specs, pair, sample_job

_PAIR = cli.define_pair_flags()
_DRAFTS = flags.DEFINE_list(
  "drafts",
  None,
  "Distillation modes to train drafts with "
  "(none, token, sequence); default the config's draft.train.distill.mode.",
)

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _PAIR.pair_config()
  sample_job.check_settings(config)  # K and the sampling settings the acceptance report uses.
  prepared = pair.prepare(config, _PAIR.workdir.value, draft_modes=_DRAFTS.value)
  num_draft_tokens, new = config.speculative.num_draft_tokens, config.sampling.max_new_tokens
  print(
    f"\nAcceptance on {len(prepared.prompts)} held-out prompts (K={num_draft_tokens}, "
    f"{new} new tokens):"
  )
  print(f"{'draft':>10} {'sampling':>12} {'accepted':>9} {'alpha':>7} {'tokens/call':>12}")
  for mode, draft in prepared.drafts.items():
    if mode == "parallel":  # Its placeholders drafting K tokens from one call.
      draft = drafter_specs.make(
        drafter_specs.DrafterSpec("parallel"),
        prepared,
        mask_token_id=config.draft.train.distill.mask_token,
      )
    for temperature in (0.0, 1.0):
      stats = pair.acceptance(
        prepared,
        draft,
        temperature=temperature,
        num_draft_tokens=num_draft_tokens,
        max_new_tokens=new,
        seed=config.seed,
      )
      label = "greedy" if temperature == 0 else f"T={temperature:g}"
      print(
        f"{mode:>10} {label:>12} {stats['acceptance_rate']:9.3f} {stats['alpha']:7.3f} "
        f"{stats['tokens_per_target_call']:12.2f}"
      )


if __name__ == "__main__":
  cli.run(main)
