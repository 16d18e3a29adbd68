"""Training a target or a draft with optax, sharded over the mesh, checkpointed with orbax.

* Optimizer: AdamW (no decay on vectors: norms, biases), linear warmup then
  cosine decay, global-norm gradient clipping.
* One jitted train step; parameters, optimizer state and batches are placed by
  the rules table in ``sharding.py`` (data parallel over ``data``/``fsdp``,
  Megatron tensor parallel over ``tensor``), so the same code trains on one
  CPU or on a pod slice.
* Draft distillation (Chen et al. section 4; Leviathan et al.): ``distill.mode``
    'none'     cross-entropy on the corpus (a draft trained from scratch);
    'token'    token-level KL(target || draft) on corpus text, the target's
               distribution at ``distill.temperature`` as soft labels;
    'sequence' cross-entropy on sequences the target sampled, continuing the
               first ``distill.prefix_tokens`` tokens of each corpus sequence;
    'parallel' a parallel draft (PARD style, ``training/parallel.py``): placeholders
               (``distill.mask_token``) after every prefix predict ``distill.parallel_tokens``
               positions ahead, KL to the target at each, weighted exp(-(k-1) / gamma).
* ``fit`` resumes from the newest checkpoint and ends exactly where an
  uninterrupted run would: batches are a pure function of the step and the
  train state (step, parameters, optimizer state) is saved whole. Ctrl-C saves
  the current step before exiting.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec

from specsamp import multihost, sharding
from specsamp.config_fields import ConfigFields, is_int, is_real
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import autoregressive
from specsamp.training import answers, checkpoint, parallel
from specsamp.training.data import Batches

DISTILL_MODES = ("none", "token", "sequence", "parallel")
# Fields that change how a run is logged, not what it computes; a resumed run may change them.
_LOGGING_FIELDS = (
  "log_every",
  "eval_every",
  "eval_batches",
  "checkpoint_every",
  "keep_checkpoints",
)


@dataclasses.dataclass(frozen=True)
class TrainConfig(ConfigFields):
  """Optimisation settings (see configs/code_pair.py for each field's meaning)."""

  steps: int
  batch_size: int
  seq_len: int
  learning_rate: float
  warmup_steps: int
  end_learning_rate_fraction: float = 0.1
  weight_decay: float = 0.1
  grad_clip: float = 1.0
  b1: float = 0.9
  b2: float = 0.95
  log_every: int = 10
  eval_every: int = 100
  eval_batches: int = 4
  checkpoint_every: int = 100
  keep_checkpoints: int = 2
  distill_mode: str = "none"
  distill_temperature: float = 1.0
  distill_prefix_tokens: int = 16
  distill_parallel_tokens: int = 4
  distill_gamma: float = 4.0
  distill_mask_token: int = -1
  init_embedding: str = "random"

  def __post_init__(self):
    counts = ("steps", "batch_size", "seq_len", "warmup_steps", "log_every", "eval_every")
    counts += ("eval_batches", "checkpoint_every", "keep_checkpoints", "distill_prefix_tokens")
    counts += ("distill_parallel_tokens", "distill_mask_token")
    not_counts = [
      f"{name}={getattr(self, name)!r}" for name in counts if not is_int(getattr(self, name))
    ]
    if not_counts:  # 10.5 steps trained 11 and saved at 10.5; 2.5 rows failed in a reshape.
      raise ValueError(f"These must be ints: {', '.join(not_counts)}.")
    # Each range as the optimiser needs it (a NaN or negative learning rate trained on with no
    # error, or failed at its first loss check after earlier stages had trained, 2026-11-30).
    ranges = {
      "learning_rate": (self.learning_rate, "> 0", lambda v: 0 < v < math.inf),
      "end_learning_rate_fraction": (
        self.end_learning_rate_fraction,
        "in [0, 1]",
        lambda v: 0 <= v <= 1,
      ),
      "weight_decay": (self.weight_decay, ">= 0", lambda v: 0 <= v < math.inf),
      "grad_clip": (self.grad_clip, "> 0", lambda v: v > 0),
      "b1": (self.b1, "in [0, 1)", lambda v: 0 <= v < 1),
      "b2": (self.b2, "in [0, 1)", lambda v: 0 <= v < 1),
      "distill.temperature": (self.distill_temperature, "> 0", lambda v: 0 < v < math.inf),
      "distill.gamma": (self.distill_gamma, "> 0", lambda v: 0 < v < math.inf),
    }
    for name, (value, wanted, holds) in ranges.items():
      if not is_real(value) or not holds(float(value)):
        raise ValueError(f"{name} must be a number {wanted}, got {value!r}.")
    if self.steps < 1 or self.batch_size < 1 or self.seq_len < 2:
      raise ValueError(f"Need steps >= 1, batch_size >= 1 and seq_len >= 2: {self}.")
    if not 0 <= self.warmup_steps <= self.steps:
      raise ValueError(f"warmup_steps must be in [0, steps], got {self.warmup_steps}.")
    periods = {f: getattr(self, f) for f in ("log_every", "eval_every", "checkpoint_every")}
    if min(periods.values()) < 1:
      raise ValueError(f"Every period must be >= 1 step, got {periods}.")
    if self.keep_checkpoints < 1 or self.eval_batches < 0:
      # Orbax keeps no step at max_to_keep=0: the first save of a run deletes every earlier one.
      raise ValueError(
        f"keep_checkpoints must be >= 1 (0 would delete every saved step) and eval_batches "
        f">= 0, got {self.keep_checkpoints} and {self.eval_batches}."
      )
    if self.distill_mode not in DISTILL_MODES:
      raise ValueError(f"distill.mode must be one of {DISTILL_MODES}, got {self.distill_mode!r}.")
    if self.distill_temperature <= 0:
      raise ValueError(f"distill.temperature must be > 0, got {self.distill_temperature}.")
    if self.init_embedding not in INIT_EMBEDDINGS:
      raise ValueError(
        f"init_embedding must be one of {INIT_EMBEDDINGS}, got {self.init_embedding!r}."
      )
    if self.distill_mode == "sequence" and not 1 <= self.distill_prefix_tokens < self.seq_len:
      raise ValueError("distill.prefix_tokens must be in [1, seq_len).")
    if self.distill_mode == "parallel":
      if not 1 <= self.distill_parallel_tokens < self.seq_len:
        raise ValueError(
          f"distill.parallel_tokens must be in [1, seq_len), got {self.distill_parallel_tokens}."
        )
      if self.distill_mask_token < 0 or self.distill_gamma <= 0:
        raise ValueError(
          "distill.mode='parallel' needs distill.mask_token (a vocabulary row the tokenizer "
          f"never emits) and distill.gamma > 0, got {self.distill_mask_token}, "
          f"{self.distill_gamma}."
        )

  @classmethod
  def _flatten(cls, values: dict[str, Any]) -> dict[str, Any]:
    """The optional ``distill`` section's fields become ``distill_*`` fields."""
    for name, value in dict(values.pop("distill", {}) or {}).items():
      values[f"distill_{name}"] = value
    return values

  def identity(self) -> dict[str, Any]:
    """The fields that determine the trained parameters (checked when resuming)."""
    return {k: v for k, v in dataclasses.asdict(self).items() if k not in _LOGGING_FIELDS}


INIT_EMBEDDINGS = ("random", "teacher_pca")
"""How a student's embedding starts: random, or the teacher's projected (``teacher_pca``)."""


def teacher_pca_embedding(teacher_VE: np.ndarray, d_model: int) -> np.ndarray:
  """The teacher's embedding table [V, E] projected onto its top ``d_model`` principal
  directions (right singular vectors of the uncentered table): the rank-``d_model`` table
  closest to the teacher's in Frobenius norm, expressed in ``d_model`` coordinates. A
  narrower student starts with the teacher's token geometry (and, tied, its output head's)."""
  table = np.asarray(teacher_VE, np.float64)
  if d_model > table.shape[1]:
    raise ValueError(
      f"init_embedding='teacher_pca' needs d_model <= the teacher's width {table.shape[1]}, "
      f"got {d_model}."
    )
  _, _, right_ED = np.linalg.svd(table, full_matrices=False)
  return (table @ right_ED[:d_model].T).astype(np.float32)


def learning_rate_schedule(config: TrainConfig) -> optax.Schedule:
  """Linear warmup to the peak, cosine decay to ``end_learning_rate_fraction`` of it."""
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=config.learning_rate,
    warmup_steps=config.warmup_steps,
    decay_steps=max(config.steps, config.warmup_steps + 1),
    end_value=config.learning_rate * config.end_learning_rate_fraction,
  )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
  """Clipping, then AdamW with decay on matrices only."""

  def decay_mask(params):
    # A matrix of one layer: the blocks' parameters carry a leading layer axis.
    return jax.tree_util.tree_map_with_path(
      lambda path, p: p.ndim - (getattr(path[0], "key", None) == "blocks") >= 2, params
    )

  return optax.chain(
    optax.clip_by_global_norm(config.grad_clip),
    optax.adamw(
      learning_rate_schedule(config),
      b1=config.b1,
      b2=config.b2,
      weight_decay=config.weight_decay,
      mask=decay_mask,
    ),
  )


