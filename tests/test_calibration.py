"""A dynamic tree's rank temperature (specsamp/sampling/calibration.py): the fit recovers a
known temperature, the drafter's calibration logits are the ones it drafts its first token
from, and '@fit' tree specs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.models import feature_head, transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import calibration, drafters
from specsamp.sampling.feature_drafter import FeatureDrafter
from specsamp.sampling.warping import SamplingConfig

CONFIG = TransformerConfig(
  vocab_size=48, num_layers=4, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64
)


@pytest.mark.parametrize("tau", [0.2, 1.0, 3.0])
def test_the_fit_recovers_the_temperature_the_labels_were_drawn_at(tau):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(20_000, 12)).astype(np.float32) * 2
  labels = np.asarray(jax.random.categorical(jax.random.key(1), jnp.asarray(logits) / tau))
  fitted = calibration.fit_rank_temperature(logits, labels)
  assert abs(fitted / tau - 1) < 0.05, fitted
  best = calibration.rank_nll(logits, labels, fitted)
  assert best <= calibration.rank_nll(logits, labels, fitted * 1.2)
  assert best <= calibration.rank_nll(logits, labels, fitted / 1.2)


def test_the_fit_refuses_what_it_cannot_fit():
  with pytest.raises(ValueError, match="logits"):
    calibration.fit_rank_temperature(np.zeros((3, 4)), np.zeros(2, int))
  with pytest.raises(ValueError, match="finite"):
    calibration.fit_rank_temperature(np.full((2, 4), np.nan), np.zeros(2, int))


def test_fit_specs():
  assert calibration.needs_fit("dynamic:4x8@fit") and not calibration.needs_fit("dynamic:4x8")
  assert calibration.unfitted("dynamic:4x8@fit") == "dynamic:4x8"
  assert calibration.fitted("dynamic:4x8@fit", 0.17721) == "dynamic:4x8@0.1772"
  assert calibration.fitted("tree:2,1", 0.5) == "tree:2,1"


@pytest.fixture(scope="module")
def target():
  return transformer.create(CONFIG, seed=1)


@functools.partial(jax.jit, static_argnums=(0, 1, 3))  # One program, not an eager run.
def _first_draft_q(drafter, target, prompts, n):
  """The q a drafter draws its first token from after the prompts (T=1, sampled)."""
  batch = prompts.shape[0]
  lengths = jnp.full((batch,), n, jnp.int32)
  width = n + 4
  tokens = jnp.zeros((batch, width), jnp.int32).at[:, :n].set(prompts)
  sampling = SamplingConfig(1.0)
  features = None
  if drafter.feature_layers:
    positions = jnp.broadcast_to(jnp.arange(n), (batch, n))
    features = target(
      prompts, positions, target.init_cache(batch, n), capture_layers=drafter.feature_layers
    ).features
  state, _ = drafter.init(tokens[:, :n], lengths, width, 1, features_BTF=features)
  proposal, _ = drafter.propose(
    state, tokens, lengths, jax.random.key(0), 1, jnp.ones((batch,), jnp.int32), sampling, 48
  )
  return proposal.probs[:, 0]


@pytest.mark.slow
@pytest.mark.parametrize(  # The feature head's case is the extended command's.
  "kind", [pytest.param("feature", marks=pytest.mark.extended), "model"]
)
def test_calibration_logits_are_what_the_drafter_drafts_its_first_token_from(target, kind):
  """Entry s of ``Drafter.first_draft_logits`` predicts token s+1 (model) or s+2 (head), with
  the target's argmax there: after a prompt of n tokens, the first draft token's q is the
  softmax of entry n-1 (model) or n-2 (head)."""
  if kind == "feature":
    head = feature_head.create(feature_head.FeatureHeadConfig(), CONFIG, seed=2)
    drafter = FeatureDrafter(feature_head.FeatureDraftModel(head, target))
  else:
    drafter = drafters.ModelDrafter(transformer.create(CONFIG.replace(num_layers=1), seed=3))
  tokens = jax.random.randint(jax.random.key(4), (2, 9), 0, 48)
  logits, labels = drafter.first_draft_logits(target, tokens)
  offset = 2 if kind == "feature" else 1
  assert logits.shape == (2, 10 - offset, 48) and labels.shape == (2, 10 - offset)
  target_logits, _ = target(tokens, None, target.init_cache(2, 9))
  np.testing.assert_array_equal(labels, jnp.argmax(target_logits[:, offset - 1 :], axis=-1))
  for n in (3, 7):
    q = _first_draft_q(drafter, target, tokens[:, :n], n)
    np.testing.assert_allclose(q, jax.nn.softmax(logits[:, n - offset]), atol=2e-6)
  tau = calibration.fit_drafter(drafter, target, tokens)
  assert calibration.TAU_RANGE[0] <= tau <= calibration.TAU_RANGE[1]
