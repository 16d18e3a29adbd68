"""Side by side on one machine: Hugging Face transformers' assisted generation vs specsamp's
speculative sampling, on the same pair of weights (the specsamp pair exported to HF).

Both sides sample the same held-out prompts one at a time (batch 1, HF assisted
generation's only batch size), generating exactly ``max_new_tokens`` (no EOS
stop), with the same K. HF runs in float32 on the CPU with its default attention (on a GPU,
``hf_device='cuda'`` and the models' own dtype: scripts/device_benchmark.sh); its
draft length is fixed at K (``num_assistant_tokens_schedule='constant'`` and
no confidence cut-off) so both sides speculate alike and their acceptance can
be compared; HF with its own defaults (its starting draft length, schedule and
confidence cut-off) is timed too. Each side is warmed
up on the first prompt before timing. Target and draft forward calls of HF are
counted with hooks, so its tokens per target call are measured, not assumed.

Needs the ``hf`` extra (torch, transformers).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from specsamp import sharding
from specsamp.experiments.benchmarks import timing
from specsamp.hf import convert
from specsamp.sampling import autoregressive, speculative

MODES = {"greedy": dict(temperature=0.0, top_p=1.0), "nucleus": dict(temperature=0.8, top_p=0.95)}


def _count(output: tuple[list[int], int]) -> tuple[int, int]:
  """(tokens, tokens) of one prompt's (generated ids, target calls): batch 1."""
  return len(output[0]), len(output[0])


def _time(
  name: str, sample: Callable[[np.ndarray, int], tuple[list[int], int]], prompts: np.ndarray
) -> timing.Timed:
  """Each prompt once, batch 1; each output is (generated ids, target calls)."""
  return timing.time_sampler(name, sample, list(prompts), count=_count)


def _target_calls(side: timing.Timed) -> int:
  return sum(calls for _, calls in side.outputs)


class _CallCounter:
  def __init__(self, module):
    self.count = 0
    module.register_forward_hook(self._hook)

  def _hook(self, *_):
    self.count += 1


def export_pair(target: Any, draft: Any, directory: str, tokenizer=None) -> dict[str, str]:
  """Exports both models to ``directory``/target and /draft in the HF format, each unless it is
  there already (an export writes its config.json last, so a folder without one is an
  interrupted export of this cache, written again); returns {"target": path, "draft": path}."""
  paths = {}
  for name, model in (("target", target), ("draft", draft)):
    paths[name] = os.path.join(directory, name)
    if not os.path.exists(os.path.join(paths[name], "config.json")):
      shutil.rmtree(paths[name], ignore_errors=True)
      convert.export_model(model, paths[name], tokenizer=tokenizer)
  return paths


def load_hf(directory: str, dtype: str = "float32", device: str = "cpu"):
  """An exported model in transformers, in ``dtype`` on ``device``, with no EOS stop."""
  import torch
  import transformers

  model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype))
  model.to(device)
  model.eval()
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  return model


