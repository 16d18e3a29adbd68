"""The default target/draft pair: code models trained on the Python standard library.

Launch (the README's main command; trains on the first run, then loads):
  python scripts/sample.py --config=configs/code_pair.py
  python scripts/train.py --config=configs/code_pair.py --drafts=none,token   # both drafts + report
  python scripts/sample.py --config=configs/code_pair.py:large --workdir=workdir/code_pair_large

Arguments:
  (none)  CPU-sized: both models train on a 2-core CPU in about three minutes.
          The target (6 x 384) is over-sized for its training budget on
          purpose: its decode step must cost many draft steps, as a 70B
          target does against a 4B draft, for speculation to pay off.
  large   a better pair for an accelerator or a long CPU run (12 x 768
          target, 2 x 768 draft, 2048 pieces, 20k target steps).
  llama   the default pair in the Llama architecture (SwiGLU MLP of 8/3 the
          width, so the parameter count stays), trained the same way: what
          scripts/compare_keras_hub.py loads into keras-hub's LlamaCausalLM.
  test    a micro pair the test suite trains in seconds.

The draft is wide and shallow (Chen et al. section 4): one layer, so a draft
step is cheap, distilled from the target with token-level KL by default.
"""

import ml_collections
from ml_collections.config_dict import placeholder

VARIANTS = ("cpu", "large", "llama", "test")


def _model(num_layers, d_model, num_heads, vocab_size):
  m = ml_collections.ConfigDict()
  m.vocab_size = vocab_size  # Equal to the tokenizer's pieces.
  m.num_layers = num_layers  # Transformer blocks.
  m.d_model = d_model  # Residual stream width.
  m.num_heads = num_heads  # Query heads.
  m.num_kv_heads = num_heads  # Key/value heads (equal: multi-head attention).
  m.head_dim = placeholder(int)  # None: d_model // num_heads.
  m.ffn_dim = 4 * d_model  # MLP hidden width.
  m.mlp_activation = "gelu"  # Plain GELU MLP, as Chinchilla.
  m.rope_theta = 10_000.0  # RoPE base frequency.
  m.norm_eps = 1e-6  # RMSNorm epsilon.
  m.norm_plus_one = False  # RMSNorm scale w, not 1 + w.
  m.qkv_bias = False  # No q/k/v biases.
  m.tie_embeddings = False  # Separate output head.
  m.scale_embeddings = False  # No sqrt(d_model) embedding scale.
  m.attn_logit_softcap = placeholder(float)  # No attention soft-cap.
  m.final_logit_softcap = placeholder(float)  # No output soft-cap.
  m.dtype = "float32"  # Activations (bfloat16 on accelerators for the large pair).
  m.param_dtype = "float32"  # Stored parameters.
  m.tensor_parallel = "auto"  # 'auto' (jit partitions) or 'shard_map'.
  m.scan_layers = True  # One lax.scan over the stacked layers (False: a Python loop).
  m.attention_block_size = 256  # Read the KV cache in blocks up to the live position; 0: all.
  # The rest of TransformerConfig, at its defaults (what the families of docs/hf.md set):
  m.gelu_approximate = True  # GELU's tanh form.
  m.query_pre_attn_scalar = placeholder(float)  # None: scores scaled by head_dim ** -0.5.
  m.post_norms = False  # No norms after attention and the MLP (Gemma 2/3 have them).
  m.sliding_window = placeholder(int)  # None: every layer attends to the whole cache.
  m.sliding_window_pattern = 1  # With a window: every N-th layer is global.
  m.qk_norm = False  # No RMSNorm on queries and keys (Qwen3, Gemma 3).
  m.rope_local_theta = placeholder(float)  # None: sliding layers use rope_theta.
  m.rope_scaling = "none"  # 'none', 'linear' or 'llama3'.
  m.rope_scaling_factor = 1.0
  m.rope_low_freq_factor = 1.0  # llama3 scaling only.
  m.rope_high_freq_factor = 4.0  # llama3 scaling only.
  m.rope_original_max_position = 8192  # llama3 scaling only.
  m.max_position = placeholder(int)  # The context it was made for (HF max_position_embeddings).
  m.num_experts = 0  # 0: a dense MLP; E: a mixture of E experts.
  m.experts_per_token = 0  # Experts each token is routed to (top-k).
  m.normalize_expert_weights = False  # Renormalise the top-k router weights.
  m.moe_compute = "sparse"  # 'sparse' (the experts tokens select) or 'dense' (all).
  return m


