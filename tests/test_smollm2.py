"""The real pretrained target through the whole surface: configs/smollm2_pair.py (SmolLM2-135M-
Instruct imported from its GGUF file into the workdir, a draft distilled from it) and the
certificate's real-target case, reduced (scripts/certify.py --real_target=smollm2 draws 10^5)."""

import jax
import numpy as np
import pytest

from specsamp import sharding
from specsamp.experiments import config_files
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.experiments.jobs import prompts as prompts_lib
from specsamp.experiments.proofs import certify_real
from specsamp.models import feature_head
from specsamp.sampling import autoregressive, drafters, speculative, warping
from specsamp.sampling.feature_drafter import FeatureDrafter
from specsamp.testing import exactness
from specsamp.training.bpe_tokenizer import BpeTokenizer

# Every test here reads a real model's file (imported once per module, 40-60 s): the extended
# command runs them; the suite's reduced version is tests/test_gguf.py (the same file's metadata,
# tokenizer and import to a checkpoint).
pytestmark = [pytest.mark.slow, pytest.mark.extended]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  config = config_files.load_module("configs/smollm2_pair.py").get_config("test")
  workdir = str(tmp_path_factory.mktemp("smollm2"))
  lines = []
  # One device: the suite's 8 simulated host devices would each hold a replica of the 135M
  # target and its training state (10 GB resident instead of 2).
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  prepared = pair_lib.prepare(config, workdir, log=lines.append, mesh=mesh)
  assert any("importing" in line for line in lines)
  # Cached: loads, never retrains.
  again = pair_lib.prepare(config, workdir, log=lines.append, mesh=mesh)
  assert not any("training" in line for line in lines[-3:])
  assert again.tokenizer.fingerprint == prepared.tokenizer.fingerprint
  return prepared


def test_the_pair_has_the_files_tokenizer_and_reads_humaneval_and_chat_prompts(pair):
  assert isinstance(pair.tokenizer, BpeTokenizer) and pair.tokenizer.vocab_size == 49152
  assert pair.target.config.num_layers == 30 and pair.draft.config.vocab_size == 49152
  code = prompts_lib.of_pair(pair, "humaneval", limit=2)
  assert len(code) == 2 and pair.tokenizer.decode(code.rows()[0]).startswith(
    "from typing import List\n\n\ndef has_close_elements("
  )
  chat = prompts_lib.of_pair(pair, "text:What is a tuple?", chat=True)
  text = pair.tokenizer.backend.decode(chat.rows()[0], skip_special_tokens=False)
  assert text.endswith("<|im_start|>user\nWhat is a tuple?<|im_end|>\n<|im_start|>assistant\n")


def test_greedy_speculative_equals_autoregressive_for_every_drafter(pair):
  prompts = prompts_lib.of_pair(pair, "humaneval", limit=2)
  new = 12
  expected = autoregressive.generate(
    pair.target,
    prompts.tokens,
    prompts.lengths,
    jax.random.key(0),
    max_new_tokens=new,
    temperature=0.0,
  )
  for drafter in (
    drafters.ModelDrafter(pair.draft),
    drafters.PromptLookupDrafter(max_ngram=3),
    drafters.self_speculative(pair.target, 4),
    # A feature head (untrained: greedy equality holds whatever it proposes) on layers 2, 15
    # and 27 of the real target, with its own 256-token head.
    FeatureDrafter(
      feature_head.FeatureDraftModel(
        feature_head.create(
          feature_head.FeatureHeadConfig(draft_vocab_size=256), pair.target.config
        ),
        pair.target,
      )
    ),
  ):
    out = speculative.speculative_generate(
      pair.target,
      drafter,
      prompts.tokens,
      prompts.lengths,
      jax.random.key(1),
      max_new_tokens=new,
      num_draft_tokens=3,
      temperature=0.0,
    )
    for row, length in enumerate(prompts.lengths):
      np.testing.assert_array_equal(
        np.asarray(out.tokens)[row, length : length + new],
        np.asarray(expected.tokens)[row, length : length + new],
      )


def test_the_real_target_certificate_enumerates_and_samples_inside_the_support(pair, tmp_path):
  prompt = pair.tokenizer.encode("def add(a, b):")
  sampling = warping.SamplingConfig(1.0, top_k=4)
  exact = certify_real.support_distribution(pair.target, prompt, sampling, 2)
  assert len(exact) == 16 and abs(sum(exact.values()) - 1.0) < 1e-9
  # One continuation's probability, recomputed from a plain forward pass of the whole sequence
  # (float32 logits of another batch shape through 30 layers: agreement to float32 rounding,
  # which depends on the host: 3e-6 relative on one 2-core host, 1.3e-5 on another, with the
  # same code, on 2026-11-26). A wrong token or position is off by orders of magnitude.
  (first, second), probability = max(exact.items(), key=lambda item: item[1])
  tokens = np.asarray([prompt + [first, second]], np.int32)
  steps = np.asarray(exactness.last_distributions(pair.target, tokens, sampling, 3), np.float64)
  np.testing.assert_allclose(
    probability, steps[0, 0, first] * steps[0, 1, second] / steps[0, :2].sum(-1).prod(), rtol=5e-5
  )
  drawn = certify_real.draw(
    pair.target,
    4,
    prompt,
    sampling,
    new_tokens=2,
    num_draft_tokens=2,
    num_samples=64,
    seed=0,
    chunk=32,
    cache_dir=str(tmp_path),
  )
  assert all(tuple(row) in exact for row in drawn.tolist())
  assert len({tuple(row) for row in drawn.tolist()}) > 1
  # A rerun resumes from the saved chunks (a marked one shows it was read, not redrawn).
  saved = sorted(tmp_path.glob("draws_*.npy"))
  assert len(saved) == 2
  np.save(saved[1], np.full((32, 2), -7, np.int32))
  again = certify_real.draw(
    pair.target,
    4,
    prompt,
    sampling,
    new_tokens=2,
    num_draft_tokens=2,
    num_samples=64,
    seed=0,
    chunk=32,
    cache_dir=str(tmp_path),
  )
  np.testing.assert_array_equal(again[:32], drawn[:32])
  assert (again[32:] == -7).all()