def run(
  pair,
  draft,
  *,
  num_draft_tokens: int,
  max_new_tokens: int,
  modes=("greedy", "nucleus"),
  seed: int = 0,
  export_dir: str | None = None,
  hf_device: str = "cpu",
  hf_dtype: str = "float32",
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """Exports ``pair.target`` and ``draft`` to HF format, then times both libraries on
  ``pair.prompts`` (HF on ``hf_device`` in ``hf_dtype``; specsamp where its models are).

  Returns a JSON-able dict: per mode, per sampler, tokens/s, tokens per target
  call and the ratio of specsamp's tokens/s to HF's.
  """
  import torch
  import transformers

  # transformers 5 keeps its generation defaults (num_assistant_tokens 20, the confidence
  # cut-off 0.4) out of GenerationConfig() and fills them in at generate time.
  hf_defaults = transformers.GenerationConfig(
    **transformers.GenerationConfig._get_default_generation_params()
  )
  export_dir = export_dir or tempfile.mkdtemp(prefix="specsamp_hf_")
  directories = export_pair(pair.target, draft, export_dir, pair.tokenizer)
  log(
    f"exported the pair to {export_dir} ({pair.target.config.num_layers}-layer target, "
    f"{draft.config.num_layers}-layer draft)"
  )
  hf_target, hf_draft = (
    load_hf(directories[name], hf_dtype, hf_device) for name in ("target", "draft")
  )
  target_calls = _CallCounter(hf_target)
  n = max_new_tokens
  prompts = pair.prompts
  length = np.array([prompts.shape[1]], np.int32)
  results: dict[str, Any] = {
    "hf_defaults": {
      name: getattr(hf_defaults, name)
      for name in (
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
      )
    },
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "num_draft_tokens": num_draft_tokens,
    "max_new_tokens": n,
    "num_prompts": len(prompts),
    "prompt_tokens": prompts.shape[1],
    "torch_threads": torch.get_num_threads(),
    "hf_device": str(hf_device),
    "hf_dtype": hf_dtype,
    "jax_devices": [str(d) for d in jax.devices()],
    "modes": {},
  }
  for mode in modes:
    mode_settings = MODES[mode]
    do_sample = mode_settings["temperature"] > 0
    sampling = dict(do_sample=do_sample, max_new_tokens=n, min_new_tokens=n)
    if do_sample:
      sampling.update(
        temperature=mode_settings["temperature"], top_p=mode_settings["top_p"], top_k=0
      )

    def hf_sample(prompt, index, assisted: str | None):
      torch.manual_seed(seed + index)
      options = dict(sampling)
      if assisted is not None:
        draft_config = hf_draft.generation_config
        if assisted == "constant":
          draft_config.num_assistant_tokens = num_draft_tokens
          draft_config.num_assistant_tokens_schedule = "constant"
          draft_config.assistant_confidence_threshold = 0.0
        else:  # transformers' own defaults.
          for name in (
            "num_assistant_tokens",
            "num_assistant_tokens_schedule",
            "assistant_confidence_threshold",
          ):
            setattr(draft_config, name, getattr(hf_defaults, name))
        options["assistant_model"] = hf_draft
      before = target_calls.count
      with torch.no_grad():
        out = hf_target.generate(torch.as_tensor(prompt[None]).to(hf_device), **options)
      return out[0, len(prompt) :].tolist(), target_calls.count - before

    def ours(prompt, index, draft_model):
      key = jax.random.fold_in(jax.random.key(seed), index)
      with sharding.use_mesh(pair.mesh):
        if draft_model is None:
          out = autoregressive.generate(
            pair.target, prompt[None], length, key, max_new_tokens=n, **mode_settings
          )
          calls = int(out.model_calls)
        else:
          out = speculative.speculative_generate(
            pair.target,
            draft_model,
            prompt[None],
            length,
            key,
            max_new_tokens=n,
            num_draft_tokens=num_draft_tokens,
            **mode_settings,
          )
          calls = int(out.model_calls)
      return np.asarray(out.generated(0)).tolist(), calls

    sides = [
      _time("hf autoregressive", lambda p, i: hf_sample(p, i, None), prompts),
      _time(
        f"hf assisted (K={num_draft_tokens})", lambda p, i: hf_sample(p, i, "constant"), prompts
      ),
      _time("hf assisted (hf defaults)", lambda p, i: hf_sample(p, i, "default"), prompts),
      _time("specsamp autoregressive", lambda p, i: ours(p, i, None), prompts),
      _time(
        f"specsamp speculative (K={num_draft_tokens})", lambda p, i: ours(p, i, draft), prompts
      ),
    ]
    by_name = {side.name: side for side in sides}
    entry = {
      side.name: {
        "tokens_per_s": side.tokens_per_s,
        "tokens_per_target_call": sum(side.tokens) / max(_target_calls(side), 1),
        "seconds": side.run_s,
        "tokens": sum(side.tokens),
      }
      for side in sides
    }
    hf_assisted = by_name[f"hf assisted (K={num_draft_tokens})"]
    ours_spec = by_name[f"specsamp speculative (K={num_draft_tokens})"]
    entry["ratio_vs_hf_assisted"] = ours_spec.tokens_per_s / hf_assisted.tokens_per_s
    entry["ratio_vs_hf_best"] = ours_spec.tokens_per_s / max(
      s.tokens_per_s for s in sides if s.name.startswith("hf")
    )
    entry["ratio_at_equal_acceptance"] = ratio_at_equal_acceptance(
      entry, num_draft_tokens, len(prompts)
    )
    if not do_sample:  # Greedy: every sampler must emit the target's greedy tokens.
      reference = [ids for ids, _ in by_name["specsamp autoregressive"].outputs]
      entry["greedy_outputs_identical"] = all(
        [ids for ids, _ in s.outputs] == reference for s in sides
      )
    results["modes"][mode] = entry
    log(format_mode(mode, entry))
  return results


def ratio_at_equal_acceptance(
  entry: dict[str, Any], num_draft_tokens: int, num_prompts: int
) -> float:
  """specsamp's tokens/s over HF assisted's, rescaled to equal tokens per verification call.

  The two count calls differently: HF's first target call verifies drafts along with the
  prompt, while specsamp's prefill emits one token and verification starts after it. So
  tokens per verification are HF's tokens/calls and specsamp's (tokens - 1) / (calls - 1)
  per prompt; with greedy decoding (identical decisions) the two agree and the factor is 1.
  """
  ours, theirs = (
    entry[f"specsamp speculative (K={num_draft_tokens})"],
    entry[f"hf assisted (K={num_draft_tokens})"],
  )
  ours_calls = ours["tokens"] / ours["tokens_per_target_call"]
  ours_per_verify = (ours["tokens"] - num_prompts) / (ours_calls - num_prompts)
  return entry["ratio_vs_hf_assisted"] * theirs["tokens_per_target_call"] / ours_per_verify


def format_mode(mode: str, entry: dict[str, Any]) -> str:
  mode_settings = MODES[mode]
  title = (
    "greedy"
    if mode_settings["temperature"] == 0
    else (f"temperature {mode_settings['temperature']}, top-p {mode_settings['top_p']}")
  )
  lines = [f"{mode} ({title}):"]
  for name, side in entry.items():
    if isinstance(side, dict):
      lines.append(
        f"  {name:<32} {side['tokens_per_s']:8.1f} tokens/s   "
        f"{side['tokens_per_target_call']:5.2f} tokens/target call"
      )
  lines.append(
    f"  specsamp speculative / hf assisted (same K): {entry['ratio_vs_hf_assisted']:.2f}x"
    f"   / best hf: {entry['ratio_vs_hf_best']:.2f}x   at equal tokens per verification: "
    f"{entry['ratio_at_equal_acceptance']:.2f}x"
  )
  if "greedy_outputs_identical" in entry:
    lines.append(f"  greedy outputs identical across all five: {entry['greedy_outputs_identical']}")
  return "\n".join(lines)
