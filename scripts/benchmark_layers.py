r"""A model's call with its layers scanned, unrolled over the stack and unstacked, against the
weight-read floor (specsamp/experiments/benchmarks/layer_layouts.py):

  python scripts/benchmark_layers.py --config=configs/code_pair.py --output=layers.json
  python scripts/benchmark_layers.py --config=configs/code_pair.py:large --models=target

Times the pair config's target and draft (random weights of their shapes: nothing trains or
loads) at batch 1 and each --tokens count, in rounds, medians. With --loops, the pair's own
autoregressive and speculative loops instead (its drafter, K = num_draft_tokens fixed, its
sampling settings and prompts; trained or loaded from --workdir), stacked and unstacked, the
four interleaved:

  python scripts/benchmark_layers.py --config=configs/smollm2_pair.py --loops \
      --config.sampling.temperature=0 --config.speculative.num_draft_tokens=4
"""

from absl import flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import layer_layouts
from specsamp.models.config import TransformerConfig

_CONFIG = cli.define_config("config", "configs/code_pair.py", "A pair config.")
_MODELS = flags.DEFINE_list("models", ["target", "draft"], "The pair's models to time.")
_TOKENS = flags.DEFINE_list("tokens", ["1", "5", "9"], "Tokens per call: a step, scoring K + 1.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved rounds (medians).")
_LOOPS = flags.DEFINE_bool("loops", False, "Time the pair's sampling loops in both layouts.")
_CALLS = flags.DEFINE_integer("calls", 16, "--loops: timed calls per loop (prompts cycled).")
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "--loops: the pair's cache (default workdir/<name>)."
)
_OUTPUT = flags.DEFINE_string("output", None, "Also write the result (JSON) here.")
cli.output_file(_OUTPUT)
flags.adopt_module_key_flags(cli)


def main(argv):
  cli.start(argv)
  config = _CONFIG.value
  log = lambda line: print(line, flush=True)
  if _LOOPS.value:
    result = layer_layouts.compare_loops(config, _WORKDIR.value, calls=_CALLS.value, log=log)
  else:
    models = {name: TransformerConfig.from_config(config[name].model) for name in _MODELS.value}
    tokens = [int(t) for t in _TOKENS.value]
    result = layer_layouts.compare(models, tokens, rounds=_ROUNDS.value, log=log)
  if _OUTPUT.value:
    files.write_json(_OUTPUT.value, result, indent=1)


if __name__ == "__main__":
  cli.run(main)