def _train(steps, batch_size, seq_len, learning_rate, distill_mode="none", ttt_steps=0):
  """An optimisation section; ``ttt_steps`` > 0 makes it a feature head's (training-time
  test, specsamp/training/feature_train.py)."""
  t = ml_collections.ConfigDict()
  t.steps = steps  # Optimizer steps.
  t.batch_size = batch_size  # Sequences per step (global, over all data-parallel devices).
  t.seq_len = seq_len  # Tokens per packed sequence.
  t.learning_rate = learning_rate  # Peak AdamW learning rate.
  t.warmup_steps = max(steps // 20, 1)  # Linear warmup, then cosine decay.
  t.end_learning_rate_fraction = 0.1  # Final learning rate over the peak.
  t.weight_decay = 0.1  # AdamW decay on matrices (not on norms).
  t.grad_clip = 1.0  # Global-norm gradient clipping.
  t.b1 = 0.9  # Adam beta1.
  t.b2 = 0.95  # Adam beta2.
  t.log_every = max(steps // 10, 1)  # Progress line period (steps).
  t.eval_every = max(steps // 2, 1)  # Validation loss period (and at the end).
  t.eval_batches = 4  # Validation batches per evaluation.
  t.checkpoint_every = max(steps // 4, 1)  # Checkpoint period (and at the end).
  t.keep_checkpoints = 2  # Checkpoints kept (the newest).
  t.distill = ml_collections.ConfigDict()
  t.distill.mode = distill_mode  # 'none' (corpus), 'token' (KL to target), 'sequence'.
  t.distill.temperature = 1.0  # Target (and draft) temperature in the distillation loss.
  t.distill.prefix_tokens = 16  # 'sequence': corpus tokens the target continues.
  # 'parallel' (a parallel draft, --config.speculative.drafter=parallel): draft positions each
  # call trains, their loss weights exp(-(k-1)/gamma), and the placeholder's id: the unknown
  # piece, which this byte-fallback tokenizer never emits.
  t.distill.parallel_tokens = 4
  t.distill.gamma = 4.0
  t.distill.mask_token = 1
  if ttt_steps:
    t.ttt_steps = ttt_steps  # Unrolled steps (EAGLE-3: 7), weighted ttt_decay ** k.
    t.ttt_decay = 0.8
  return t


def _target_widths(head):
  """A feature head's decoder layer at the target's widths (its heads, head size, MLP)."""
  head.num_heads = head.num_kv_heads = head.head_dim = head.ffn_dim = 0


def get_config(arg=None):
  variant = arg or "cpu"
  if variant not in VARIANTS:
    raise ValueError(f"configs/code_pair.py: unknown variant {arg!r}; use one of {VARIANTS}.")
  config = ml_collections.ConfigDict()
  config.name = f"code_pair_{variant}" if variant != "cpu" else "code_pair"  # Default workdir.
  # Training seed: initialisation, data order, the tokenizer's sample and the file split.
  config.seed = 0
  # Which checkpoint step a workdir stage or a checkpoint loads: 'latest', or 'latest_intact' (a
  # corrupt newest step is moved aside to <dir>.corrupt/<step> and the previous one is read).
  config.resume_from = "latest"

  config.data = ml_collections.ConfigDict()
  config.data.corpus = ""  # '' = this Python's standard library source; else comma-separated globs.
  config.data.validation_fraction = 0.04  # Files held out for the validation loss.
  config.data.prompt_fraction = 0.04  # Files held out for prompts (never trained on).
  config.data.max_train_tokens = 300_000  # Training stream cap (tokens): 2 epochs of the pair.
  config.data.max_eval_tokens = 50_000  # Validation stream cap (tokens).

  config.tokenizer = ml_collections.ConfigDict()
  config.tokenizer.path = ""  # An existing SentencePiece .model; '' trains one into the workdir.
  config.tokenizer.vocab_size = 1024  # Pieces (4 special + 256 bytes + merges).
  config.tokenizer.model_type = "bpe"  # 'bpe' trains in seconds; 'unigram' is slower.
  config.tokenizer.max_chars = 2_000_000  # Training text sampled for the tokenizer.

  vocab = config.tokenizer.vocab_size
  config.target = ml_collections.ConfigDict()
  # A specsamp checkpoint (e.g. from scripts/import_hf.py) to load instead of training; its
  # own metadata then gives the model, and `model` / `train` below are not used.
  config.target.checkpoint = ""
  config.target.model = _model(num_layers=6, d_model=384, num_heads=6, vocab_size=vocab)
  config.target.train = _train(steps=60, batch_size=16, seq_len=128, learning_rate=3e-3)
  config.draft = ml_collections.ConfigDict()
  config.draft.checkpoint = ""  # As target.checkpoint.
  # A parallel draft to load for --config.speculative.drafter=parallel instead of distilling one
  # (e.g. scripts/train_drafter.py --config.answers.drafter=parallel --ship_to=FOLDER).
  config.draft.parallel_checkpoint = ""
  config.draft.model = _model(num_layers=1, d_model=256, num_heads=4, vocab_size=vocab)
  # A sequential head over the parallel draft (--config.speculative.drafter=parallel_seq,
  # models/sequential_head.py): a GRU over the drafts lets q_k see x~_<k; trained on the frozen
  # parallel draft on the first run, KL to the target at num_draft_tokens positions.
  config.draft.sequential_head = ml_collections.ConfigDict()
  config.draft.sequential_head.steps = 300  # Optimizer steps.
  config.draft.sequential_head.batch_size = 16  # Sequences per step.
  config.draft.sequential_head.seq_len = 128  # Tokens per sequence.
  config.draft.sequential_head.learning_rate = 6e-3  # Peak AdamW learning rate.
  config.draft.sequential_head.num_draft_tokens = 4  # Draft positions trained.
  config.draft.sequential_head.checkpoint_every = 50  # A stopped run resumes from here.
  # 360 steps at 6e-3 (3-3.5 min on 2 cores): K=8 0.92 alpha, 6.1 tokens per target call and
  # 2.35-2.50x at T=1; 80 steps at 3e-3 (the first default): alpha 0.81, K=4 at most, 1.6-1.7x
  # (docs/benchmarks.md, "A better-trained draft and a longer K").
  config.draft.train = _train(
    steps=360, batch_size=16, seq_len=128, learning_rate=6e-3, distill_mode="token"
  )

  # The feature head (EAGLE-3 style, specsamp/models/feature_head.py): one decoder layer on the
  # target's own hidden features, trained on the frozen target with training-time test.
  config.feature = ml_collections.ConfigDict()
  config.feature.checkpoint = ""  # A trained head to load instead (its metadata gives the rest).
  config.feature.parallel_checkpoint = ""  # The same for the parallel head (parallel_head).
  config.feature.head = ml_collections.ConfigDict()
  # Target layers whose entering hidden states are fused (6: the last layer's output); ()
  # picks EAGLE-3's 2, N//2, N-3, which for this 6-layer target collapses to 2, 3.
  config.feature.head.feature_layers = (3, 6)
  # The decoder layer's widths (0 takes the target's). Narrower than the target's 6 heads and
  # 1536-wide MLP: a step then costs c = 0.044 of a target step (0.10-0.11 at the target's
  # widths) and still accepts 4.06 tokens per target call at T=1, K=4 (docs/benchmarks.md,
  # "A narrower head").
  config.feature.head.num_heads = 2
  config.feature.head.num_kv_heads = 2
  config.feature.head.head_dim = 0
  config.feature.head.ffn_dim = 512
  config.feature.head.draft_vocab_size = 0  # 0 shares the target's head; V_d: its own head.
  # 480 steps of 16 x 128 tokens: 5 min 20 s on 2 CPU cores, 4.03 tokens per target call at
  # T=1, K=4 (80 steps: 1.5 min, 2.88; 240 steps: 3.85; docs/benchmarks.md "The feature head").
  config.feature.train = _train(
    steps=480, batch_size=16, seq_len=128, learning_rate=6e-3, distill_mode="token", ttt_steps=3
  )
  # Train on the target's own samples instead of the corpus (specsamp/training/
  # target_samples.py): num_sequences corpus prompts of prompt_tokens, each continued by the
  # target with new_tokens at temperature. 0 sequences: the corpus itself.
  config.feature.target_samples = ml_collections.ConfigDict()
  config.feature.target_samples.num_sequences = 0
  config.feature.target_samples.prompt_tokens = 32
  config.feature.target_samples.new_tokens = 96
  config.feature.target_samples.temperature = 1.0
  config.feature.target_samples.batch_size = 16

  # The draft trained on the target's own answers (scripts/regenerate.py writes them,
  # scripts/train_drafter.py trains; specsamp/experiments/jobs/answer_training.py): shard
  # directories in the workdir, the run's directory, tau's draft length, the optimisation
  # (distill.mode 'none': cross-entropy to the target's tokens; 'token': KL to its
  # distribution). The loss counts answer tokens only; the best evaluation by tau is kept.
  config.answers = ml_collections.ConfigDict()
  config.answers.train_dir = "regenerated/train"
  config.answers.held_out_dir = "regenerated/held_out"
  # Answers shipped in the repository (FOLDER/train, FOLDER/held_out, as scripts/regenerate.py
  # writes them): regenerate.py and train_drafter.py start from them (none for this pair).
  config.answers.shipped_dir = ""
  config.answers.directory = "draft_answers"
  config.answers.tau_draft_tokens = 4
  config.answers.train = _train(steps=400, batch_size=16, seq_len=256, learning_rate=2e-3)
  config.answers.train.eval_every = 50
  # Which drafter scripts/train_drafter.py trains: 'draft' (the model above, answers.train) or
  # 'feature' (the head of config.feature.head, answers.head_train: its KL to the target's
  # distribution over answer tokens, unrolled ttt_steps >= tau_draft_tokens steps).
  config.answers.drafter = "draft"
  config.answers.head_directory = "feature_head_answers"
  # A trained feature head (a shipped folder or a checkpoint directory) a fresh head run starts
  # from instead of the seed's parameters, its draft vocabulary kept: more training on more
  # answers without paying again for the steps it had (fresh optimizer moments and schedule).
  config.answers.init_from = ""
  config.answers.head_train = _train(
    steps=400, batch_size=16, seq_len=256, learning_rate=3e-3, distill_mode="token", ttt_steps=4
  )
  config.answers.head_train.eval_every = 50
  # 'parallel': a parallel draft of the draft's shape (--config.speculative.drafter=parallel
  # loads it with --config.draft.parallel_checkpoint), the KL to the target at each of its
  # distill.parallel_tokens >= tau_draft_tokens positions, counted on answer tokens; its
  # placeholder must be draft.train.distill.mask_token.
  config.answers.parallel_directory = "parallel_answers"
  config.answers.parallel_train = _train(
    steps=400, batch_size=16, seq_len=256, learning_rate=2e-3, distill_mode="parallel"
  )
  config.answers.parallel_train.eval_every = 50
  # 'parallel_head': the feature head above as a parallel head (DFlash / PARD style: K drafts
  # from one call, placeholders after the first), optimised by answers.head_train;
  # --config.speculative.drafter=parallel_head loads it with --config.feature.parallel_checkpoint.
  config.answers.parallel_head_directory = "parallel_head_answers"
  # A head's teacher-forced target pass, stored once per row under this workdir folder
  # (specsamp/training/target_store.py: its features and last-layer output on every packed row)
  # and read at every epoch instead of run at every step; '' runs the target at every step
  # (needed on several hosts).
  config.answers.target_outputs_dir = "target_outputs"

  # How the models hold their layers when sampling: 'auto' (one array per layer on CPU, where a
  # scan copies each layer's weights before its products; stacked elsewhere), 'stacked' (one
  # lax.scan over the stack: TPU reads it in place) or 'unstacked'. Checkpoints keep the stack.
  config.layer_layout = "auto"

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # Batch parallelism; -1 takes the remaining devices.
  config.mesh.fsdp = 1  # Batch for activations, parameters sharded along d_model.
  config.mesh.expert = 1  # Expert parallelism: a mixture of experts' experts.
  config.mesh.tensor = 1  # Megatron tensor parallelism over heads / MLP / vocab.
  config.mesh.rules = ""  # Sharding rule overrides, e.g. "embed=none" (sharding.parse_rules).

  config.sampling = ml_collections.ConfigDict()
  config.sampling.seed = 0  # The sampling key: batch i samples with fold_in(key(seed), i).
  config.sampling.prompt_seed = 0  # Which held-out windows are the prompts.
  config.sampling.num_prompts = 8  # Held-out prompts sampled (batches of batch_size rows).
  config.sampling.batch_size = 1  # Rows per call; 1 is the paper's latency setting.
  config.sampling.prompt_tokens = 32  # Tokens of each held-out prompt.
  config.sampling.max_new_tokens = 64  # Tokens generated per prompt.
  config.sampling.temperature = 1.0  # 0 is greedy; 1 samples the model as it is.
  config.sampling.top_k = 0  # 0 keeps every token.
  config.sampling.top_p = 1.0  # Nucleus mass, in (0, 1].
  config.sampling.use_eos = False  # Stop a row at EOS (off: equal-length rows time fairly).
  # Prompts: 'held_out' (num_prompts windows of held-out files), 'text:TEXT', 'file:PATH'
  # (JSONL with "prompt" fields, or one per line) or 'humaneval' (its 164 prompts).
  config.sampling.prompt_source = "held_out"
  config.sampling.max_prompts = 0  # A text source's first N prompts (0: all of them).
  # Text prompts as one user message each of the tokenizer's chat template (a BPE tokenizer
  # that has one, e.g. configs/smollm2_pair.py's); held-out windows are never wrapped.
  config.sampling.chat_template = False

  config.speculative = ml_collections.ConfigDict()
  # K, draft tokens per target call (the paper's 4); with 'auto' below, the largest K tried.
  config.speculative.num_draft_tokens = 8
  # 'auto': scripts/sample.py picks K in 0..num_draft_tokens from probed loops
  # (specsamp/sampling/draft_length.py; 0: autoregressive, when no K pays); 'fixed':
  # K = num_draft_tokens.
  config.speculative.draft_length = "auto"
  # 'draft': the draft model above; 'feature': the feature head (config.feature), trained on
  # the target's own hidden features on the first run; 'lookup' or 'lookup:N': prompt lookup
  # (n-grams N..1, default 3; no model); 'self:L': the target's first L layers (no second
  # model). Neither of the last two trains or loads a draft. 'parallel': a parallel draft (K
  # drafts from one call); 'parallel_seq': the same with a sequential head (q_k sees the drafts
  # before k); 'parallel_head': the feature head drafting from one call; 'feature+lookup' or
  # 'feature+lookup:N': prompt lookup (n-grams N..2) where a row's context repeats, the feature
  # head elsewhere (jobs/drafter_specs.py).
  config.speculative.drafter = "draft"
  config.speculative.verifier = "token"  # 'token' (Chen et al.) or 'block' (Sun et al.).
  # 'sampled': every draft token drawn from the drafter's real warped q; 'greedy': its most
  # likely tokens (the r-th most likely for a tree's sibling of rank r), verified with one-hot
  # q, as vLLM and SGLang run EAGLE. Both are exact (specsamp/sampling/proposals.py).
  config.speculative.proposal = "sampled"
  # A tree of drafts scored in one target call: '' (one chain of K), 'chains:2x4' (2
  # independent chains of 4), 'tree:2,2,1,1' (children per node at each depth). K becomes the
  # tree's depth; the verifier is 'token' (recursive rejection sampling) or 'traversal'.
  config.speculative.tree = ""
  # Stop a row's draft after a token its drafter's model gave less than this probability (0:
  # never; not prompt lookup). Exact: the stop reads the drafter's output only.
  config.speculative.confidence_threshold = 0.0
  # Chains: score each iteration with the narrowest of 1..K + 1 tokens that holds every row's
  # proposal (one compiled scoring call per width), so a short proposal (a lookup miss, a
  # confidence stop) pays for a narrow call; False: always K + 1 (docs/how_it_works.md).
  config.speculative.narrow_scoring = False
  # feature+lookup: the most tokens a row drafted by the head proposes (0: K). Copies are
  # accepted far more often than the head's later drafts, so K can be long for them and short
  # for the head (with narrow scoring a head row is then scored at this + 1).
  config.speculative.head_draft_tokens = 0

  if variant == "large":
    config.tokenizer.vocab_size = vocab = 2048
    config.data.max_train_tokens = 200_000_000
    config.target.model = _model(num_layers=12, d_model=768, num_heads=12, vocab_size=vocab)
    config.target.train = _train(steps=20_000, batch_size=64, seq_len=512, learning_rate=1e-3)
    config.draft.model = _model(num_layers=2, d_model=768, num_heads=12, vocab_size=vocab)
    config.draft.train = _train(
      steps=10_000, batch_size=64, seq_len=512, learning_rate=1e-3, distill_mode="token"
    )
    config.feature.head.feature_layers = ()  # EAGLE-3's 2, N//2, N-3 of 12 layers.
    _target_widths(config.feature.head)
    config.sampling.prompt_tokens = 64
    config.sampling.max_new_tokens = 128
  elif variant == "llama":
    config.speculative.num_draft_tokens = 4  # The keras-hub comparison's K.
    for section, width in ((config.target, 384), (config.draft, 256)):
      section.model.mlp_activation = "swiglu"  # Llama's gated SiLU MLP.
      section.model.ffn_dim = 8 * width // 3  # 2/3 of 4 x d_model: the same parameters.
  elif variant == "test":
    config.tokenizer.vocab_size = vocab = 384
    config.tokenizer.max_chars = 200_000
    config.data.max_train_tokens = 40_000
    config.data.max_eval_tokens = 4_000
    config.target.model = _model(num_layers=2, d_model=64, num_heads=4, vocab_size=vocab)
    config.target.train = _train(steps=8, batch_size=8, seq_len=32, learning_rate=3e-3)
    config.draft.model = _model(num_layers=1, d_model=64, num_heads=4, vocab_size=vocab)
    config.draft.train = _train(
      steps=8, batch_size=8, seq_len=32, learning_rate=3e-3, distill_mode="token"
    )
    config.draft.sequential_head.steps = 4
    config.draft.sequential_head.batch_size = 4
    config.draft.sequential_head.seq_len = 32
    config.draft.sequential_head.checkpoint_every = 2
    config.feature.head.feature_layers = ()  # EAGLE-3's choice, collapsed: 0 and 1 of 2.
    _target_widths(config.feature.head)
    config.feature.train = _train(
      steps=8, batch_size=8, seq_len=32, learning_rate=3e-3, distill_mode="token", ttt_steps=3
    )
    config.answers.train = _train(steps=4, batch_size=2, seq_len=16, learning_rate=3e-3)
    config.answers.train.eval_every = 2
    config.answers.train.eval_batches = 2
    config.answers.head_train = _train(
      steps=4, batch_size=2, seq_len=16, learning_rate=3e-3, distill_mode="token", ttt_steps=4
    )
    config.answers.head_train.eval_every = 2
    config.answers.parallel_train = _train(
      steps=4, batch_size=2, seq_len=16, learning_rate=3e-3, distill_mode="parallel"
    )
    config.answers.parallel_train.eval_every = 2
    config.answers.parallel_train.eval_batches = 2
    config.sampling.num_prompts = 2
    config.sampling.prompt_tokens = 8
    config.sampling.max_new_tokens = 8
    # The suite times nothing: a fixed K spares its scripts the cost measurements of 'auto'
    # (tests/test_sampler.py and test_perf_model.py test the choice).
    config.speculative.draft_length = "fixed"
    config.speculative.num_draft_tokens = 4
  return config
