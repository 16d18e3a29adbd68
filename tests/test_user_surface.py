"""What a user touches first: settings checked before anything runs, warnings, memory checks."""

import dataclasses
import os
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest
from bigram import random_bigram
from conftest import ROOT, tiny_config

from specsamp.experiments.jobs import sample_job
from specsamp.models import transformer
from specsamp.sampling import SamplingConfig, generate, memory, speculative_generate
from specsamp.sampling.sampler import Sampler

sys.path.insert(0, f"{ROOT}/configs")
import code_pair  # noqa: E402


@pytest.mark.parametrize(
  "path,value,message",
  [
    ("speculative.num_draft_tokens", 200, "=200: must be <= sampling.max_new_tokens (64)"),
    ("speculative.num_draft_tokens", 0, "=0: must be an int >= 1 (K)"),
    ("sampling.max_new_tokens", 0, "--config.sampling.max_new_tokens=0: must be an int >= 1"),
    ("sampling.prompt_tokens", 0, "--config.sampling.prompt_tokens=0: must be an int >= 1"),
    ("sampling.top_p", 0.0, "--config.sampling.top_p=0.0: must be in (0, 1]"),
    ("sampling.max_prompts", -3, "--config.sampling.max_prompts=-3: must be an int >= 0"),
    (
      "speculative.confidence_threshold",
      1.5,
      "--config.speculative.confidence_threshold=1.5: must be a number in [0, 1)",
    ),
    ("speculative.head_draft_tokens", -1, "--config.speculative.head_draft_tokens=-1: must be"),
    # Below the smallest normal float32 a device divides by 0 (NaN probabilities, token 0).
    ("sampling.temperature", 1e-40, "=1e-40: must be 0 (greedy) or a finite number >= 1.175e-38"),
  ],
)
def test_settings_are_checked_in_one_line_naming_the_flag(path, value, message):
  config = code_pair.get_config()
  section, name = path.split(".")
  config[section][name] = value
  with pytest.raises(ValueError) as error:
    sample_job.check_settings(config)
  assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
  "changes,message",
  [
    # A tree's K is its depth: the chain's num_draft_tokens (8) was held against max_new_tokens.
    (dict(tree="tree:2,2", max_new_tokens=4), None),
    (dict(tree="tree:2,2", drafter="lookup"), "tree:2,2': drafter='lookup' proposes single chains"),
    (dict(tree="tree:2,2", drafter="feature+lookup:2"), "its copy beside the head's chain"),
    (dict(tree="chain:3", drafter="lookup"), None),
    (dict(tree="chain:3", drafter="feature+lookup:2"), "as the tree 'chains:2x3'"),
    # A pair config's confidence stop (smollm2_pair's 0.5) does not refuse a dynamic tree: the
    # job drafts it without the stop, and says so
    # (test_a_dynamic_tree_drafts_without_the_confidence_stop_and_says_so).
    (dict(tree="dynamic:2x2", proposal="greedy", confidence_threshold=0.5), None),
    # Wider than the vocabulary, known before the pair trains.
    (
      dict(tree="dynamic:65x2", proposal="greedy", vocab_size=64),
      "dynamic:65x2'.*one child per token .*\\(64\\)",
    ),
    (dict(tree="tree:65/distinct", vocab_size=64), "distinct siblings are at most .*'s 64"),
    (dict(tree="tree:65/iid", vocab_size=64), None),  # i.i.d. siblings may repeat a token.
    # '@fit' on a static tree, or after a '@tau': refused after the fit (2026-11-30's review).
    (dict(tree="tree:2,2@fit"), "'@fit' fits a dynamic tree's rank temperature"),
    (dict(tree="dynamic:2x2@0.5@fit", proposal="greedy"), "'@fit' fits a dynamic tree's rank"),
    (dict(tree="dynamic:2x2@fit", proposal="greedy"), None),
  ],
)
def test_tree_settings_are_checked_before_the_pair_is_prepared(changes, message):
  """Refused by the loop only after the pair had trained, up to minutes on a fresh workdir, or
  refused wrongly (the review of 2026-11-29)."""
  config = code_pair.get_config()
  for name, value in changes.items():
    section = {"max_new_tokens": config.sampling, "vocab_size": config.target.model}
    section.get(name, config.speculative)[name] = value
  if message is None:
    sample_job.check_settings(config)
  else:
    with pytest.raises(ValueError, match=message):
      sample_job.check_settings(config)


