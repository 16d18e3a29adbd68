r"""The target's own answers to a prompt set, as token shards for training its drafters.

A drafter accepts what it predicts of the *target's* text, so it is trained on text the target
wrote in answer to chat prompts (EAGLE-3, SpecForge and vLLM's speculators regenerate ShareGPT /
UltraChat; regeneration is the largest single lever on acceptance). ``regenerate`` has the
target answer ``instructions`` prompts through its chat template, batched and on device, under
one or more sampling settings (greedy, and T > 0: a drafter meets both), and writes (a base
model, whose tokenizer has no chat template, continues the messages' text instead):

  OUT/shard_00000.npz ...  one per ``shard_prompts`` prompts: ``tokens`` (prompt + answer,
                          back to back), ``offsets`` [n + 1], ``prompt_lengths`` [n], ``finished``
                          [n] (the answer ended with EOS, not at ``max_new_tokens``), ``ids`` [n]
  OUT/manifest.json       what was asked (target, tokenizer, settings, sizes) and each shard
                          done: its setting, prompts, tokens, answer tokens, seconds, and how
                          many of its answers' 4-grams repeat one earlier in the same answer
                          (``repeated_ngrams``: a looping target warns)

A shard is written whole before the manifest names it (both by rename), so a run stopped at any
point resumes where it stopped and never reads half a shard; a directory made for another target,
tokenizer or plan is refused. The prompts are cut into N blocks of ``shard_prompts``; shard i
answers block ``i % N`` in pass ``p = i // N`` with setting ``(i % N + p) % len(settings)``. With
one pass (the default) each prompt is answered once and the settings alternate; with two passes
and two settings each prompt is answered once greedily and once sampled (a second pass extends a
finished run: its first shards are the same whatever the number of passes).

Prompts are shuffled once (``seed``), cut into shards, and each shard's prompts are sorted by
length. Shards of one setting are answered together (``GROUP_BATCHES`` batches' prompts or more,
in order), ``batch_size`` rows at a time: as rows finish, the next prompts are prefilled into
their places (continuous batching, ``compacting.generate``), so a row rarely idles until the
group's last answers; each prefill pads its prompts to a multiple of ``WIDTH_STEP`` tokens, so
that few programs compile. A shard is written as soon as its last answer ends. A prompt longer
than ``max_prompt_tokens`` is skipped and counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from specsamp import files, multihost
from specsamp.config_fields import is_int
from specsamp.sampling import compacting
from specsamp.training import instructions, target_store
from specsamp.training import tokenizer as tokenizer_lib

SETTINGS = {"greedy": (0.0, 1.0), "nucleus": (0.8, 0.95), "t1": (1.0, 1.0)}
"""Sampling settings by name: (temperature, top_p)."""
WIDTH_STEP = 64
GROUP_BATCHES = 4
"""Shards of one setting are answered together, at least this many batches' prompts, so that
prompts waiting refill the batch as rows finish (``compacting.generate``)."""
MANIFEST = "manifest.json"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a regeneration run asks for; a resumed run must ask for the same."""

  settings: tuple[str, ...] = ("greedy", "nucleus")
  batch_size: int = 64
  max_prompt_tokens: int = 384
  max_new_tokens: int = 256
  shard_prompts: int = 128
  split: str = "train"  # 'train', or 'held_out' (instructions.held_out's prompts).
  seed: int = 0
  max_prompts: int = 0  # Answer only the first this many of the shuffled split (0: all).
  passes: int = 1  # Times the prompts are answered, each pass with the next setting (module doc).

  def __post_init__(self):
    unknown = [s for s in self.settings if s not in SETTINGS]
    if not self.settings or unknown:
      raise ValueError(f"settings must be some of {sorted(SETTINGS)}, got {self.settings}.")
    if len(set(self.settings)) != len(self.settings):
      raise ValueError(f"settings must not repeat, got {self.settings}.")
    if self.max_prompts < 0:
      raise ValueError(f"max_prompts must be >= 0 (0: all), got {self.max_prompts}.")
    if min(self.batch_size, self.max_prompt_tokens, self.max_new_tokens, self.shard_prompts) < 1:
      raise ValueError(f"Every size of the plan must be >= 1: {self}.")
    if self.split not in ("train", "held_out"):
      raise ValueError(f"split must be 'train' or 'held_out', got {self.split!r}.")
    if self.passes < 1:
      raise ValueError(f"passes must be >= 1, got {self.passes}.")
    if "greedy" in self.settings and self.passes > len(self.settings):
      raise ValueError(
        f"passes={self.passes} with settings {self.settings} would answer a prompt greedily "
        "twice, the same answer both times: at most one pass per setting when one is greedy."
      )

  def setting(self, shard: int, blocks: int) -> str:
    """Shard ``shard``'s setting, for a split of ``blocks`` blocks of prompts (module doc)."""
    return self.settings[(shard % blocks + shard // blocks) % len(self.settings)]


def encode(
  prompts: Sequence[instructions.Prompt], tokenizer: Any, max_prompt_tokens: int
) -> tuple[list[str], list[np.ndarray], int]:
  """(ids, token rows, skipped): the prompts through the chat template, with the generation
  prompt (a tokenizer without one, a base model's: the messages' text, one after another, BOS
  first where the tokenizer asks for it); those longer than ``max_prompt_tokens`` skipped.
  A template writes the special tokens it wants (Llama's, Gemma's and Mistral's begin with
  ``bos_token``), so its text gets no BOS added: transformers' ``apply_chat_template`` adds none."""
  ids, rows, skipped = [], [], 0
  for prompt in prompts:
    if tokenizer.chat_template is None:
      text = "\n\n".join(m["content"] for m in prompt.messages) + "\n\n"
      add_bos = getattr(tokenizer, "add_bos", False)
    else:
      try:
        text = tokenizer.apply_chat_template(list(prompt.messages))
      except ValueError as e:  # The template refused the messages (a role it does not take).
        raise ValueError(f"Prompt {prompt.id}: {e}") from e
      add_bos = False
    row = tokenizer.encode(text, add_bos=add_bos)
    if len(row) > max_prompt_tokens:
      skipped += 1
      continue
    ids.append(prompt.id)
    rows.append(np.asarray(row, np.int32))
  return ids, rows, skipped


def read_manifest(out_dir: str) -> dict[str, Any] | None:
  path = os.path.join(out_dir, MANIFEST)
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      manifest = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(
      f"{path} is not a regeneration manifest ({e}); restore it (a shipped one: git checkout)."
    ) from None
  if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
    raise ValueError(f"{path} is not a regeneration manifest (no list of shards).")
  for number, shard in enumerate(manifest["shards"]):  # An edited entry failed as a KeyError.
    if not isinstance(shard, dict) or not all(
      isinstance(shard.get(key), str) for key in ("file", "setting")
    ):
      raise ValueError(
        f"{path}: shard entry {number} ({str(shard)[:80]}) names no file and setting; restore "
        "the manifest (a shipped one: git checkout)."
      )
  return manifest


def load_shard(directory: str, name: str) -> dict[str, np.ndarray]:
  """A shard's arrays, or ValueError naming the file when it is missing or damaged."""
  path = os.path.join(directory, name)
  if not os.path.exists(path):
    raise ValueError(
      f"{path}: the shard its folder's {MANIFEST} names is missing; restore it (a shipped "
      "shard: git checkout), or in a workdir run scripts/regenerate.py again to answer it again."
    )
  try:
    with np.load(path) as f:
      return {name: f[name] for name in f.files}
  except Exception as e:  # A truncated or damaged zip: BadZipFile, EOFError, ValueError, ...
    raise ValueError(
      f"{path} is damaged ({type(e).__name__}: {e}); restore it (a shipped shard: git "
      "checkout), or delete it and run scripts/regenerate.py again to answer its prompts again."
    ) from None


def _intact(directory: str, name: str) -> bool:
  try:
    load_shard(directory, name)
  except ValueError:
    return False
  return True


def _write_manifest(out_dir: str, manifest: dict[str, Any]) -> None:
  files.write_json(os.path.join(out_dir, MANIFEST), manifest)  # Every host writes it: atomic.


REPEAT_NGRAM = 4
REPEAT_WARNING = 0.5
"""A shard whose answers repeat more than this fraction of their 4-grams is degenerate text (a
weak or greedy target in a loop): a drafter learns the loop, and tau on such answers says how
well it does that, not how well it drafts."""


def repeated_ngrams(answer: np.ndarray, n: int = REPEAT_NGRAM) -> tuple[int, int]:
  """(repeated, counted): of the answer's n-grams (one ending at each token from the n-th on),
  how many occurred earlier in the same answer. A loop repeats nearly all of them, prose and
  code a few."""
  seen, repeated = set(), 0
  grams = [tuple(answer[i - n : i].tolist()) for i in range(n, len(answer) + 1)]
  for gram in grams:
    repeated += gram in seen
    seen.add(gram)
  return repeated, len(grams)


def repetition(shards: list[dict[str, Any]]) -> float | None:
  """The pooled fraction of repeated 4-grams of the manifest's shards (None if none counted)."""
  counted = sum(s.get("ngrams", 0) for s in shards)
  return sum(s.get("repeated_ngrams", 0) for s in shards) / counted if counted else None


def repetition_warning(shards: list[dict[str, Any]], what: str) -> str | None:
  """A warning when the shards' answers repeat more than ``REPEAT_WARNING`` of their 4-grams
  (None otherwise, and for a manifest written before they were counted)."""
  share = repetition(shards)
  if share is None or share <= REPEAT_WARNING:
    return None
  return (
    f"warning: {what} repeat {share:.0%} of their {REPEAT_NGRAM}-grams (the target loops): a "
    "drafter trained on them learns the loop, and tau measured on such answers says little "
    "about drafting real text. A stronger target, or a T > 0 setting, gives text worth "
    "training on."
  )


def pad_batch(
  rows: list[np.ndarray], batch_size: int, pad_id: int, width_step: int = WIDTH_STEP
) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [batch_size, width], lengths): the prompt rows right-padded with ``pad_id`` to a
  multiple of ``width_step`` tokens (each width compiles once); rows past ``len(rows)`` repeat
  the last prompt (their answers are dropped)."""
  width = -(-max(len(r) for r in rows) // width_step) * width_step
  tokens = np.full((batch_size, width), pad_id, np.int32)
  lengths = np.ones(batch_size, np.int32)
  for i in range(batch_size):
    row = rows[min(i, len(rows) - 1)]
    tokens[i, : len(row)], lengths[i] = row, len(row)
  return tokens, lengths


def _answer_group(
  target: Any,
  rows: list[np.ndarray],
  plan: Plan,
  setting: str,
  eos_id: Sequence[int],
  pad_id: int,
  key,
  width_step: int,
  compact: bool,
  admit: Callable[[int], bool],
  on_answer: Callable[[int, np.ndarray, bool], None],
) -> int:
  """The target's answers to ``rows`` (prompts), ``plan.batch_size`` at a time, waiting prompts
  taking the places of finished rows (``compacting.generate``; each prefill padded to a
  multiple of ``width_step`` tokens); ``compact``: once none waits, finished rows leave the
  batch. ``on_answer(i, prompt + answer, ended with EOS)`` hears of each answer as it ends;
  ``admit(i)`` is asked before prompt i starts. Returns how many prompts started."""
  tokens, lengths = pad_batch(rows, len(rows), pad_id, width_step)
  temperature, top_p = SETTINGS[setting]

  def finished(indices, row_tokens, ends):
    for i, row, end in zip(indices, row_tokens, ends):
      ended = bool(end > lengths[i] and int(row[end - 1]) in eos_id)
      on_answer(int(i), np.concatenate([rows[i], row[lengths[i] : end]]), ended)

  out = compacting.generate(
    target,
    tokens,
    lengths,
    key,
    max_new_tokens=plan.max_new_tokens,
    temperature=temperature,
    top_p=top_p,
    eos_id=eos_id,
    pad_id=pad_id,
    batch_size=plan.batch_size,
    compact=compact,
    width_step=width_step,
    admit=admit,
    on_finished=finished,
  )
  return out.admitted


IDENTITY = (
  "version",
  "target",
  "target_weights",
  "tokenizer",
  "plan",
  "prompts",
  "prompts_sha256",
)
"""The manifest's keys that say which run made a directory (``differing`` compares them).
``target_weights`` (``target_store.parameters_fingerprint``) since 2026-11-30: "target" names a
trained target "trained:LxD" alone, so two targets of one shape trained apart (another learning
rate, more steps) filled one directory unnoticed. Manifests from before lack it; it is compared
where both sides record it."""


def tokenizer_identity(tokenizer: Any) -> str:
  """A manifest's ``tokenizer``: the tokenizer's fingerprint, and with several stop ids, those
  (the answers end at any of them: another run than one that stops at the EOS alone; a
  single-stop tokenizer's identity is its fingerprint, as before they existed)."""
  if len(tokenizer.stop_ids) == 1:
    return tokenizer.fingerprint
  return f"{tokenizer.fingerprint} stops {list(tokenizer.stop_ids)}"


def tokenization_of(identity: str) -> str:
  """The fingerprint in a manifest's ``tokenizer`` (``tokenizer_identity``): how its answers
  were tokenized, whichever stop ids they ended at."""
  return identity.split(" stops ")[0]


def _save_shard(path: str, arrays: dict[str, np.ndarray]) -> None:
  """A shard, compressed, its token ids in 16 bits where they fit (SmolLM2's 49,152 do): about
  a sixth of the raw int32 size, so that answers can ship with a drafter in the repository
  (``merge``); ``read_shards`` gives int32 back."""
  tokens = arrays["tokens"]
  if tokens.size and tokens.min() >= 0 and tokens.max() < 1 << 16:
    arrays = dict(arrays, tokens=tokens.astype(np.uint16))
  with open(path, "wb") as f:
    np.savez_compressed(f, **arrays)


def merge(from_dir: str, to_dir: str, log: Callable[[str], None] = print) -> int:
  """Copies into ``to_dir`` every shard ``from_dir``'s manifest names and ``to_dir``'s lacks
  (recompressed by ``_save_shard``), then rewrites ``to_dir``'s manifest; returns how many.

  This is how answers travel: a workdir starts from the ones shipped in the repository, and
  the answers a run adds (on this machine or a lent accelerator) are merged back to ship.
  A shard both hold stays as ``to_dir`` has it. ``to_dir`` without a manifest takes
  ``from_dir``'s run; one made by another run (target, tokenizer, plan or prompts) is refused
  and left as it was."""
  theirs = read_manifest(from_dir)
  if theirs is None:
    raise FileNotFoundError(f"No regenerated shards in {from_dir} (no {MANIFEST}).")
  refuse_another_run(to_dir, theirs, from_dir)
  ours = read_manifest(to_dir)
  if ours is None:
    ours = dict({k: v for k, v in theirs.items() if k != "shards"}, shards=[])
  ours["plan"]["passes"] = max(ours["plan"].get("passes", 1), theirs["plan"].get("passes", 1))
  # A shard of ours that is missing or damaged is taken from theirs where they have it whole.
  theirs_named = {shard["file"] for shard in theirs["shards"]}
  broken = {
    shard["file"]
    for shard in ours["shards"]
    if shard["file"] in theirs_named and not _intact(to_dir, shard["file"])
  }
  ours["shards"] = [shard for shard in ours["shards"] if shard["file"] not in broken]
  have = {shard["file"] for shard in ours["shards"]}
  new = [shard for shard in theirs["shards"] if shard["file"] not in have]
  os.makedirs(to_dir, exist_ok=True)
  for shard in new:
    arrays = load_shard(from_dir, shard["file"])
    files.write_atomically(
      os.path.join(to_dir, shard["file"]), lambda path, a=arrays: _save_shard(path, a)
    )
  if broken:
    log(f"regenerate: {len(broken)} missing or damaged shards in {to_dir} replaced from {from_dir}")
  ours["shards"] = sorted(ours["shards"] + new, key=lambda s: s["file"])
  if new or read_manifest(to_dir) is None:  # Nothing new: the folder stays as it was.
    _write_manifest(to_dir, ours)
  log(
    f"regenerate: {len(new)} shards from {from_dir} into {to_dir} ({len(ours['shards'])} there now)"
  )
  return len(new)


def differing(one: dict[str, Any], other: dict[str, Any]) -> list[str]:
  """The ``IDENTITY`` fields in which two runs (manifests or identities) differ, up to what a
  resumed run may change (``_resumable``); ``target_weights`` only where both record it."""
  one, other = (
    _resumable(json.loads(json.dumps({k: x.get(k) for k in IDENTITY}))) for x in (one, other)
  )
  return [
    k
    for k in IDENTITY
    if one[k] != other[k] and not (k == "target_weights" and None in (one[k], other[k]))
  ]


def refuse_another_run(directory: str, identity: dict[str, Any], what: str) -> None:
  """Raises ValueError when ``directory`` holds shards of another run than ``identity``'s
  (``IDENTITY``, up to what a resumed run may change): nothing is copied into it."""
  ours = read_manifest(directory)
  if ours is not None and (keys := differing(ours, identity)):
    raise ValueError(
      f"{directory} holds another run's shards than {what} ({', '.join(keys)} differ); "
      "nothing was copied."
    )


def seed(
  from_dir: str,
  to_dir: str,
  log: Callable[[str], None] = print,
  identity: dict[str, Any] | None = None,
) -> int:
  """``merge`` when ``from_dir`` has shards ``to_dir`` lacks and they come from the same run as
  ``to_dir``'s and as ``identity`` (the run that asks, if any); otherwise copies nothing (and
  says why, if they are another run's). Returns how many shards were copied."""
  theirs, ours = read_manifest(from_dir), read_manifest(to_dir)
  have = {
    shard["file"]
    for shard in (ours or {"shards": []})["shards"]
    if os.path.exists(os.path.join(to_dir, shard["file"]))
  }
  if theirs is None or not {shard["file"] for shard in theirs["shards"]} - have:
    return 0  # Nothing to add (quietly: every run of a seeded workdir asks).
  for other, what in ((identity, "this run"), (ours, to_dir)):
    if other is not None and differing(theirs, other):
      log(f"regenerate: the shards in {from_dir} come from another run than {what}; not used")
      return 0
  return merge(from_dir, to_dir, log)


def _resumable(identity: dict[str, Any]) -> dict[str, Any]:
  """What a resumed run must share with the one that began its directory: everything but the
  batch size, which changes how many prompts are answered together (and, when sampling, which
  random draws each gets), not which prompts, target or settings the shards hold (a run resumed
  on a larger machine can answer more at once; each shard records its own), and the number of
  passes, which adds shards after the others and changes none of them."""
  plan = identity.get("plan") or {}
  plan = {k: v for k, v in plan.items() if k not in ("batch_size", "passes")}
  return dict(identity, plan=plan)


def regenerate(
  target: Any,
  tokenizer: Any,
  prompts: Sequence[instructions.Prompt],
  out_dir: str,
  plan: Plan,
  *,
  target_id: str,
  max_shards: int | None = None,
  max_seconds: float | None = None,
  width_step: int = WIDTH_STEP,
  seed_dir: str | None = None,
  compact: bool = True,
  merge_into: str | None = None,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """Writes (or completes) ``out_dir``'s shards (module docstring); returns the manifest.

  Args:
    target: the model that answers (decode protocol).
    tokenizer: its tokenizer, with a chat template.
    prompts: the prompt set (``instructions``); ``plan.split`` picks its training or held-out
      part.
    out_dir: the shards' directory (made if missing).
    plan: settings and sizes.
    target_id: what names the target (e.g. its checkpoint's source); a resumed run must match.
    max_shards: stop after this many new shards (None: all).
    max_seconds: start no new shard after this many seconds (None: no limit); a shard begun
      is finished, so a run on a lent machine ends inside its time with whole shards.
    width_step: batches pad their prompts to a multiple of this many tokens: each width is a
      program to compile. A GPU compiles for longer than it decodes a shard: there,
      ``plan.max_prompt_tokens`` makes one width for every batch.
    seed_dir: shards made before (those shipped in the repository): ``out_dir`` first takes
      those it lacks when they come from this very run (target, tokenizer, plan, prompts:
      ``seed``), so that only the others are answered; another run's are ignored.
    compact: once no prompt of a group waits, its finished rows leave the batch between
      chunks of steps (``compacting``); each smaller batch compiles a program once, which on a
      GPU with minutes to run costs more than it saves (False: the batch keeps its size, one
      decode program). Waiting prompts refill the batch either way.
    merge_into: where the caller will ``merge`` the shards afterwards (scripts/regenerate.py
      --ship_to): refused before anything is decoded if it holds another run's shards (the
      merge refuses them too, after the run).
    log: progress lines.
  """
  began = time.perf_counter()
  if max_shards is not None and (not is_int(max_shards) or max_shards < 0):  # -2: all but two.
    raise ValueError(f"max_shards must be None or an int >= 0, got {max_shards!r}.")
  if max_seconds is not None and not max_seconds >= 0:
    raise ValueError(f"max_seconds must be None or >= 0, got {max_seconds!r}.")
  tokenizer_lib.check_stop_ids(tokenizer, target.vocab_size)
  chosen = [p for p in prompts if instructions.held_out(p.id) == (plan.split == "held_out")]
  if not chosen:
    raise ValueError(
      f"None of the {len(prompts)} prompts is in the {plan.split} split (about 1 in "
      f"{instructions.HELD_OUT_EVERY} is held out, by a hash of its id): give more prompts."
    )
  order = np.random.default_rng(plan.seed).permutation(len(chosen))
  ids, rows, skipped = encode([chosen[i] for i in order], tokenizer, plan.max_prompt_tokens)
  if not rows:
    raise ValueError(f"No prompt of the {plan.split} split fits max_prompt_tokens.")
  if plan.max_prompts:
    ids, rows = ids[: plan.max_prompts], rows[: plan.max_prompts]
  digest = hashlib.sha256()
  for prompt_id, row in zip(ids, rows):  # The prompts themselves, in order: an edited set differs.
    digest.update(prompt_id.encode() + b"\0" + row.tobytes())
  identity = {
    "version": VERSION,
    "target": target_id,
    "target_weights": target_store.parameters_fingerprint(target),
    "tokenizer": tokenizer_identity(tokenizer),
    "plan": dataclasses.asdict(plan),
    "prompts": len(rows),
    "prompts_sha256": digest.hexdigest(),
  }
  if merge_into:
    refuse_another_run(merge_into, identity, f"this run ({out_dir})")
  os.makedirs(out_dir, exist_ok=True)
  if seed_dir:
    seed(seed_dir, out_dir, log, identity)
  manifest = read_manifest(out_dir)
  if manifest is None:
    manifest = dict(identity, skipped=skipped, shards=[])
  else:
    if keys := differing(manifest, identity):
      theirs = {k: manifest.get(k) for k in keys}
      raise ValueError(
        f"{out_dir} holds another run's shards ({theirs}); this run asks for "
        f"{ {k: identity[k] for k in keys} }. Use another output directory; nothing there was "
        "changed."
      )
    # The most passes any run over this directory asked for (its shards are there).
    manifest["plan"]["passes"] = max(manifest["plan"].get("passes", 1), plan.passes)
  lost = [
    s["file"] for s in manifest["shards"] if not os.path.exists(os.path.join(out_dir, s["file"]))
  ]
  if lost:  # Named but deleted (to answer them again): they are answered again.
    log(f"regenerate: {len(lost)} shards the manifest names are missing, answered again: {lost}")
    manifest["shards"] = [s for s in manifest["shards"] if s["file"] not in lost]
  done = {shard["file"] for shard in manifest["shards"]}
  blocks = -(-len(rows) // plan.shard_prompts)
  total = blocks * plan.passes
  pending = [i for i in range(total) if f"shard_{i:05d}.npz" not in done]
  if max_shards is not None:
    pending = pending[:max_shards]
  # Shards of one setting answer together, so that waiting prompts refill the batch across
  # them: at least GROUP_BATCHES batches' prompts in a group (a shard's own tail would idle).
  per_group = max(1, -(-GROUP_BATCHES * plan.batch_size // plan.shard_prompts))
  out_of_time = interrupted = False

  def write(index: int, shard: dict[str, Any]) -> None:
    """Shard ``index``, all its prompts answered: written, then named in the manifest."""
    name, sequences = f"shard_{index:05d}.npz", shard["answers"]
    prompt_lengths = np.asarray([len(row) for row in shard["rows"]], np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sequences])]).astype(np.int64)
    arrays = {
      "tokens": np.concatenate(sequences).astype(np.int32),
      "offsets": offsets,
      "prompt_lengths": prompt_lengths,
      "finished": np.asarray(shard["finished"]),
      "ids": np.asarray(shard["ids"]),
    }
    files.write_atomically(os.path.join(out_dir, name), lambda path, a=arrays: _save_shard(path, a))
    seconds = time.perf_counter() - shard["began"]
    answer_tokens = int(offsets[-1] - prompt_lengths.sum())
    counts = [repeated_ngrams(s[n:]) for s, n in zip(sequences, prompt_lengths)]
    entry = {
      "file": name,
      "setting": shard["setting"],
      "prompts": len(sequences),
      "tokens": int(offsets[-1]),
      "answer_tokens": answer_tokens,
      "finished": int(np.sum(shard["finished"])),
      "repeated_ngrams": sum(c[0] for c in counts),
      "ngrams": sum(c[1] for c in counts),
      "seconds": round(seconds, 1),
      "batch_size": plan.batch_size,
    }
    manifest["shards"].append(entry)
    manifest["shards"].sort(key=lambda s: s["file"])
    _write_manifest(out_dir, manifest)
    log(
      f"regenerate: {name} ({shard['setting']}) {len(sequences)} answers, {answer_tokens:,} "
      f"answer tokens in {seconds:.0f} s since it began "
      f"({repetition([entry]) or 0.0:.0%} of their {REPEAT_NGRAM}-grams repeated); "
      f"{len(manifest['shards'])}/{total} shards"
    )
    warning = repetition_warning([entry], f"{name}'s answers")
    if warning:
      log(f"regenerate: {warning}")

  # The first Ctrl-C begins no new shard; the shards begun are answered and written, then the
  # run stops (a second Ctrl-C stops it at once, losing those). Agreed across hosts.
  interrupt = multihost.DeferredInterrupt(
    "regenerate: Ctrl-C: the shards begun are answered and written, then the run stops "
    "(Ctrl-C again to stop at once, losing them)"
  )
  try:
    while pending and not (out_of_time or interrupted):
      setting = plan.setting(pending[0], blocks)
      group = [i for i in pending if plan.setting(i, blocks) == setting][:per_group]
      pending = [i for i in pending if i not in group]
      shards, places = {}, []  # places[k]: (shard, its k-th prompt by length) of the group's k.
      for index in group:
        first = (index % blocks) * plan.shard_prompts
        shard_ids = ids[first : first + plan.shard_prompts]
        shard_rows = rows[first:][: plan.shard_prompts]
        by_length = sorted(range(len(shard_rows)), key=lambda i: len(shard_rows[i]))
        shards[index] = {
          "setting": setting,
          "ids": [shard_ids[i] for i in by_length],
          "rows": [shard_rows[i] for i in by_length],
          "answers": [None] * len(by_length),
          "finished": [False] * len(by_length),
          "left": len(by_length),
          "began": None,
        }
        places += [(index, k) for k in range(len(by_length))]

      def admit(k: int) -> bool:
        """A shard begun is finished; none begins once ``max_seconds`` are spent or after a
        Ctrl-C."""
        nonlocal out_of_time, interrupted
        shard = shards[places[k][0]]
        if shard["began"] is None:
          if interrupt.requested_anywhere():
            log(f"regenerate: interrupted; stopping before shard_{places[k][0]:05d}.npz")
            interrupted = True
            return False
          if multihost.out_of_time(began, time.perf_counter(), max_seconds):
            log(
              f"regenerate: {max_seconds:g} s spent; stopping before shard_{places[k][0]:05d}.npz "
              "(resume to go on)"
            )
            out_of_time = True
            return False
          shard["began"] = time.perf_counter()
        return True

      def on_answer(k: int, sequence: np.ndarray, ended: bool) -> None:
        index, position = places[k]
        shard = shards[index]
        shard["answers"][position], shard["finished"][position] = sequence, ended
        shard["left"] -= 1
        if not shard["left"]:
          write(index, shard)

      _answer_group(
        target,
        [shards[index]["rows"][position] for index, position in places],
        plan,
        setting,
        tokenizer.stop_ids,
        tokenizer.pad_id,
        jax.random.fold_in(jax.random.key(plan.seed), group[0]),
        width_step,
        compact,
        admit,
        on_answer,
      )
  finally:
    interrupt.restore()
  if interrupted:
    log(f"regenerate: {len(manifest['shards'])}/{total} shards written; resume to go on")
    raise KeyboardInterrupt
  return manifest


def read_shards(out_dir: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(tokens, offsets, prompt_lengths) of every shard the manifest names, in order."""
  manifest = read_manifest(out_dir)
  if manifest is None:
    raise FileNotFoundError(f"No regenerated shards in {out_dir} (no {MANIFEST}).")
  shards = []
  for shard in manifest["shards"]:
    f = load_shard(out_dir, shard["file"])
    shards.append((f["tokens"].astype(np.int32), f["offsets"], f["prompt_lengths"]))
  return shards
