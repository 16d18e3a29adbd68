r"""How many tokens per target call a parallel drafter could reach: the target's own marginals.

  python scripts/parallel_bound.py --config=configs/code_pair.py
  python scripts/parallel_bound.py --config=configs/code_pair.py --ks=2,4,8 \
      --config.sampling.temperature=0.8 --config.sampling.top_p=0.95
  python scripts/parallel_bound.py --config=configs/smollm2_pair.py:smollm2 --ks=4
  python scripts/parallel_bound.py --config=configs/code_pair.py --ks=4,8 --trees=1x2x2,1x2x2x2

A parallel drafter fixes q_1 .. q_K before it draws, so q_k cannot see the drafts before it.
Trained with the target as teacher it tends to the target's marginal of each position; this
measures that drafter's tokens per target call at the config's sampling setting, on contexts
cut from the pair's validation files (the module docstring of
specsamp/experiments/benchmarks/parallel_bound.py has the math). A sequential drafter that
matches the target reaches K + 1; the gap is what parallel drafting loses by construction.
--trees measures the same drafter on trees of i.i.d. siblings (recursive rejection), which
hedge over the drafts a chain commits to.
Loads (or trains, on the first run) the pair's target only.
"""

import numpy as np
from absl import flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import parallel_bound
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.sampling import warping

_PAIR = cli.define_pair_flags()
_KS = flags.DEFINE_list("ks", ["2", "4", "8"], "Draft tokens per call (chains).")
_TREES = flags.DEFINE_list(
  "trees",
  [],
  "Trees as children per depth, e.g. 1x2x2x1: i.i.d. siblings from each depth's marginal, "
  "recursive rejection.",
)
_WINDOWS = flags.DEFINE_integer("windows", 16, "Validation windows contexts are cut from.")
_CUTS = flags.DEFINE_list("cuts", ["32", "64", "96", "128"], "Context lengths cut from each.")
_PATHS = flags.DEFINE_integer("paths", 64, "Target continuations the marginals average over.")
_CHAINS = flags.DEFINE_integer("chains", 64, "Draft chains verified per context.")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the results as JSON to this file.")
cli.output_file(_OUTPUT)

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _PAIR.pair_config()
  ks = [int(k) for k in _KS.value]
  cuts = sorted(int(c) for c in _CUTS.value)
  pair = pair_lib.prepare(config, _PAIR.workdir.value, drafts=False)
  windows = pair_lib.validation_windows(config, pair, _WINDOWS.value, max(cuts))
  contexts = [row[:cut].tolist() for row in np.asarray(windows) for cut in cuts]
  sampling = warping.SamplingConfig(
    config.sampling.temperature, top_k=config.sampling.top_k, top_p=config.sampling.top_p
  )
  print(
    f"the target-marginal parallel drafter, {sampling}, {len(contexts)} contexts of "
    f"{', '.join(map(str, cuts))} tokens, {_PATHS.value} target paths, {_CHAINS.value} chains",
    flush=True,
  )
  # (label, depth, widths): chains (widths None: coins integrated out), then trees.
  shapes = [(f"K={k}", k, None) for k in ks]
  for spec in _TREES.value:
    try:
      widths = tuple(int(w) for w in spec.split("x"))
    except ValueError:
      raise ValueError(f"--trees: {spec!r} is not children per depth like 1x2x2x1.") from None
    shapes.append((f"tree {spec} ({parallel_bound.tree_nodes(widths)} nodes)", len(widths), widths))
  results = []
  for label, depth, widths in shapes:
    result = parallel_bound.over_contexts(
      pair.target,
      contexts,
      depth,
      sampling,
      widths=widths,
      paths=_PATHS.value,
      chains=_CHAINS.value,
      seed=config.seed,
    )
    results.append(result)
    reached = " ".join(f"{a:.2f}" for a in result["accepted"])
    print(
      f"{label}: {result['tokens_per_call']:.2f} tokens per target call (se "
      f"{result['standard_error']:.2f}; a drafter that matches the target sequentially: "
      f"{depth + 1}); P(depth d reached), d=1..{depth}: {reached}",
      flush=True,
    )
  if _OUTPUT.value:
    files.write_json(
      _OUTPUT.value, {"sampling": str(sampling), "cuts": cuts, "results": results}, indent=1
    )


if __name__ == "__main__":
  cli.run(main)