@pytest.mark.parametrize(
  "changes,message",
  [
    (dict(drafter="parallel", num_draft_tokens=8), "=8: drafter='parallel' drafts 8 positions"),
    (dict(drafter="parallel", num_draft_tokens=8, draft_length="auto"), None),  # Capped.
    (dict(drafter="parallel", num_draft_tokens=4), None),
    (dict(drafter="parallel", tree="tree:2,1,1,1,1"), "trained to fill 4 \\(draft.train.distill"),
    (dict(drafter="parallel_head", num_draft_tokens=4), "fill 3 \\(feature.train.ttt_steps\\)"),
    (dict(drafter="parallel_seq", num_draft_tokens=4, head=3), "draft.sequential_head.num_draft"),
    (dict(drafter="draft", num_draft_tokens=8), None),  # Sequential: any K.
    (dict(drafter="feature", num_draft_tokens=8), None),
  ],
)
def test_a_parallel_drafter_drafts_no_more_positions_than_it_was_trained_for(changes, message):
  """Past its trained positions a parallel drafter reads placeholders it never learned: still
  exact, rarely accepted. Refused before anything trains (the review of 2026-11-29: K = 8 ran
  over 4 trained positions silently)."""
  config = code_pair.get_config()
  config.speculative.draft_length = changes.pop("draft_length", "fixed")
  config.draft.sequential_head.num_draft_tokens = changes.pop("head", 4)
  for name, value in changes.items():
    config.speculative[name] = value
  if message is None:
    sample_job.check_settings(config)
  else:
    with pytest.raises(ValueError, match=message):
      sample_job.check_settings(config)


def test_the_vocabularies_of_the_models_a_pair_trains_are_checked_before_anything_trains():
  """--config.tokenizer.vocab_size=350 left the models at 1024 rows, whose ids past the pieces
  were sampled and decoded to nothing; a draft of another vocabulary was refused only after it
  had trained (the review of 2026-11-30). A model a checkpoint brings is not checked."""
  from specsamp.experiments.jobs import pair

  config = code_pair.get_config()
  pair.check_train_settings(config, ["token"])
  config.tokenizer.vocab_size = 350
  with pytest.raises(ValueError, match="tokenizer.vocab_size=350, but --config.target.model.voc"):
    pair.check_train_settings(config, ["token"])
  config.target.model.vocab_size = config.draft.model.vocab_size = 350
  pair.check_train_settings(config, ["token"])
  config.tokenizer.path, config.draft.model.vocab_size = "a/tokenizer.model", 512
  with pytest.raises(ValueError, match="draft.model.vocab_size=512 differs from --config.target"):
    pair.check_train_settings(config, ["token"])
  config.draft.checkpoint = "a/draft"
  pair.check_train_settings(config, ["token"])
  config.tokenizer.path, config.tokenizer.model_type = "", "bpee"  # SentencePiece's own message.
  with pytest.raises(ValueError, match="tokenizer.model_type='bpee': must be one of .'bpe', 'uni"):
    pair.check_train_settings(config, ["token"])


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("draft_vocab_size", 5000, "draft_vocab_size=5000 exceeds the target's vocabulary .1024."),
    ("feature_layers", (1, 7), "feature_layers must be distinct ascending layers in .0, 6."),
  ],
)
def test_a_feature_head_that_cannot_read_the_target_is_refused_before_it_trains(
  tmp_path, field, value, message
):
  """Refused only after the target had trained (the review of 2026-11-30)."""
  from specsamp.experiments.jobs import pair

  config = code_pair.get_config()
  config.feature.head[field] = value
  with pytest.raises(ValueError, match=f"--config.feature.head: {message}"):
    pair.prepare(config, str(tmp_path / "work"), drafts=False, feature_head=True)
  assert not os.path.exists(tmp_path / "work")  # Nothing made, nothing trained.


def test_a_parallel_checkpoint_says_how_many_positions_it_was_trained_for(tmp_path):
  """A loaded parallel draft's count is its metadata's (scripts/train_drafter.py records it);
  one that records none is not checked."""
  from specsamp.experiments.jobs import drafter_specs
  from specsamp.training import checkpoint

  config = code_pair.get_config()
  spec = drafter_specs.parse("parallel")
  for name, meta, expected in (
    ("two", {"parallel": {"mask_token": 3, "tokens": 2}}, 2),
    ("none", {}, None),
  ):
    store = checkpoint.Checkpoints(str(tmp_path / name))
    store.save(1, {"params": {"w": np.zeros(2, np.float32)}}, meta)
    store.wait()
    config.draft.parallel_checkpoint = str(tmp_path / name)
    found = drafter_specs.trained_positions(spec, config)
    assert (found and found[0]) == expected
    assert drafter_specs.trained_positions(spec, config, read_checkpoints=False) is None
  config.draft.parallel_checkpoint = str(tmp_path / "two")
  config.speculative.drafter, config.speculative.num_draft_tokens = "parallel", 3
  config.speculative.draft_length = "fixed"
  with pytest.raises(ValueError, match="trained to fill 2 .*two's metadata"):
    sample_job.check_trained_positions(config, drafter_specs.trained_positions(spec, config))


