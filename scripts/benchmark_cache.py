r"""Autoregressive ms/token at one position with small and large allocated caches, the cache
read whole vs in live blocks (docs/benchmarks.md, "Reading only the live cache").

  python scripts/benchmark_cache.py                       # the default target, position 256
  python scripts/benchmark_cache.py --model=large --position=1024 --cache_lengths=2048,16384
"""

from absl import flags

from specsamp import files
from specsamp.experiments import cli, config_files
from specsamp.experiments.benchmarks import cache_reads
from specsamp.models.config import TransformerConfig

_MODEL = flags.DEFINE_enum("model", "cpu", ["cpu", "large"], "code_pair's target: cpu or large.")
_POSITION = flags.DEFINE_integer("position", 256, "Prompt length: where the steps decode.")
_NEW = flags.DEFINE_integer("new_tokens", 32, "Tokens generated per call.")
_CACHES = flags.DEFINE_list("cache_lengths", ["512", "8192"], "Allocated cache slots.")
_BLOCKS = flags.DEFINE_list("block_sizes", ["0", "256"], "attention_block_size (0: whole).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Interleaved repeats of every setting.")
_CALLS = flags.DEFINE_integer("calls", 4, "Timed calls per repeat.")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the rows as JSON here.")
cli.output_file(_OUTPUT)
flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  pair = config_files.load_module("configs/code_pair.py").get_config(
    None if _MODEL.value == "cpu" else "large"
  )
  rows = cache_reads.measure(
    TransformerConfig.from_config(pair.target.model),
    position=_POSITION.value,
    new_tokens=_NEW.value,
    cache_lengths=[int(n) for n in _CACHES.value],
    block_sizes=[int(n) for n in _BLOCKS.value],
    repeats=_REPEATS.value,
    calls=_CALLS.value,
  )
  if _OUTPUT.value:
    files.write_json(_OUTPUT.value, rows, indent=1)


if __name__ == "__main__":
  cli.run(main)