def weighted_mean(values_BT: jax.Array, weights_BT: jax.Array | None) -> jax.Array:
  """The mean of ``values``, weighted per token (None: all 1)."""
  if weights_BT is None:
    return values_BT.mean()
  return (values_BT * weights_BT).sum() / jnp.maximum(weights_BT.sum(), 1e-9)


def cross_entropy(
  logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array | None = None
) -> jax.Array:
  """Mean next-token cross-entropy in nats (weighted per target token)."""
  return weighted_mean(
    optax.softmax_cross_entropy_with_integer_labels(logits_BTV, targets_BT), weights_BT
  )


def distillation_kl(
  student_BTV: jax.Array,
  teacher_BTV: jax.Array,
  temperature: float,
  weights_BT: jax.Array | None = None,
) -> jax.Array:
  """Mean token-level KL(teacher || student), both at ``temperature`` (weighted per token)."""
  teacher_logp = jax.nn.log_softmax(teacher_BTV / temperature, axis=-1)
  student_logp = jax.nn.log_softmax(student_BTV / temperature, axis=-1)
  kl_BT = (jnp.exp(teacher_logp) * (teacher_logp - student_logp)).sum(-1)
  return weighted_mean(kl_BT, weights_BT)


def _label_weights(weights_BT: jax.Array | None) -> jax.Array | None:
  """The weight of each label x_1.. of a row's tokens' weights (None: unweighted)."""
  return None if weights_BT is None else weights_BT[:, 1:]


