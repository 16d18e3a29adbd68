"""The GPU benchmark (scripts/device_benchmark.sh): specsamp on one accelerator, in one call.

Launch (on a machine with one GPU; writes $OUT/results.json and prints a table last):
  bash scripts/device_benchmark.sh      # a lent machine: keep its $OUT, the folder that comes back
  OUT=benchmark_results/device bash scripts/device_benchmark.sh      # a GPU of your own
  bash scripts/device_benchmark.sh --tiny            # the same code at tiny sizes, on a CPU
  python scripts/device_benchmark.py --config=configs/device_benchmark.py \
      --config.sections=gate,bandwidth,shaped --out=/tmp/device

Arguments:
  (none)  the device run: the correctness gate, the copy bandwidth and the 8B's decode
          products against it, top-p warped over the most likely blocks first against the
          whole vocabulary (which an accelerator should run) and top-k, a token's draw by the
          flat race and in two stages, Llama-3.1-8B /
          Llama-3.2-1B shapes in bfloat16 (random weights) at synthetic acceptance 0.8, K = 4
          and 2, batch 1 and 8, the default pair trained there and sampled at T=0, T=1 and
          T=0.8 / top-p 0.95, and transformers on the trained pair. Sized for one call of
          about 8.5 minutes on an H100 or H200 (every section has its own time budget).
          Scanned vs unrolled vs unstacked layers, transformers on the 8B/1B weights and the
          large pair each run in a call of their own (commands below).
  tiny    the same sections at tiny sizes (shapes shrunk, the test pair), for the test suite
          and a CPU: about a minute on 2 cores.
"""

import ml_collections

from specsamp.experiments import config_files

code_pair = config_files.sibling(__file__, "code_pair")

VARIANTS = ("device", "tiny")


def _pair(variant, num_draft_tokens):
  """A code pair sampled with a fixed K (the peers and the sweep compare at equal K)."""
  pair = code_pair.get_config(variant)
  pair.speculative.draft_length = "fixed"
  pair.speculative.num_draft_tokens = num_draft_tokens
  return pair