def test_rows_past_the_training_context_are_warned():
  config = code_pair.get_config()  # Both models trained on 128-token sequences.
  assert sample_job.context_warnings(config, longest_prompt=64) == []  # 64 + 64 = 128
  [target, draft] = sample_job.context_warnings(config, longest_prompt=960)
  assert "reach position 1024, 8.0x the target's training context of 128 tokens" in target
  assert "--config.target.train.seq_len" in target and "draft's" in draft
  config.target.checkpoint = "/some/imported/model"  # Its training context is not recorded.
  assert len(sample_job.context_warnings(config, longest_prompt=960)) == 1
  config.speculative.drafter = "lookup"  # No draft model: nothing left to warn about.
  assert sample_job.context_warnings(config, longest_prompt=960) == []


def test_cache_bytes_are_known_before_allocating():
  model = random_bigram(32, seed=0)
  assert memory.cache_bytes(model, 3, 40) == 3 * 4  # The bigram's cache: an int32 length a row.
  config = tiny_config()
  kv = 2 * config.num_layers * 3 * 40 * config.num_kv_heads * config.resolved_head_dim * 4
  assert memory.cache_bytes(transformer.create(config, seed=0), 3, 40) == kv + 3 * 4
  available, where = memory.device_memory()
  assert available > 0 and where


def test_a_cache_that_cannot_fit_is_refused_before_allocating(monkeypatch):
  model = random_bigram(32, seed=0)
  needed = memory.cache_bytes(model, 2, 4 + 8)
  monkeypatch.setattr(memory, "device_memory", lambda: (needed - 1, "2 test devices"))
  prompts, lengths = np.array([[5, 6, 7, 8], [9, 10, 0, 0]]), np.array([4, 2])
  with pytest.raises(ValueError, match=r"Sampling 2 rows x 12 cache slots needs at least"):
    generate(model, prompts, lengths, jax.random.key(0), max_new_tokens=8)
  with pytest.raises(ValueError, match=r"more than the 0.00 GiB of 2 test devices"):
    speculative_generate(
      model, model, prompts, lengths, jax.random.key(0), max_new_tokens=4, num_draft_tokens=3
    )
  with pytest.raises(ValueError, match=r"Sampling 2 rows x 12 cache slots needs at least"):
    Sampler(model).generate(  # K = 0 (np.int64 too) allocated without the check.
      prompts, lengths, jax.random.key(0), max_new_tokens=8, num_draft_tokens=np.int64(0)
    )


def test_more_draft_tokens_than_new_tokens_is_warned():
  model = random_bigram(32, seed=0)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = speculative_generate(
      model,
      model,
      np.array([[5, 6]]),
      np.array([2]),
      jax.random.key(0),
      max_new_tokens=3,
      num_draft_tokens=5,
    )
  assert any("num_draft_tokens=5 > max_new_tokens=3" in str(w.message) for w in caught)
  assert int(out.num_generated[0]) == 3


def test_importing_specsamp_changes_no_environment_variable():
  """The library and the jobs a user imports leave os.environ as they found it (libtpu's quiet
  defaults are the AOT tool's business: experiments/proofs/aot.quiet_libtpu)."""
  code = (
    # jax itself sets libtpu's variables when that is installed: after it, specsamp sets none.
    "import os, jax; before = dict(os.environ); import specsamp, specsamp.sampling, "
    "specsamp.experiments.jobs.sample_job, specsamp.hf; "
    "keys = set(before) | set(os.environ); "
    "changed = sorted(k for k in keys if before.get(k) != os.environ.get(k)); "
    "print(changed); raise SystemExit(1 if changed else 0)"
  )
  env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
  result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  assert result.returncode == 0, result.stdout + result.stderr[-2000:]