def _input_weights(weights_BT: jax.Array | None) -> jax.Array | None:
  """The weight of each input x_..L-1 of a row's tokens' weights: what tells the sequences of
  a packed row apart for the pass that reads them (None: unweighted)."""
  return None if weights_BT is None else weights_BT[:, :-1]


def packed_logits(model: Any, tokens_BT: jax.Array, weights_BT: jax.Array | None = None):
  """A model's logits over rows with no cache: one causal pass, or with the answer weights of
  the tokens it reads, a pass that keeps a packed row's sequences apart
  (``answers.packed_call``)."""
  positions_BT, call = answers.packed_call(weights_BT)
  return model(tokens_BT, positions_BT, tree=call).logits


def split_batch(batch: Any) -> tuple[np.ndarray, np.ndarray | None]:
  """(tokens, weights or None) of a ``data.Batches`` batch."""
  return batch[:2] if isinstance(batch, tuple) else (batch, None)


def stored_of(batch: Any) -> np.ndarray | None:
  """The target's stored outputs on a ``data.Batches`` batch's rows (``target_store``), or
  None when the batch has none."""
  return batch[2] if isinstance(batch, tuple) and len(batch) > 2 else None


def mean_over_batches(losses: Sequence[float], batches: Sequence[Any]) -> float:
  """The mean of per-batch means over every token: weighted batches count by their weights'
  sum (a batch of few answer tokens counts little), unweighted ones equally."""
  # A batch's loss is over its labels, w[:, 1:] (the first token is never one).
  sizes = [
    1.0 if w is None else float(np.sum(np.asarray(w)[:, 1:])) for _, w in map(split_batch, batches)
  ]
  if not sum(sizes):
    raise ValueError("The evaluation batches hold no weighted token.")
  return float(np.dot(losses, sizes) / sum(sizes))


