r"""keras-hub's SpeculativeSampler vs specsamp's speculative sampling, same weights, for speed
and for exactness.

  pip install --no-deps keras==3.15.1 keras-hub==0.32.0 optree==0.20.0 namex==0.1.0
  python scripts/compare_keras_hub.py                       # both parts, about 10 minutes
  python scripts/compare_keras_hub.py --parts=exactness --exact_samples=1000000
  python scripts/compare_keras_hub.py --modes=greedy --batch_sizes=1

Speed: prepares (or loads) the Llama-architecture code pair (configs/code_pair.py:llama,
trained like the default pair), exports target and draft to the HF format, loads both in
keras-hub (JAX backend) and checks parity (logits within 1e-4); then for each mode (greedy;
T=0.8, top-p 0.95) and batch size times keras-hub autoregressive, keras-hub
SpeculativeSampler, specsamp autoregressive and specsamp speculative (K=4, compile
excluded and reported), with tokens/s, tokens per target call and the ratios.

Exactness: a tiny Llama pair (vocabulary 16) that both libraries load from one HF export;
--exact_samples 3-token continuations from each sampler at batch 1 and 8, G-tested against
the exact target distribution, with the mass drawn outside top-p; keras-hub's speculative
samples are also tested against the exact distribution of its own batch-1 rule.

Writes everything to --output (JSON) and the two tables to <output>.md.
"""

from absl import app, flags

from specsamp.experiments import cli
from specsamp.experiments.peers import compare_keras_hub
from specsamp.experiments.peers.compare_hf import MODES

_CONFIG = cli.define_config("config", "configs/code_pair.py:llama", "Pair config (Llama family).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoint cache; default workdir/<config name>.")
_PARTS = flags.DEFINE_list("parts", ["speed", "exactness"], "Any of speed, exactness.")
_MODES = flags.DEFINE_list("modes", ["greedy", "nucleus"], f"Any of {sorted(MODES)}.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes to time.")
_CALLS = flags.DEFINE_integer("calls", 8, "Timed calls per sampler, setting and round.")
_ROUNDS = flags.DEFINE_integer(
  "rounds", 3, "Interleaved timing rounds (every sampler once per round); tokens/s is their median."
)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", None, "Default: config.sampling.max_new_tokens.")
_K = flags.DEFINE_integer("num_draft_tokens", 4, "K, draft tokens per target call.")
_SAMPLES = flags.DEFINE_integer("exact_samples", 100_000, "Sequences per exactness case.")
_EXACT_SAMPLERS = flags.DEFINE_list(
  "exact_samplers", list(compare_keras_hub.EXACT_SAMPLERS), "Samplers the G-tests draw from."
)
_EXACT_WARPINGS = flags.DEFINE_list(
  "exact_warpings", list(compare_keras_hub.EXACT_WARPINGS), "Warpings of the G-tests."
)
_EXACT_BATCHES = flags.DEFINE_list("exact_batches", ["1", "8"], "Batch sizes of the G-tests.")
_LEVEL = flags.DEFINE_float("level", 1e-3, "Each G-test's false-rejection probability.")
_OUTPUT = flags.DEFINE_string(
  "output", None, "JSON results; default <workdir>/compare_keras_hub.json."
)

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  for name, values, known in (
    ("--parts", _PARTS.value, ("speed", "exactness")),
    ("--modes", _MODES.value, tuple(MODES)),
    ("--exact_samplers", _EXACT_SAMPLERS.value, compare_keras_hub.EXACT_SAMPLERS),
    ("--exact_warpings", _EXACT_WARPINGS.value, tuple(compare_keras_hub.EXACT_WARPINGS)),
  ):
    unknown = sorted(set(values) - set(known))
    if unknown:
      raise app.UsageError(f"Unknown {name} {unknown}; choose from {sorted(known)}.")
  try:
    batch_sizes = [int(b) for b in _BATCHES.value]
    exact_batches = [int(b) for b in _EXACT_BATCHES.value]
  except ValueError as error:
    raise app.UsageError(f"--batch_sizes and --exact_batches must be integers: {error}") from None
  if (
    any(b < 1 for b in batch_sizes + exact_batches)
    or _K.value < 1
    or _SAMPLES.value < 1
    or _CALLS.value < 1
  ):
    raise app.UsageError(
      "--batch_sizes, --num_draft_tokens, --calls, --rounds and --exact_samples must be >= 1."
    )
  config = _CONFIG.value
  workdir = _WORKDIR.value
  compare_keras_hub.run(
    config,
    workdir,
    parts=_PARTS.value,
    modes=_MODES.value,
    batch_sizes=batch_sizes,
    calls=_CALLS.value,
    rounds=_ROUNDS.value,
    num_draft_tokens=_K.value,
    max_new_tokens=_MAX_NEW.value or config.sampling.max_new_tokens,
    exact_samples=_SAMPLES.value,
    exact_samplers=_EXACT_SAMPLERS.value,
    exact_warpings=_EXACT_WARPINGS.value,
    exact_batches=exact_batches,
    level=_LEVEL.value,
    output=_OUTPUT.value,
  )


if __name__ == "__main__":
  cli.run(main)
