"""The Sampler keeps its caches between calls and stays bit-identical to fresh calls; K=0 is
autoregressive sampling through the same method; the loop benchmark's parts run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.experiments.benchmarks import loop_phases
from specsamp.experiments.proofs import hlo_ops
from specsamp.models import transformer
from specsamp.sampling import autoregressive, speculative
from specsamp.sampling.sampler import Sampler
from specsamp.sampling.warping import SamplingConfig


@pytest.fixture(scope="module")
def pair():
  import code_pair  # configs/code_pair.py (conftest puts configs/ on the path).

  from specsamp.models.config import TransformerConfig

  config = code_pair.get_config("test")
  target = transformer.create(TransformerConfig.from_config(config.target.model), seed=0)
  draft = transformer.create(TransformerConfig.from_config(config.draft.model), seed=1)
  return target, draft


def _prompts(seed):
  prompts = jax.random.randint(jax.random.key(seed), (3, 12), 4, 300)
  return prompts, jnp.array([12, 5, 9], jnp.int32)


@pytest.mark.slow
@pytest.mark.parametrize(  # The greedy case is the extended command's.
  "temperature", [pytest.param(0.0, marks=pytest.mark.extended), 1.0]
)
def test_kept_caches_give_the_fresh_calls_tokens_and_statistics(pair, temperature):
  target, draft = pair
  sampler = Sampler(target, draft)
  for call in range(3):  # The second and third calls run on the first call's caches.
    prompts, lengths = _prompts(call)
    common = dict(max_new_tokens=20, temperature=temperature, cache_length=64)
    kept = sampler.generate(prompts, lengths, jax.random.key(call), num_draft_tokens=3, **common)
    fresh = speculative.speculative_generate(
      target, draft, prompts, lengths, jax.random.key(call), num_draft_tokens=3, **common
    )
    for name in ("tokens", "lengths", "accepted_histogram", "verified_at_position", "proposed"):
      np.testing.assert_array_equal(getattr(kept, name), getattr(fresh, name), err_msg=name)
    plain = sampler.generate(prompts, lengths, jax.random.key(call), num_draft_tokens=0, **common)
    reference = autoregressive.generate(target, prompts, lengths, jax.random.key(call), **common)
    np.testing.assert_array_equal(plain.tokens, reference.tokens)
    assert plain.summary()["tokens_per_target_call"] == 1.0
  assert len(sampler._caches) == 2  # One speculative and one autoregressive shape, kept.


def test_the_caches_of_the_least_recently_used_shapes_are_dropped(pair):
  """Each cache length is a shape with caches of its own; the default length follows the prompt
  width, max_new_tokens and K, so a long-lived sampler kept a pair for every width it saw
  (the review of 2026-11-30). At most max_kept_shapes are kept, the least recently used go."""
  target, _ = pair
  sampler = Sampler(target, max_kept_shapes=2)
  prompts, lengths = _prompts(0)

  def call(cache_length):
    return sampler.generate(
      prompts, lengths, jax.random.key(0), max_new_tokens=2, num_draft_tokens=0,
      cache_length=cache_length,
    ).tokens  # fmt: skip

  first = call(16)
  call(24)
  call(16)  # Now the most recently used.
  call(32)
  assert list(sampler._caches) == [("autoregressive", 3, 16), ("autoregressive", 3, 32)]
  np.testing.assert_array_equal(call(16), first)
  sampler.clear()
  assert not sampler._caches
  np.testing.assert_array_equal(call(16), first)  # Allocated again.
  for bad in (0, 1.5, None):
    with pytest.raises(ValueError, match="max_kept_shapes must be an int >= 1"):
      Sampler(target, max_kept_shapes=bad)


@pytest.mark.parametrize("kind", ["draft", "lookup", "feature+lookup"])
def test_a_kept_cache_sampler_compiles_its_loop_once(pair, kind):
  """The state a call keeps has the structure of the one the first call allocated, so the
  second call reuses the first's program: before, a feature drafter's first call ran on no
  state and the next on the state it returned, a second compilation (2.3 s on SmolLM2) charged
  to the first timed call of every benchmark."""
  from specsamp.models import feature_head
  from specsamp.sampling import drafters
  from specsamp.sampling.lookup_feature_drafter import LookupFeatureDrafter

  target, draft = pair
  if kind == "draft":
    drafter = drafters.ModelDrafter(draft)
  elif kind == "lookup":
    drafter = drafters.PromptLookupDrafter()
  else:
    head = feature_head.create(feature_head.FeatureHeadConfig(), target.config, seed=2)
    drafter = LookupFeatureDrafter(feature_head.FeatureDraftModel(head, target))
  sampler = Sampler(target, drafter)
  sizes = []
  for call in range(3):
    prompts, lengths = _prompts(call)
    sampler.generate(
      prompts, lengths, jax.random.key(call), max_new_tokens=8, num_draft_tokens=2,
      cache_length=40,
    )  # fmt: skip
    sizes.append(speculative.SpeculativeLoop.reusing._cache_size())
  assert sizes[1] == sizes[2] == sizes[0], sizes


def test_bad_input_is_refused_and_a_draftless_sampler_only_samples_autoregressively(pair):
  target, draft = pair
  prompts, lengths = _prompts(0)
  with pytest.raises(ValueError, match="no draft"):
    Sampler(target).generate(
      prompts, lengths, jax.random.key(0), max_new_tokens=4, num_draft_tokens=2
    )
  for bad in (-1, 0.0, 2.5, True):  # 0.0 was told "an int >= 1", where 0 samples plainly.
    with pytest.raises(ValueError, match=r"num_draft_tokens \(K\) must be an int >= 0"):
      Sampler(target, draft).generate(
        prompts, lengths, jax.random.key(0), max_new_tokens=4, num_draft_tokens=bad
      )
  with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1, got True"):
    autoregressive.generate(target, prompts, lengths, jax.random.key(0), max_new_tokens=True)
  with pytest.raises(ValueError, match="too long for the cache"):
    Sampler(target, draft).generate(
      prompts, lengths, jax.random.key(0), max_new_tokens=4, num_draft_tokens=2, cache_length=8
    )


def test_nan_logits_raise_and_drop_the_caches(pair):
  import code_pair

  from specsamp.models.config import TransformerConfig

  target, _ = pair
  config = TransformerConfig.from_config(code_pair.get_config("test").draft.model)
  broken = transformer.create(config, seed=1)  # A diverged draft checkpoint.
  broken.final_norm.scale_D[...] = jnp.full_like(broken.final_norm.scale_D[...], jnp.nan)
  sampler = Sampler(target, broken)
  prompts, lengths = _prompts(0)
  with pytest.raises(FloatingPointError, match="NaN"):
    sampler.generate(prompts, lengths, jax.random.key(0), max_new_tokens=4, num_draft_tokens=2)
  assert not sampler._caches
  # Autoregressive sampling of the broken model as a target: the same error (it drew token 0
  # from the NaN logits before, and reported nothing), kept or fresh; check_nan=False reports.
  alone = Sampler(broken)
  with pytest.raises(FloatingPointError, match=r"NaN logits .* in rows \[0, 1, 2\]"):
    alone.generate(prompts, lengths, jax.random.key(0), max_new_tokens=4, num_draft_tokens=0)
  assert not alone._caches
  with pytest.raises(FloatingPointError, match="NaN logits"):
    autoregressive.generate(broken, prompts, lengths, jax.random.key(0), max_new_tokens=4)
  output = autoregressive.generate(
    broken, prompts, lengths, jax.random.key(0), max_new_tokens=4, check_nan=False
  )
  assert np.asarray(output.nan_logits).tolist() == [True] * len(prompts) == [True] * 3
  fine = autoregressive.generate(target, prompts, lengths, jax.random.key(0), max_new_tokens=4)
  assert not np.asarray(fine.nan_logits).any()
  # Under a caller's jit there is nothing to look at: nan_logits reports it (no error).
  traced = jax.jit(
    lambda key: autoregressive.generate(broken, prompts, lengths, key, max_new_tokens=4)
  )(jax.random.key(0))
  assert np.asarray(traced.nan_logits).all()


@pytest.mark.slow
@pytest.mark.extended  # scripts/benchmark_loop.py's phases: a benchmark's own check.
def test_loop_benchmark_parts_and_op_counts(pair):
  target, draft = pair
  sampling = SamplingConfig(1.0)
  # The loops the benchmark builds and the ones it profiles: 8-token prompts, K=2, batch 1.
  loops = dict(batch_size=1, prompt_tokens=8, max_new_tokens=8, num_draft_tokens=2)
  call = loop_phases.speculative_loop(target, draft, **loops, sampling=sampling, cache_length=40)
  # 4 against 24 tokens, medians of 3: one call of each (4 against 8 tokens) once measured a
  # negative difference on a loaded 2-core machine.
  assert loop_phases.iteration_ms(call, 0.0, 4, 24, 3) > 0
  phases = loop_phases.phase_ms(
    target,
    draft,
    batch_size=1,
    num_draft_tokens=2,
    sampling=sampling,
    cache_length=20,
    context=10,
    reps=2,
    repeats=1,
  )
  assert set(phases) == set(loop_phases.PHASES) and all(v > 0 for v in phases.values())
  ops = loop_phases.count_ops(call, 24, 2)
  # Every phase launches something.
  assert ops["draft"] > 0 and ops["score"] > 0 and ops["verify"] > 0
  assert hlo_ops.phase_of('x, metadata={op_name="jit(f)/while/body/verify/add"}') == "verify"
  # --config.profile: both real loops profiled; every part of the speculative loop is found.
  profiles = loop_phases.profile_loops(
    target, draft, **loops, sampling=sampling, cache_length=20, depth=1
  )
  assert {"prefill", "draft", "score", "verify"} <= set(profiles["speculative"]["scopes"])
  assert {"prefill", "step", "sample"} <= set(profiles["autoregressive"]["scopes"])