def get_config(arg=None):
  variant = arg or "device"
  if variant not in VARIANTS:
    raise ValueError(f"configs/device_benchmark.py: unknown variant {arg!r}; use {VARIANTS}.")
  tiny = variant == "tiny"
  config = ml_collections.ConfigDict()
  # Sections, in order: environment, gate, bandwidth, warping, layers, shaped, shaped_peer,
  # pairs, pair_peer. 'layers' (scanned vs unrolled over the stack: equal on an H200;
  # unstacked, one array per layer, 1.3-1.8x faster than the scan on CPU: not yet timed on a
  # GPU) and 'shaped_peer' (the 8B export alone outlasts its budget) run only when named, each
  # in a call of its own:
  #   bash scripts/device_benchmark.sh -- --config.sections=environment,layers
  #   bash scripts/device_benchmark.sh -- --config.sections=environment,shaped_peer \
  #     --config.budgets.shaped_peer=400
  config.sections = "environment,gate,bandwidth,warping,shaped,pairs,pair_peer"
  config.workdir = "/tmp/specsamp_device"  # Trained pairs and exported HF models go here.
  config.stop_on_gate_failure = True  # Time nothing when the gate fails.
  # Seconds each section may take (0: no limit); a section past its budget stops, keeping the
  # rows it finished (a compile in progress finishes first). From the H200 runs of 2026-11-26
  # and -27: the gate took 57 s, the sweep's four default rows 190 s (before it timed the
  # draft passes too), the default pair's training 50 s before its sampling. The default
  # sections' budgets sum to 8.1 minutes; the two processes' start-up adds about half a minute.
  config.budgets = ml_collections.ConfigDict(
    dict(
      environment=10,
      gate=80,
      bandwidth=25,
      warping=30,
      layers=150,
      shaped=220,
      shaped_peer=75,
      pairs=95,
      pair_peer=25,
    )
  )
  config.unroll_margin = 0.05  # 'layers' unrolls a model only when its step is 5% faster.

  if tiny:  # A CPU compiles more slowly than it runs tiny models: no section is cut.
    config.budgets = ml_collections.ConfigDict(dict.fromkeys(config.budgets, 0))

  config.gate = ml_collections.ConfigDict()
  config.gate.num_samples = 20_000 if tiny else 100_000  # Draws of the certificate case.
  config.gate.level = 1e-4  # The G-test's false-rejection probability.
  config.gate.max_new_tokens = 16 if tiny else 32  # Greedy tokens per row compared.
  config.gate.batches = "ragged"  # '1': one prompt; 'ragged': four rows of lengths 1 to 7.

  config.bandwidth_bytes = (64 if tiny else 2048) * 2**20  # The copy probe's array.

  # Top-p and top-k on Zipf-like logits (warping_cost): SmolLM2's and Llama 3's vocabularies.
  config.warping = ml_collections.ConfigDict()
  config.warping.vocabs = "16384" if tiny else "49152,128256"
  config.warping.batch_sizes = "1,5" if tiny else "1,5,64"  # A step, a scoring call, a batch.
  config.warping.temperature = 0.8
  config.warping.top_p = 0.95
  config.warping.top_k = 50  # Top-k is timed beside them.
  # Drawing a token (draw_cost): the flat race against the two stages, at the default pair's and
  # SmolLM2's vocabularies (4 records; estimated at under 10 s on a GPU, not yet measured).
  config.warping.draw_vocabs = "1024" if tiny else "1024,49152"
  config.warping.draw_batch_sizes = "1,8"
  config.warping.draws_per_call = 4 if tiny else 100
  config.warping.zipf = 1.5  # The exponent: a nucleus of about 19 tokens at T = 0.8.
  config.warping.repeats = 5 if tiny else 21  # Timed calls of each way, interleaved.

  # Published shapes (configs/hf), random weights.
  config.shaped = ml_collections.ConfigDict()
  config.shaped.target_hf_config = "configs/hf/llama-3.1-8b/config.json"
  config.shaped.draft_hf_config = "configs/hf/llama-3.2-1b/config.json"
  config.shaped.tiny = tiny  # Shrink both to shaped_pair.TINY_SHAPES (architecture kept).
  config.shaped.dtype = "float32" if tiny else "bfloat16"  # Weights and activations.
  # Swept in this order, the goals' setting (batch 1, K=4, alpha 0.8) first.
  # The default fits its budget on an H200 (four rows in 190 s); alpha 0.6 and K=6 ran there
  # on 2026-11-26 and can be named: --config.shaped.alphas=0.8,0.6 --config.budgets.shaped=400.
  config.shaped.alphas = "0.8,0.6" if tiny else "0.8"  # Synthetic acceptance rates.
  config.shaped.num_draft_tokens = "4" if tiny else "4,2"  # K.
  config.shaped.batch_sizes = "1" if tiny else "1,8"  # Rows per call.
  config.shaped.prompt_tokens = 16 if tiny else 128  # Random prompt ids per row.
  config.shaped.max_new_tokens = 16 if tiny else 128  # Tokens generated per row.
  config.shaped.calls = 1 if tiny else 3  # Timed calls per setting, interleaved.
  config.shaped.seed = 0

  # transformers' assisted generation on the same weights (exported), batch 1, greedy.
  config.peer = ml_collections.ConfigDict()
  config.peer.num_draft_tokens = 4  # The same K on both sides.
  config.peer.num_prompts = 1 if tiny else 2
  config.peer.max_new_tokens = 8 if tiny else 48
  config.peer.pair_modes = "greedy" if tiny else "greedy,nucleus"  # On the trained pair.
  config.peer.pair_variants = "default"  # Which trained pairs the peer runs on.

  # Pairs trained on the device, then sampled by the sample job at each mode.
  config.pairs = ml_collections.ConfigDict()
  # 'large' does not fit the one call beside the rest: run it alone, e.g.
  #   bash scripts/device_benchmark.sh -- --config.sections=environment,pairs \
  #     --config.pairs.variants=large --config.budgets.pairs=420
  config.pairs.variants = "default"
  config.pairs.modes = "greedy" if tiny else "greedy,sample,nucleus"  # T=0, T=1, nucleus.
  config.pairs.default = _pair("test" if tiny else None, 4)
  config.pairs.large = _pair("test" if tiny else "large", 4)
  if not tiny:
    # The large pair at a step count that fits its budget on one GPU (the config's 20k target
    # steps take hours): the corpus capped so tokenizing it takes seconds.
    config.pairs.large.data.max_train_tokens = 10_000_000
    config.pairs.large.target.train.steps = 400
    config.pairs.large.draft.train.steps = 200
    for section in (config.pairs.large.target, config.pairs.large.draft):
      section.train.warmup_steps = 20
      section.train.log_every = 50
      section.train.eval_every = section.train.steps
      section.train.checkpoint_every = section.train.steps
    config.pairs.large.sampling.num_prompts = 8
  return config