def check_batch_split(batch_size: int, mesh: jax.sharding.Mesh) -> None:
  """Warns of a batch the mesh's batch axes do not divide: the rules table replicates it, and
  every device computes the whole batch (correct, and n times the work). A warning, not an
  error: a small run on a many-device host (the suite's 8 simulated devices) is still right."""
  shape = dict(mesh.shape)
  spec = sharding.logical_to_spec(("act_batch",), (math.prod(shape.values()),), shape)
  axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],) if spec[0] else ()
  ways = math.prod(shape[axis] for axis in axes)
  if batch_size % ways:
    warnings.warn(
      f"batch_size={batch_size} is not a multiple of the mesh's batch axes {axes} ({ways} "
      "devices): each computes the whole batch, replicated. Use a multiple, or a smaller data "
      "axis (--config.mesh.data).",
      stacklevel=3,
    )


@struct.dataclass
class TrainState:
  """Everything a resumed run needs: the step, the parameters and the optimizer state."""

  step: jax.Array
  params: Any
  opt_state: Any


def params_of(model: nnx.Module) -> dict:
  """A model's parameters as a plain nested dict (what checkpoints and optax see), its layers
  stacked even when the model runs them unstacked (``transformer.unstack_layers``)."""
  return transformer.restacked(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


class Trainer:
  """Jitted, sharded init / train / eval for one model config on one mesh.

  Args:
    model_config: the model to train.
    config: optimisation settings.
    mesh: the device mesh; every array is placed by the rules table.
    teacher: for distillation, the target model (its parameters are an
      input of the step, never a compile-time constant).
    seed: parameter init seed.
  """

  def __init__(
    self,
    model_config: TransformerConfig,
    config: TrainConfig,
    mesh: jax.sharding.Mesh,
    teacher: nnx.Module | None = None,
    seed: int = 0,
  ):
    if config.distill_mode != "none" or config.init_embedding != "random":
      if teacher is None:
        raise ValueError(
          f"distill.mode={config.distill_mode!r} with init_embedding={config.init_embedding!r} "
          "needs a teacher (the target)."
        )
      if teacher.vocab_size != model_config.vocab_size:
        raise ValueError(
          f"Teacher vocab_size {teacher.vocab_size} differs from the student's "
          f"{model_config.vocab_size}; distillation compares distributions."
        )
    if config.distill_mode == "parallel" and config.distill_mask_token >= model_config.vocab_size:
      raise ValueError(  # Its embedding row would be out of range: non-finite logits, no error.
        f"distill.mask_token={config.distill_mask_token} is not a row of the draft's "
        f"{model_config.vocab_size}-token vocabulary; use a row the tokenizer never emits."
      )
    self.model_config, self.config, self.mesh, self.seed = model_config, config, mesh, seed
    self.optimizer = make_optimizer(config)
    abstract = sharding.abstract_model(
      lambda rngs: transformer.Transformer(model_config, rngs=rngs), mesh, seed
    )
    self.graphdef, self.param_shardings = abstract.graphdef, abstract.shardings
    abstract_params = abstract.shapes
    self._sampling_graphdef = self.graphdef
    # Training differentiates what sampling loops over (reverse mode cannot differentiate a
    # while loop), so it runs those parts densely: execution fields, the same parameters, and
    # ``model`` hands them back in the configured execution.
    differentiable = model_config
    if config.distill_mode == "parallel":
      # The parallel layout is one tree call over a cache of K x seq_len slots, which a model
      # would read in blocks: training attends densely.
      differentiable = dataclasses.replace(differentiable, attention_block_size=0)
    if model_config.num_experts:  # The sparse path loops over the experts tokens selected.
      differentiable = dataclasses.replace(differentiable, moe_compute="dense")
    if differentiable != model_config:
      self.graphdef = sharding.abstract_model(
        lambda rngs: transformer.Transformer(differentiable, rngs=rngs), mesh, seed
      ).graphdef
    replicated = NamedSharding(mesh, PartitionSpec())
    abstract_opt = jax.eval_shape(self.optimizer.init, abstract_params)
    opt_shardings = optax.tree_map_params(
      self.optimizer,
      lambda _, s: s,
      abstract_opt,
      self.param_shardings,
      transform_non_params=lambda _: replicated,
    )
    self.state_shardings = TrainState(
      step=replicated, params=self.param_shardings, opt_state=opt_shardings
    )
    self.abstract_state = sharding.abstract_arrays(
      TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params, opt_state=abstract_opt
      ),
      self.state_shardings,
    )
    self._teacher = None
    if teacher is not None and config.distill_mode != "none":
      self._teacher = nnx.split(teacher)
    self._batch_sharding = NamedSharding(
      mesh,
      sharding.logical_to_spec(
        ("act_batch", "act_length"), (config.batch_size, config.seq_len + 1), dict(mesh.shape)
      ),
    )
    check_batch_split(config.batch_size, mesh)
    self._init_table = None
    if config.init_embedding == "teacher_pca":
      self._init_table = teacher_pca_embedding(
        np.asarray(jax.device_get(teacher.embedder.table_VD[...])), model_config.d_model
      )
    self._init = jax.jit(self._init_fn, out_shardings=self.state_shardings)
    self._step = jax.jit(
      self._step_fn, donate_argnums=0, out_shardings=(self.state_shardings, replicated)
    )
    self._eval = jax.jit(self._eval_fn, out_shardings=replicated)
    self._greedy_correct = jax.jit(self._greedy_correct_fn, out_shardings=replicated)

  # --- jitted bodies -------------------------------------------------------------------------
  def _init_fn(self, table_VD=None) -> TrainState:
    model = transformer.Transformer(self.model_config, rngs=nnx.Rngs(self.seed))
    if table_VD is not None:
      model.embedder.table_VD[...] = table_VD.astype(model.embedder.table_VD[...].dtype)
    params = params_of(model)
    return TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=self.optimizer.init(params)
    )

  def _logits(self, params, tokens_BT, weights_BT=None):
    return packed_logits(nnx.merge(self.graphdef, params), tokens_BT, weights_BT)

  def _teacher_logits(self, teacher_state, inputs_BT, weights_BT=None):
    """The frozen teacher's logits (no gradient flows into them)."""
    teacher_graphdef, _ = self._teacher
    teacher = nnx.merge(teacher_graphdef, teacher_state)
    return jax.lax.stop_gradient(packed_logits(teacher, inputs_BT, weights_BT))

  def _parallel_logits(self, params, inputs_BT, weights_BT=None):
    return parallel.parallel_logits(
      nnx.merge(self.graphdef, params),
      inputs_BT,
      self.config.distill_parallel_tokens,
      self.config.distill_mask_token,
      weights_BT,
    )

  def _parallel_weights(self):
    return parallel.position_weights(self.config.distill_parallel_tokens, self.config.distill_gamma)

  def _loss(self, params, batch_BT, weights_BT, teacher_state):
    inputs_BT, targets_BT = batch_BT[:, :-1], batch_BT[:, 1:]
    # Answer rows: each pass keeps the row's sequences apart (``answers.packed_call``).
    read_BT = _input_weights(weights_BT)
    if self.config.distill_mode == "parallel":  # Answer-weighted by the token each query predicts.
      student_BKLV = self._parallel_logits(params, inputs_BT, read_BT)
      kl, kl_K = parallel.parallel_kl(
        student_BKLV,
        self._teacher_logits(teacher_state, inputs_BT, read_BT),
        self._parallel_weights(),
        self.config.distill_temperature,
        parallel.query_weights(weights_BT, self.config.distill_parallel_tokens),
      )
      ce = cross_entropy(student_BKLV[:, 0], targets_BT, _label_weights(weights_BT))
      return kl, {"ce": ce, "kl": kl, **{f"kl_{k + 1}": kl_K[k] for k in range(kl_K.shape[0])}}
    weights_BT = _label_weights(weights_BT)
    logits_BTV = self._logits(params, inputs_BT, read_BT)
    ce = cross_entropy(logits_BTV, targets_BT, weights_BT)
    top1 = weighted_mean((logits_BTV.argmax(-1) == targets_BT).astype(jnp.float32), weights_BT)
    if self.config.distill_mode != "token":
      return ce, {"ce": ce, "top1": top1}
    kl = distillation_kl(
      logits_BTV,
      self._teacher_logits(teacher_state, inputs_BT, read_BT),
      self.config.distill_temperature,
      weights_BT,
    )
    return kl, {"ce": ce, "kl": kl, "top1": top1}

  def _step_fn(self, state: TrainState, batch_BT, weights_BT, teacher_state):
    (loss, parts), grads = jax.value_and_grad(self._loss, has_aux=True)(
      state.params, batch_BT, weights_BT, teacher_state
    )
    updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(parts, loss=loss, grad_norm=optax.tree.norm(grads))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  def _eval_fn(self, params, batch_BT, weights_BT):
    read_BT = _input_weights(weights_BT)
    if self.config.distill_mode == "parallel":  # Weighted over the draft positions.
      return parallel.parallel_cross_entropy(
        self._parallel_logits(params, batch_BT[:, :-1], read_BT),
        batch_BT[:, 1:],
        self._parallel_weights(),
        parallel.query_weights(weights_BT, self.config.distill_parallel_tokens),
      )
    logits_BTV = self._logits(params, batch_BT[:, :-1], read_BT)
    return cross_entropy(logits_BTV, batch_BT[:, 1:], _label_weights(weights_BT))

  def _greedy_correct_fn(self, params, batch_BT, weights_BT=None):
    """[B, T] whether the argmax after each prefix is the next token (``answers.tau``); a
    parallel draft's [K, B, T], one row per draft position (``parallel.greedy_correct``).
    With answer ``weights``, each prefix is read within its own sequence of the row."""
    read_BT = _input_weights(weights_BT)
    if self.config.distill_mode == "parallel":
      return parallel.greedy_correct(
        self._parallel_logits(params, batch_BT[:, :-1], read_BT), batch_BT[:, 1:]
      )
    return self._logits(params, batch_BT[:, :-1], read_BT).argmax(-1) == batch_BT[:, 1:]

  # --- host API -------------------------------------------------------------------------------
  def init_state(self) -> TrainState:
    with sharding.use_mesh(self.mesh):
      return self._init(self._init_table)

  def place(self, batch: np.ndarray, dtype=np.int32) -> jax.Array:
    """The global batch on the mesh. Each process hands over only the rows of its own
    devices (on a multi-host slice, every host builds the same step-addressed batch and
    transfers its share)."""
    batch = np.asarray(batch, dtype)
    return jax.make_array_from_callback(
      batch.shape, self._batch_sharding, lambda index: batch[index]
    )

  def _place_both(self, batch) -> tuple[jax.Array, jax.Array | None]:
    tokens, weights = split_batch(batch)
    return self.place(tokens), None if weights is None else self.place(weights, np.float32)

  def _sequence_batch(self, batch: np.ndarray, step: int) -> np.ndarray:
    """Corpus prefixes continued by the teacher (sequence-level distillation)."""
    teacher_graphdef, teacher_state = self._teacher
    prefix = self.config.distill_prefix_tokens
    rows = batch.shape[0]
    with sharding.use_mesh(self.mesh):
      out = autoregressive.generate(
        nnx.merge(teacher_graphdef, teacher_state),
        batch[:, :prefix],
        np.full((rows,), prefix, np.int32),
        jax.random.fold_in(jax.random.key(self.seed), step),
        max_new_tokens=batch.shape[1] - prefix,
        temperature=self.config.distill_temperature,
      )
    return np.asarray(out.tokens)[:, : batch.shape[1]]

  def train_step(self, state: TrainState, batch) -> tuple[TrainState, dict]:
    """One optimizer step on a batch: tokens [B, L + 1], or (tokens, weights) (``data``)."""
    if self.config.distill_mode == "sequence":
      if isinstance(batch, tuple):
        raise NotImplementedError("distill.mode='sequence' makes its own unweighted batches.")
      batch = self._sequence_batch(batch, int(state.step))
    teacher_state = self._teacher[1] if self.config.distill_mode in ("token", "parallel") else None
    with sharding.use_mesh(self.mesh):
      return self._step(state, *self._place_both(batch), teacher_state)

  def evaluate(self, params, batches: Sequence[Any]) -> float:
    """Mean cross-entropy (nats/token) over ``batches`` (weighted ones: over their weights)."""
    with sharding.use_mesh(self.mesh):
      losses = [float(self._eval(params, *self._place_both(b))) for b in batches]
    return mean_over_batches(losses, batches)

  def greedy_correct(self, params, batch) -> np.ndarray:
    """[B, L] whether the model's argmax after each prefix of ``batch`` is its next token:
    tokens, or a ``data.Batches`` batch of answer rows (each prefix read within its own
    sequence, ``answers.packed_call``)."""
    with sharding.use_mesh(self.mesh):
      return np.asarray(self._greedy_correct(params, *self._place_both(batch)))

  def model(self, params) -> transformer.Transformer:
    """The Transformer with these parameters (for sampling)."""
    return nnx.merge(self._sampling_graphdef, params)

  def learning_rate(self, step: int) -> float:
    return float(learning_rate_schedule(self.config)(step))