def test_prompt_files_are_jsonl_or_text_and_a_bad_line_is_named(tmp_path):
  """A JSONL file with a header line was read as text (the JSON lines became prompts as
  written), and a non-string prompt failed after the pair was prepared."""
  from specsamp.experiments.jobs import prompts

  def texts(name, content):
    path = tmp_path / name
    path.write_text(content)
    return prompts.file_texts(str(path))

  assert texts("a.jsonl", '{"prompt": "def f():"}\n\n{"prompt": "x\\ny"}\n') == ["def f():", "x\ny"]
  assert texts("a.txt", "def f():\\n  return {\n{not json\n") == [
    "def f():\n  return {",
    "{not json",
  ]
  # A text file may hold a line that is some other JSON object (a completion prompt).
  assert texts("b.txt", 'Complete:\n{"name": "demo"}\n') == ["Complete:", '{"name": "demo"}']
  for content, line in (
    ('# my prompts\n{"prompt": "a"}\n', 1),
    ('{"prompt": "a"}\n{"prompt": 5}\n', 2),
    ('{"prompt": "a"}\n{"text": "b"}\n', 2),
    ('{"prompt": "a"\n{"prompt": "b"\n', 1),  # Every line braced: JSONL, and broken.
  ):
    with pytest.raises(ValueError, match=f"line {line}: a JSONL prompt file needs a JSON object"):
      texts("bad.jsonl", content)
  # A byte-order mark (Notepad, PowerShell) began the first prompt, or broke line 1 of JSONL.
  (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"prompt": "def fib(n):"}\n{"prompt": "x"}\n')
  assert prompts.file_texts(str(tmp_path / "bom.jsonl")) == ["def fib(n):", "x"]
  (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfdef fib(n):\n")
  assert prompts.file_texts(str(tmp_path / "bom.txt")) == ["def fib(n):"]
  (tmp_path / "binary.txt").write_bytes(b"\xd0\xcf\x11\xe0 a saved spreadsheet")
  with pytest.raises(ValueError, match="binary.txt: not UTF-8 text"):  # Named its file only since
    prompts.file_texts(str(tmp_path / "binary.txt"))  # 2026-11-30.


def test_a_batch_size_that_does_not_divide_the_prompts_is_refused_before_training(tmp_path):
  """The sample job counted a prompt file's prompts only after preparing (training) the pair;
  num_prompts, which only the held-out windows use, no longer has to divide by it."""
  (tmp_path / "three.txt").write_text("def fib(n):\nclass Stack:\nimport os\n")
  config = code_pair.get_config("test")
  config.sampling.prompt_source = f"file:{tmp_path / 'three.txt'}"
  config.sampling.batch_size, config.sampling.num_prompts = 2, 3
  with pytest.raises(ValueError, match="batch_size=2: must divide the 3 prompts of file:"):
    sample_job.run(config, str(tmp_path / "work"), log=lambda line: None)
  assert not (tmp_path / "work").exists()
  config.sampling.batch_size, config.sampling.chat_template = 1, True  # No template to apply:
  with pytest.raises(ValueError, match="trained here .SentencePiece. and has no chat template"):
    sample_job.run(config, str(tmp_path / "work"), log=lambda line: None)  # before training.
  assert not (tmp_path / "work").exists()
  config.sampling.batch_size, config.sampling.chat_template = 2, False
  sample_job.check_settings(config)  # num_prompts=3 with batch 2: not the file's count.
  config.sampling.prompt_source = "held_out"  # There it is the count, and refused.
  with pytest.raises(ValueError, match="num_prompts=3: must be a positive multiple"):
    sample_job.check_settings(config)


def test_padding_ids_are_ignored_and_ids_must_be_integers():
  """Past each row's length a prompt may hold any integer (-100, V): it was fed to the prefill,
  embedded as NaN and spread through attention's 0 x NaN. Ids are integers, checked before
  any cast (2^32 + 5 was read as 5, a length of 1.9 as 1)."""
  model = transformer.create(tiny_config(vocab_size=32), seed=0)
  clean, lengths = np.array([[5, 9, 14, 3], [8, 0, 0, 0]]), np.array([4, 1])
  options = dict(max_new_tokens=6, temperature=0.0)
  reference = generate(model, clean, lengths, jax.random.key(0), **options)
  for pad in (32, -100):
    padded = np.where(np.arange(4)[None] < lengths[:, None], clean, pad)
    out = generate(model, padded, lengths, jax.random.key(0), **options)
    np.testing.assert_array_equal(out.tokens, reference.tokens)
    spec = speculative_generate(
      model, model, padded, lengths, jax.random.key(0), num_draft_tokens=2, **options
    )
    np.testing.assert_array_equal(spec.tokens, reference.tokens)
  wide = np.array([[2**32 + 5, 9], [8, 0]], np.int64)
  with pytest.raises(ValueError, match=r"Prompt token id 4294967301 \(row 0, position 0\)"):
    generate(model, wide, [2, 1], jax.random.key(0), **options)
  with pytest.raises(ValueError, match=r"prompts must be integers, got 5.7 \(dtype float64\)"):
    generate(model, [[5.7, 9.0]], [2], jax.random.key(0), **options)
  with pytest.raises(ValueError, match=r"lengths must be integers, got 1.9 \(dtype float64\)"):
    generate(model, [[5, 9]], [1.9], jax.random.key(0), **options)
  with pytest.raises(ValueError, match="prompts must be integers, got dtype <U1"):
    generate(model, [["a", "b"]], [2], jax.random.key(0), **options)
  whole = generate(model, clean.astype(float), np.ones(2) * lengths, jax.random.key(0), **options)
  np.testing.assert_array_equal(whole.tokens, reference.tokens)  # Whole floats: np.ones(B).
  with pytest.raises(ValueError, match="prompts must be a rectangular array; right-pad"):
    generate(model, [[5, 9], [8]], [2, 1], jax.random.key(0), **options)
  with pytest.raises(ValueError, match="batch and length >= 1, got shape \\(0, 3\\)"):
    generate(model, np.zeros((0, 3), int), np.zeros(0, int), jax.random.key(0), **options)


def test_special_ids_sampler_fields_and_numpy_settings():
  """eos_id and pad_id are checked in one line (a None pad failed as a bare int() deep in the
  loop; an EOS past the vocabulary never stopped a row); a list of EOS ids is several stop ids
  (tests/test_speculative.py); a Sampler is frozen (a reassigned target was silently ignored);
  NumPy scalars are sampling settings."""
  model = transformer.create(tiny_config(vocab_size=32), seed=0)
  prompts, lengths = np.array([[5, 9]]), np.array([2])
  several = "eos_id must be None, one token id or a non-empty list of token ids, each in"
  for ids, message in (
    (dict(eos_id=[3, 32]), several + r" \[0, 32\), got \[3, 32\]"),
    (dict(eos_id=[]), several),
    (dict(eos_id=32), several),
    (dict(eos_id=3.0), several),
    (dict(eos_id=[3, True]), several),
    (dict(eos_id=[2, [3]]), several),  # Ragged: not a list of ids.
    (dict(pad_id=None), "pad_id must be an int32"),
    (dict(pad_id=2**31), "pad_id must be an int32"),  # Failed in the jitted call (2026-11-30).
  ):
    with pytest.raises(ValueError, match=message):
      generate(model, prompts, lengths, jax.random.key(0), max_new_tokens=2, **ids)
    with pytest.raises(ValueError, match=message):
      Sampler(model, **ids)
  for length in (float("nan"), float("inf"), "64", 64.0):  # int() or < failed on the first three.
    with pytest.raises(ValueError, match="cache_length must be None or an int"):
      generate(model, prompts, lengths, jax.random.key(0), max_new_tokens=2, cache_length=length)
  for rng in (0, None):  # "invalid PRNG key data" inside JAX, an AttributeError (2026-11-30).
    with pytest.raises(TypeError, match="rng must be a JAX random key, e.g. jax.random.key"):
      generate(model, prompts, lengths, rng, max_new_tokens=2)
    with pytest.raises(TypeError, match="rng must be a JAX random key"):
      Sampler(model).generate(prompts, lengths, rng, max_new_tokens=2, num_draft_tokens=0)
  sampler = Sampler(model, eos_id=np.int64(3))
  for eos in (np.array(3), np.array([3, 11]), (3, 11)):  # NumPy ids and tuples alike.
    Sampler(model, eos_id=eos)
  with pytest.raises(dataclasses.FrozenInstanceError):
    sampler.target = transformer.create(tiny_config(vocab_size=32), seed=7)
  sampling = SamplingConfig(np.float32(0.5), np.int64(5), np.float64(0.9))
  assert sampling == SamplingConfig(0.5, 5, 0.9) and hash(sampling) == hash(
    SamplingConfig(0.5, 5, 0.9)
  )
  assert type(sampling.top_k) is int and type(sampling.temperature) is float
  out = generate(
    model, prompts, lengths, jax.random.key(0), max_new_tokens=2, top_p=np.float32(0.5)
  )
  assert int(out.num_generated[0]) == 2


def test_the_predicted_speedup_charges_the_drafting_calls_the_loop_made():
  """K one-token draft steps per iteration was the charge for every drafter: a parallel
  drafter makes one wider call, and a chain cut by max_new_tokens fewer steps."""
  from specsamp.experiments.benchmarks import speedup

  costs = speedup.StepCosts(
    target_step_s=1.0, draft_step_s=0.1, target_score_s=1.5, num_draft_tokens=4
  )
  stats = {"alpha": 0.8, "num_draft_tokens": 4, "tokens_per_target_call": 3.0}
  # Long rows: max_new_tokens over the expected iterations is the paper's E[tokens/call] but for
  # the last iteration's cut, about 1.6 / N of it. (N was 100,000, where the exact dynamic
  # programming over a row's tokens took 112 s of the suite for three reports; 0.16 s at 4,096.)
  long = 4_096
  expected = long / speedup.slowest_row_iterations([0.8], 4, long)
  assert expected == pytest.approx(speedup.expected_tokens_per_call(0.8, 4), rel=1e-3)

  def report(draft_call, **settings):
    return sample_job.SampleReport(
      prompts=[], texts={}, tokens={}, autoregressive=None, speculative=None, stats=stats,
      costs=costs, settings=settings, draft_call=draft_call,
    )  # fmt: skip

  # K = 4 one-token draft steps at 0.1 s and the scoring call, for a chain drafter:
  chain = report(None, max_new_tokens=long)
  assert chain.predicted_speedup == pytest.approx(expected / (4 * 0.1 + 1.5), rel=1e-12)
  assert chain.predicted_speedup == pytest.approx(costs.predicted_speedup(0.8), rel=1e-3)
  parallel = report({"tokens": 8, "seconds": 0.25, "per_iteration": 1.0}, max_new_tokens=long)
  assert parallel.predicted_speedup == pytest.approx(expected / (0.25 + 1.5), rel=1e-12)
  capped = report({"tokens": 1, "seconds": 0.1, "per_iteration": 3.5}, max_new_tokens=long)
  assert capped.predicted_speedup == pytest.approx(expected / (0.35 + 1.5), rel=1e-12)
  # A call pays its slowest row's iterations, each row at its own alpha, and max_new_tokens cuts
  # the last one: the sweep's prediction (benchmark.py), where the job promised the paper's
  # E[tokens/call] at the pooled alpha (2026-11-30's review: 1.19x against 0.954x at batch 4).
  stats["row_alphas"] = [0.6, 0.8, 0.9, 0.95]
  batched = report(None, max_new_tokens=32)
  assert batched.expected_tokens_per_call == pytest.approx(
    32 / speedup.slowest_row_iterations([0.6, 0.8, 0.9, 0.95], 4, 32)
  )
  assert batched.predicted_speedup == pytest.approx(
    costs.predicted_batch_speedup([0.6, 0.8, 0.9, 0.95], 32)
  )
  assert batched.expected_tokens_per_call < expected - 0.5
  del stats["row_alphas"]
  tree = report({"tokens": 1, "seconds": 0.1, "per_iteration": 4.0}, tree="tree:2,2,1,1")
  assert tree.expected_tokens_per_call == 3.0
  assert tree.predicted_speedup == pytest.approx(3.0 / (0.4 + 1.5))


def test_summarize_refuses_runs_of_different_draft_lengths():
  """A Sampler's K=0 run and its K=2 run pooled: NumPy's concatenate error before."""
  import types

  from specsamp.sampling import statistics

  runs = [types.SimpleNamespace(accepted_at_position=np.zeros((2, k))) for k in (0, 2)]
  with pytest.raises(ValueError, match=r"one draft length K; these have K in \[0, 2\]"):
    statistics.summarize(runs)


def test_a_dynamic_tree_drafts_without_the_confidence_stop_and_says_so():
  from specsamp.sampling import tree as tree_lib

  config = code_pair.get_config()
  config.speculative.confidence_threshold = 0.5
  said = []
  dynamic, static = tree_lib.parse("dynamic:2x2"), tree_lib.parse("tree:2,2")
  assert sample_job.confidence_threshold(config, dynamic, said.append) == 0.0
  assert said and "the dynamic tree drafts without it" in said[0]
  said.clear()
  assert sample_job.confidence_threshold(config, static, said.append) == 0.5
  assert sample_job.confidence_threshold(config, None, said.append) == 0.5 and not said