@jax.jit
def _all_finite(loss: jax.Array, params: Any) -> jax.Array:
  leaves = [jnp.isfinite(loss).all()] + [
    jnp.isfinite(leaf).all()
    for leaf in jax.tree.leaves(params)
    if jnp.issubdtype(leaf.dtype, jnp.inexact)
  ]
  return jnp.stack(leaves).all()


def finite(loss: jax.Array, params: Any) -> bool:
  """Whether the loss and every parameter are finite (one reduction; read at a save)."""
  return bool(_all_finite(loss, params))


def _saved_steps(checkpoints: checkpoint.Checkpoints) -> str:
  steps = checkpoints.all_steps()
  return f"steps {', '.join(map(str, steps))}" if steps else "none"


def _format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _as_items(state: TrainState) -> dict[str, Any]:
  """Checkpoint items: the parameters apart, so sampling reads them alone."""
  return {"params": state.params, "optimizer": {"step": state.step, "opt_state": state.opt_state}}


def fit(
  trainer: Trainer,
  batches: Batches,
  eval_batches: Sequence[np.ndarray],
  checkpoints: checkpoint.Checkpoints,
  meta: Mapping[str, Any],
  *,
  name: str = "train",
  log: Callable[[str], None] = print,
  stop_after: int | None = None,
  max_seconds: float | None = None,
  on_eval: Callable[[int, Any], str] | None = None,
) -> TrainState:
  """Trains to ``config.steps``, resuming from the newest checkpoint in ``checkpoints``.

  Args:
    trainer: the jitted steps.
    batches: training batches (``at(step)``).
    eval_batches: a fixed evaluation set.
    checkpoints: where to save and resume; saved every ``checkpoint_every``
      steps and at the end.
    meta: JSON facts about the run (model config, tokenizer fingerprint);
      a resumed checkpoint must carry the same.
    name: prefix of the progress lines.
    log: where progress lines go.
    stop_after: stop (with a checkpoint) after this many steps in this call,
      as if interrupted; None runs to the end.
    max_seconds: stop (with an evaluation and a checkpoint) after the first step that ends
      this many seconds into this call: a lent machine's time; None runs to the end.
    on_eval: called at each evaluation with (step, parameters); what it returns ends the
      evaluation's line (e.g. tau, and whether the run kept these parameters as its best).

  Returns:
    The final (or interrupted) train state.
  """
  config = trainer.config
  # The activation dtype changes every gradient: a run resumed in bfloat16 from a float32 start
  # went on silently and ended away from the unbroken run (2026-11-30). Sampling may still run a
  # finished model in any dtype (an execution field of the model's config).
  meta = dict(meta, train=config.identity())
  model_config = getattr(trainer, "model_config", None)  # A feature head's trainer has none.
  if model_config is not None:
    meta["train_dtype"] = str(model_config.dtype)
  if checkpoints.latest_step() is None:
    state = trainer.init_state()
    start = 0
  else:
    checkpoint.check_meta(checkpoints.read_meta(), meta, checkpoints.directory)
    # The latest step, or with resume='latest_intact' the newest one that reads.
    restored, saved = checkpoints.restore(_as_items(trainer.abstract_state))
    checkpoint.check_meta(saved, meta, checkpoints.directory)
    start = saved["step"]
    state = TrainState(
      step=restored["optimizer"]["step"],
      params=restored["params"],
      opt_state=restored["optimizer"]["opt_state"],
    )
    if start < config.steps:
      log(f"{name}: resuming from step {start} in {checkpoints.directory}")
  end = config.steps if stop_after is None else min(config.steps, start + stop_after)
  if start >= end:
    return state
  tokens_per_step = config.batch_size * config.seq_len
  window_start, window_steps, run_start = time.perf_counter(), 0, time.perf_counter()
  step = start
  # Ctrl-C lands between steps: a step donates the state's buffers, so an interrupt inside
  # one would leave nothing whole to save. The first Ctrl-C sets a flag the loop checks (on
  # several hosts, every host stops before the same step, which all of them save together); a
  # second one interrupts at once.
  interrupt = multihost.DeferredInterrupt()
  metrics, whole = None, True  # whole: state holds a finished step (not donated buffers).
  finite_at = None  # The step whose loss and parameters were last found finite.

  def refuse_if_diverged(refused: str) -> None:
    """Raises before a diverged state is evaluated or saved (orbax keeps the last
    keep_checkpoints steps, so NaN saves between two loss checks would push out the good ones;
    an evaluation may keep its state as the best). Read once per step."""
    nonlocal finite_at
    if finite_at == step:
      return
    if not finite(metrics["loss"], state.params):
      raise FloatingPointError(
        f"{name}: the loss or the parameters are not finite at step {step}; lower the "
        f"learning rate or check the data. Step {step} is not {refused}."
      )
    finite_at = step

  try:
    while step < end:
      interrupt.check()
      batch = batches.at(step)
      whole = False  # The step donates the state's buffers until it returns.
      state, metrics = trainer.train_step(state, batch)
      whole = True
      step += 1
      window_steps += 1
      out_of_time = multihost.out_of_time(run_start, time.perf_counter(), max_seconds)
      if out_of_time and step < end:
        log(f"{name}: {max_seconds:g} s spent; stopping at step {step} (resume to go on)")
        end = step
      if step % config.log_every == 0 or step == end:
        loss = float(metrics["loss"])  # Waits for the step.
        if not math.isfinite(loss):
          raise FloatingPointError(
            f"{name}: loss is {loss} at step {step}; lower the learning rate or check the data."
          )
        now = time.perf_counter()
        rate = window_steps * tokens_per_step / max(now - window_start, 1e-9)
        eta = (config.steps - step) * tokens_per_step / max(rate, 1e-9)
        extra = "".join(
          f"  {key} {float(metrics[key]):.3f}"
          for key in ("kl", "ce", "top1", "top1_last")
          if key in metrics
        )
        log(
          f"{name} step {step:>5}/{config.steps}  loss {loss:.3f}{extra}  "
          f"lr {trainer.learning_rate(step):.2e}  {rate:,.0f} tokens/s  "
          f"ETA {_format_duration(eta)}"
        )
        window_start, window_steps = now, 0
      if step % config.eval_every == 0 or step == config.steps or out_of_time:
        refuse_if_diverged("evaluated or saved")
        loss = trainer.evaluate(state.params, eval_batches)
        perplexity = (
          f"  perplexity {math.exp(loss):.2f}"
          if getattr(trainer, "reports_perplexity", True)
          else ""
        )
        extra = f"  {on_eval(step, state.params)}" if on_eval is not None else ""
        log(f"{name} eval  step {step:>5}  loss {loss:.3f}{perplexity}{extra}")
      if step % config.checkpoint_every == 0 or step == end:
        refuse_if_diverged("saved")
        checkpoints.save(step, _as_items(state), meta)
  except FloatingPointError as error:
    checkpoints.wait()  # An earlier step's save finishes before the error reaches the user.
    raise FloatingPointError(
      f"{error} The checkpoints saved before it are kept: {_saved_steps(checkpoints)}."
    ) from None
  except KeyboardInterrupt:
    checkpoints.wait()
    if step in checkpoints.all_steps():  # Just saved by the periodic checkpoint.
      log(f"{name}: interrupted at step {step}, which is saved; resume from it.")
    elif metrics is None or not whole:  # Inside a step (a second Ctrl-C): nothing whole to save.
      log(
        f"{name}: interrupted inside step {step + 1}: nothing new to save; the checkpoints "
        f"saved before it are kept: {_saved_steps(checkpoints)}."
      )
    elif not finite(metrics["loss"], state.params):
      log(
        f"{name}: interrupted at step {step}, whose loss or parameters are not finite: not "
        f"saved; the checkpoints before it are kept: {_saved_steps(checkpoints)}."
      )
    else:
      log(f"{name}: interrupted at step {step}; saving a checkpoint to resume from.")
      checkpoints.save(step, _as_items(state), meta)
      checkpoints.wait()
    raise
  finally:
    interrupt.restore()
  checkpoints.wait()
  log(f"{name}: {end - start} steps in {_format_duration(time.perf_counter() - run_start)}")
  return state
