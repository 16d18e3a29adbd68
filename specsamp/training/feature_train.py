r"""Training a feature head (EAGLE-3 style) against a frozen target, with training-time test.

Each batch of corpus windows x_0..x_{T-1} goes through the target once (its parameters are an
input of the step, never trained): its features f_p at ``feature_layers`` and its logits. The
head is then unrolled ``ttt_steps`` times over the whole window (``FeatureHead.unrolled``):
row p of step k is the chain that starts from the target's feature at p and has drafted k
tokens, fed the true tokens (teacher forcing, shifted one per step), and it predicts x_{p+2+k},
whose target distribution is the target's logits at p+1+k. The loss is

    sum_k  decay^k  mean_p KL( p_target(. | x_<=p+1+k)  ||  q_head^k(.) )

over the rows whose target position exists, at ``distill.temperature``. With a reduced draft
vocabulary the target's distribution is restricted to it and renormalised (q is zero outside
it: that mass is the acceptance the head gives up for its cheaper output layer).

``fit`` (``train.py``) runs it: orbax checkpoints, resume, Ctrl-C, the same logs. Only the
head's float parameters are optimised; its vocabulary map is data (``frequent_tokens``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from specsamp import sharding
from specsamp.models.feature_head import FeatureDraftModel, FeatureHead, FeatureHeadConfig
from specsamp.training import answers, checkpoint, train
from specsamp.training.train import TrainConfig, TrainState


@dataclasses.dataclass(frozen=True)
class FeatureTrainConfig(TrainConfig):
  """TrainConfig plus training-time test: ``ttt_steps`` unrolled steps (EAGLE-3 uses 7),
  step k weighted ``ttt_decay ** k`` (EAGLE-3: 0.8)."""

  ttt_steps: int = 7
  ttt_decay: float = 0.8

  def __post_init__(self):
    super().__post_init__()
    if not isinstance(self.ttt_steps, int) or not 1 <= self.ttt_steps < self.seq_len:
      raise ValueError(f"ttt_steps must be an int in [1, seq_len), got {self.ttt_steps!r}.")
    if not 0 < self.ttt_decay <= 1:
      raise ValueError(f"ttt_decay must be in (0, 1], got {self.ttt_decay}.")


def frequent_tokens(stream: np.ndarray, vocab_size: int, draft_vocab_size: int) -> np.ndarray:
  """The ``draft_vocab_size`` most frequent ids of ``stream`` (ties by id), ascending: a
  reduced draft vocabulary, as EAGLE-3 picks its own."""
  counts = np.bincount(np.asarray(stream).ravel(), minlength=vocab_size)[:vocab_size]
  order = np.lexsort((np.arange(vocab_size), -counts))
  return np.sort(order[:draft_vocab_size]).astype(np.int32)


def _split(tree: dict, float_keys: frozenset) -> tuple[dict, dict]:
  """(the float parameters' entries, the rest) of a parameter-shaped nested dict."""
  flat = traverse_util.flatten_dict(tree)
  floats = {k: v for k, v in flat.items() if k in float_keys}
  rest = {k: v for k, v in flat.items() if k not in float_keys}
  return traverse_util.unflatten_dict(floats), traverse_util.unflatten_dict(rest)


def _join(floats: dict, rest: dict) -> dict:
  return traverse_util.unflatten_dict(
    {**traverse_util.flatten_dict(floats), **traverse_util.flatten_dict(rest)}
  )


def target_outputs(
  model: FeatureDraftModel,
  tokens_BT: jax.Array,
  stored_BTS: jax.Array | None = None,
  weights_BT: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """(the teacher's logits [B, L, V_h] over the head's vocabulary: the draft vocabulary when
  reduced, the target's features [B, L, F]) on ``tokens``: from one pass of the target, or
  from its stored outputs on those rows (``target_store``: the features, then the last
  layer's output, which the target's final norm and head turn into the teacher). With the
  rows' answer ``weights``, the target reads each packed sequence apart (``answers``)."""
  head, target = model.head, model.target
  layers = head.config.feature_layers
  ids = head.draft_to_target[...] if head.config.draft_vocab_size else None
  if stored_BTS is None:
    positions_BT, call = answers.packed_call(weights_BT)
    scored = target(tokens_BT, positions_BT, tree=call, capture_layers=layers)
    teacher_BTV = scored.logits if ids is None else scored.logits[..., ids]
    features_BTF = scored.features
  else:
    split = len(layers) * target.config.d_model
    dtype = target.config.activation_dtype
    features_BTF = stored_BTS[..., :split].astype(dtype)
    teacher_BTV = target.output(stored_BTS[..., split:].astype(dtype), ids)
  return jax.lax.stop_gradient(teacher_BTV), jax.lax.stop_gradient(features_BTF)


def _unrolled_hidden(
  model: FeatureDraftModel,
  tokens_BT: jax.Array,
  steps: int,
  stored_BTS: jax.Array | None = None,
  weights_BT: jax.Array | None = None,
) -> tuple[jax.Array, list[jax.Array]]:
  """(the teacher's logits [B, L, V_h] over the head's vocabulary, the head's hidden states of
  its ``steps`` unrolled steps) over ``tokens``: row p of step k drafts after x_<=p+1+k, fed
  the true tokens; with the rows' answer ``weights``, within row p's own sequence."""
  head, target = model.head, model.target
  length = tokens_BT.shape[1]
  teacher_BTV, features_BTF = target_outputs(model, tokens_BT, stored_BTS, weights_BT)
  padded_BT = jnp.pad(tokens_BT, ((0, 0), (0, steps + 1)))
  embedded = jnp.stack(
    [target.embedder.encode(padded_BT[:, 1 + k : 1 + k + length]) for k in range(steps)]
  )
  hidden = head.unrolled(
    jax.lax.stop_gradient(embedded),
    head.fuse(features_BTF),
    steps,
    parallel=head.config.parallel,
    segments_BS=None if weights_BT is None else answers.segments(weights_BT),
  )
  return teacher_BTV, hidden


def _step_logits(model: FeatureDraftModel, h_BTD: jax.Array) -> jax.Array:
  """A step's logits over the head's own vocabulary (the draft vocabulary when reduced)."""
  if model.head.config.draft_vocab_size:
    return model.head.small_logits(h_BTD)
  return model.logits(h_BTD)


def step_weights(weights_BT: jax.Array | None, length: int, k: int) -> jax.Array:
  """[B or 1, L] weight of row p at unrolled step k: 0 where its target position p + 1 + k is
  past the row; with per-token ``weights`` (answer tokens 1, ``answers``), the weight of the
  token it predicts, x_{p+2+k} (0 past the row), as the draft's loss weighs x_{t+1}, and 0
  where that token lies in another of the row's packed sequences than row p."""
  valid_1T = (jnp.arange(length) + 1 + k < length)[None].astype(jnp.float32)
  if weights_BT is None:
    return valid_1T
  segments_BT = answers.segments(weights_BT)
  ahead = ((0, 0), (0, 2 + k))
  same_BT = jnp.pad(segments_BT[:, 2 + k :], ahead, constant_values=-1) == segments_BT
  predicted_BT = jnp.pad(weights_BT[:, 2 + k :], ahead).astype(jnp.float32)
  return jnp.where(same_BT, predicted_BT, 0.0) * valid_1T


def ttt_loss(
  model: FeatureDraftModel,
  tokens_BT: jax.Array,
  steps: int,
  decay: float,
  temperature: float,
  weights_BT: jax.Array | None = None,
  stored_BTS: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The weighted training-time-test KL (module docstring) and per-step metrics; with per-token
  ``weights`` (``step_weights``), each step's KL is their weighted mean; with the target's
  ``stored`` outputs on the rows (``target_store``), the target does not run."""
  length = tokens_BT.shape[1]
  teacher_BTV, hidden = _unrolled_hidden(model, tokens_BT, steps, stored_BTS, weights_BT)
  total, metrics = 0.0, {}
  for k, h_BTD in enumerate(hidden):
    teacher_k = jnp.pad(teacher_BTV[:, 1 + k :], ((0, 0), (0, 1 + k), (0, 0)))
    student_k = _step_logits(model, h_BTD)
    teacher_logp = jax.nn.log_softmax(teacher_k / temperature, axis=-1)
    student_logp = jax.nn.log_softmax(student_k.astype(jnp.float32) / temperature, axis=-1)
    kl_BT = (jnp.exp(teacher_logp) * (teacher_logp - student_logp)).sum(-1)
    weight_BT = jnp.broadcast_to(step_weights(weights_BT, length, k), kl_BT.shape)
    kl = train.weighted_mean(kl_BT, weight_BT)
    agree = (jnp.argmax(student_logp, -1) == jnp.argmax(teacher_logp, -1)).astype(jnp.float32)
    total = total + decay**k * kl
    metrics[f"kl{k}"] = kl
    metrics[f"top1_{k}"] = train.weighted_mean(agree, weight_BT)
  return total, metrics


def greedy_steps_correct(
  model: FeatureDraftModel,
  tokens_BT: jax.Array,
  steps: int,
  stored_BTS: jax.Array | None = None,
  weights_BT: jax.Array | None = None,
) -> jax.Array:
  """[steps, B, L]: whether step k's argmax at row p (drafting after x_<=p+1+k, the true tokens
  fed) is the next true token x_{p+2+k} (False past the row). On greedy answers, where that
  token is the target's argmax, a K-token greedy chain the head drafts after x_<=p+1 accepts
  the run of True over k = 0.. (``answers.accepted_unrolled``). With the rows' answer
  ``weights``, each chain reads its own packed sequence only."""
  length = tokens_BT.shape[1]
  _, hidden = _unrolled_hidden(model, tokens_BT, steps, stored_BTS, weights_BT)
  head = model.head
  padded_BT = jnp.pad(tokens_BT, ((0, 0), (0, steps + 2)))
  correct = []
  for k, h_BTD in enumerate(hidden):
    best_BT = jnp.argmax(_step_logits(model, h_BTD), -1)
    if head.config.draft_vocab_size:
      best_BT = head.draft_to_target[...][best_BT]
    inside_1T = (jnp.arange(length) + 2 + k < length)[None]
    correct.append((best_BT == padded_BT[:, 2 + k : 2 + k + length]) & inside_1T)
  return jnp.stack(correct)


class FeatureTrainer:
  """Jitted, sharded init / train / eval of a feature head on a frozen target; ``train.fit``
  runs it as it runs the draft's ``Trainer``.

  Args:
    head_config: the head to train.
    target: the frozen target (a specsamp Transformer on ``mesh``).
    config: optimisation and training-time-test settings.
    mesh: the device mesh; every array is placed by the rules table.
    draft_to_target: the reduced draft vocabulary's map (``frequent_tokens``), when
      ``head_config.draft_vocab_size`` > 0.
    seed: parameter init seed.
    initial_params: a fresh run's parameters instead of the seed's (``train.params_of`` of a
      trained head of this config, e.g. a shipped one, to go on training it on more data);
      its vocabulary map is the head's own and must equal ``draft_to_target``. The
      optimizer's moments start at zero and the schedule at its first step.
  """

  reports_perplexity = False  # Its evaluation is the TTT loss, not nats per token.

  def __init__(
    self,
    head_config: FeatureHeadConfig,
    target: Any,
    config: FeatureTrainConfig,
    mesh: jax.sharding.Mesh,
    draft_to_target: np.ndarray | None = None,
    seed: int = 0,
    initial_params: dict | None = None,
  ):
    self.config, self.mesh, self.seed = config, mesh, seed
    self.head_config = head_config.resolve(target.config)
    self.target_config = target.config
    # The head's own parameters, and with them its Adam moments, train in float32 whatever the
    # target's parameter dtype (master weights; the head still computes in the target's
    # activation dtype). In bfloat16, an update below 2^-8 of its weight rounds away: a head
    # for a bfloat16 target (an HF import) trained so. Loading casts to the target's dtype.
    self.head_target_config = target.config.replace(param_dtype="float32")
    if bool(self.head_config.draft_vocab_size) != (draft_to_target is not None):
      raise ValueError(
        "A reduced draft vocabulary (draft_vocab_size > 0) needs its draft_to_target map, and "
        "a shared head none."
      )
    if draft_to_target is not None:
      draft_to_target = np.asarray(draft_to_target, np.int32)
      if draft_to_target.shape != (self.head_config.draft_vocab_size,):
        raise ValueError(
          f"draft_to_target has shape {draft_to_target.shape}; the head's draft vocabulary "
          f"has {self.head_config.draft_vocab_size} tokens."
        )
    self._map = draft_to_target
    self.optimizer = train.make_optimizer(config)

    def factory(rngs):
      return FeatureHead(self.head_config, self.head_target_config, rngs=rngs)

    abstract = sharding.abstract_model(factory, mesh, seed)
    self.graphdef, self.param_shardings = abstract.graphdef, abstract.shardings
    self._float_keys = frozenset(
      key
      for key, value in traverse_util.flatten_dict(abstract.shapes).items()
      if jnp.issubdtype(value.dtype, jnp.floating)
    )
    floats, _ = _split(abstract.shapes, self._float_keys)
    float_shardings, _ = _split(abstract.shardings, self._float_keys)
    replicated = NamedSharding(mesh, PartitionSpec())
    abstract_opt = jax.eval_shape(self.optimizer.init, floats)
    opt_shardings = optax.tree_map_params(
      self.optimizer,
      lambda _, s: s,
      abstract_opt,
      float_shardings,
      transform_non_params=lambda _: replicated,
    )
    self.state_shardings = TrainState(
      step=replicated, params=self.param_shardings, opt_state=opt_shardings
    )
    self.abstract_state = sharding.abstract_arrays(
      TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract.shapes, opt_state=abstract_opt
      ),
      self.state_shardings,
    )
    self._target = nnx.split(target)
    self._batch_sharding = NamedSharding(
      mesh,
      sharding.logical_to_spec(
        ("act_batch", "act_length"), (config.batch_size, config.seq_len + 1), dict(mesh.shape)
      ),
    )
    train.check_batch_split(config.batch_size, mesh)
    self._init = jax.jit(self._init_fn, out_shardings=self.state_shardings)
    self._initial = None
    if initial_params is not None:
      self._initial = self._checked_initial(initial_params, abstract.shapes)
    self._step = jax.jit(
      self._step_fn, donate_argnums=0, out_shardings=(self.state_shardings, replicated)
    )
    self._eval = jax.jit(self._eval_fn, out_shardings=replicated)
    self._greedy_correct = jax.jit(
      self._greedy_correct_fn, static_argnums=4, out_shardings=replicated
    )

  def _model(self, params, target_state) -> FeatureDraftModel:
    head = nnx.merge(self.graphdef, params)
    return FeatureDraftModel(head, nnx.merge(self._target[0], target_state))

  def _loss(self, floats, rest, batch_BT, weights_BT, target_state, stored_BTS):
    config = self.config
    model = self._model(_join(floats, rest), target_state)
    loss, metrics = ttt_loss(
      model,
      batch_BT,
      config.ttt_steps,
      config.ttt_decay,
      config.distill_temperature,
      weights_BT,
      stored_BTS,
    )
    return loss, metrics

  def _checked_initial(self, params: dict, shapes: dict) -> dict:
    """``initial_params`` as this trainer's parameters: the same tree and shapes, floats in
    float32 (the master weights), the vocabulary map equal to this run's."""
    got = traverse_util.flatten_dict(params)
    want = traverse_util.flatten_dict(shapes)
    if set(got) != set(want):
      missing = sorted("/".join(map(str, k)) for k in set(want) ^ set(got))
      raise ValueError(f"The initial head's parameters differ from this head's: {missing[:4]}")
    placed = {}
    for key, spec in want.items():
      value = np.asarray(jax.device_get(got[key]))
      if value.shape != spec.shape:
        raise ValueError(
          f"The initial head's {'/'.join(map(str, key))} has shape {value.shape}; this head's "
          f"is {spec.shape}."
        )
      if key in self._float_keys and not np.isfinite(value).all():
        raise ValueError(f"The initial head's {'/'.join(map(str, key))} is not finite.")
      placed[key] = value.astype(spec.dtype)
    params = traverse_util.unflatten_dict(placed)
    if self._map is not None and not np.array_equal(
      np.asarray(params["draft_to_target"]), self._map
    ):
      raise ValueError("The initial head's draft vocabulary is not this run's draft_to_target.")
    return jax.device_put(params, self.param_shardings)

  def _init_fn(self, draft_to_target=None, initial=None) -> TrainState:
    if initial is not None:
      params = initial
    else:
      head = FeatureHead(self.head_config, self.head_target_config, rngs=nnx.Rngs(self.seed))
      if draft_to_target is not None:
        head.draft_to_target[...] = draft_to_target
      params = train.params_of(head)
    floats, _ = _split(params, self._float_keys)
    return TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=self.optimizer.init(floats)
    )

  def _step_fn(self, state: TrainState, batch_BT, weights_BT, target_state, stored_BTS):
    floats, rest = _split(state.params, self._float_keys)
    (loss, metrics), grads = jax.value_and_grad(self._loss, has_aux=True)(
      floats, rest, batch_BT, weights_BT, target_state, stored_BTS
    )
    updates, opt_state = self.optimizer.update(grads, state.opt_state, floats)
    params = _join(optax.apply_updates(floats, updates), rest)
    last = self.config.ttt_steps - 1
    logged = dict(
      loss=loss,
      kl=metrics["kl0"],
      top1=metrics["top1_0"],
      top1_last=metrics[f"top1_{last}"],
      grad_norm=optax.tree.norm(grads),
    )
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), logged

  def _eval_fn(self, params, batch_BT, weights_BT, target_state, stored_BTS):
    floats, rest = _split(params, self._float_keys)
    return self._loss(floats, rest, batch_BT, weights_BT, target_state, stored_BTS)[0]

  def _greedy_correct_fn(self, params, batch_BT, weights_BT, target_state, steps, stored_BTS):
    model = self._model(params, target_state)
    return greedy_steps_correct(model, batch_BT, steps, stored_BTS, weights_BT)

  @property
  def initial_params(self) -> dict | None:
    """The placed ``initial_params`` a fresh run starts from; None: the seed's."""
    return self._initial

  # --- host API (what ``train.fit`` calls) ----------------------------------------------------
  def init_state(self) -> TrainState:
    with sharding.use_mesh(self.mesh):
      if self._initial is not None:
        return self._init(None, self._initial)
      return self._init(None if self._map is None else jnp.asarray(self._map))

  def place(self, batch: np.ndarray, dtype=np.int32) -> jax.Array:
    batch = np.asarray(batch, dtype)
    return jax.make_array_from_callback(
      batch.shape, self._batch_sharding, lambda index: batch[index]
    )

  def place_stored(self, stored: np.ndarray | None) -> jax.Array | None:
    """The target's stored outputs on a batch's rows, sharded as the batch is."""
    if stored is None:
      return None
    stored = np.asarray(stored)
    return jax.make_array_from_callback(
      stored.shape,
      NamedSharding(self.mesh, PartitionSpec(*self._batch_sharding.spec, None)),
      lambda index: stored[index],
    )

  def _place_all(self, batch) -> tuple[Any, ...]:
    """(tokens, weights or None) of a batch, placed, then the target's state and the stored
    outputs (or None: the step runs the target): the jitted functions' arguments."""
    tokens, weights = train.split_batch(batch)
    return (
      self.place(tokens),
      None if weights is None else self.place(weights, np.float32),
      self._target[1],
      self.place_stored(train.stored_of(batch)),
    )

  def train_step(self, state: TrainState, batch) -> tuple[TrainState, dict]:
    """One optimizer step on a batch: tokens [B, L + 1], or (tokens, weights), or (tokens,
    weights, stored target outputs) (``data``)."""
    with sharding.use_mesh(self.mesh):
      return self._step(state, *self._place_all(batch))

  def evaluate(self, params, batches) -> float:
    """The mean training-time-test loss over ``batches`` (``train.mean_over_batches``)."""
    with sharding.use_mesh(self.mesh):
      losses = [float(self._eval(params, *self._place_all(b))) for b in batches]
    return train.mean_over_batches(losses, batches)

  def greedy_correct(self, params, batch, steps: int) -> np.ndarray:
    """[steps, B, L] ``greedy_steps_correct`` of the head ``params`` on ``batch``: tokens, or a
    ``data.Batches`` batch (its stored target outputs used when it has them)."""
    tokens, weights, target_state, stored = self._place_all(batch)
    with sharding.use_mesh(self.mesh):
      return np.asarray(self._greedy_correct(params, tokens, weights, target_state, steps, stored))

  def head(self, params) -> FeatureHead:
    return nnx.merge(self.graphdef, params)

  def learning_rate(self, step: int) -> float:
    return float(train.learning_rate_schedule(self.config)(step))


def widen_mlp(params: dict, ffn_dim: int, seed: int = 0) -> dict:
  """A trained head's parameters with its MLP widened to ``ffn_dim`` hidden units, computing
  exactly what they computed (function-preserving growth, as Net2Net's): the new units' input
  columns (``gate_DF``, ``up_DF``) normal at LeCun's scale (variance 1 / D, from ``seed``),
  their output rows (``down_FD``) zero, so they add nothing until training moves those rows:
  a head that has stalled at its width goes on from what it knows with more room."""
  mlp = params["mlp"]
  width, old = mlp["down_FD"].shape[1], mlp["down_FD"].shape[0]
  if ffn_dim < old:
    raise ValueError(f"widen_mlp: the MLP has {old} hidden units; {ffn_dim} would narrow it.")
  rng = np.random.default_rng(seed)
  grown = {}
  for name, value in mlp.items():
    value = np.asarray(value, np.float32)
    if name == "down_FD":
      grown[name] = np.concatenate([value, np.zeros((ffn_dim - old, width), np.float32)], 0)
    else:  # gate_DF, up_DF: [D, F], fan-in D.
      fresh = rng.standard_normal((width, ffn_dim - old)).astype(np.float32) / np.sqrt(width)
      grown[name] = np.concatenate([value, fresh], 1)
  return dict(params, mlp=grown)


def head_meta(head_config: FeatureHeadConfig, target: Any) -> dict[str, Any]:
  """What a head checkpoint records and a reload must match: the resolved head config and the
  target model it reads (a head is bound to its target's features)."""
  target_model = {
    k: v
    for k, v in dataclasses.asdict(target.config).items()
    if k not in checkpoint.NOT_IDENTITY_FIELDS
  }
  meta = {
    "head": dataclasses.asdict(head_config.resolve(target.config)),
    "target_model": target_model,
  }
  return json.loads(json.dumps(meta))  # As it reads back (tuples are lists).


def load_head(
  directory: str,
  target: Any,
  mesh: jax.sharding.Mesh | None = None,
  *,
  expected_meta: dict[str, Any] | None = None,
  resume: str = "latest",
  param_dtype: str | None = None,
) -> tuple[FeatureDraftModel, dict[str, Any]]:
  """A feature head from its orbax checkpoint, paired with ``target`` (whose config must be
  the one it was trained on). Its parameters take the target's dtype, or ``param_dtype`` (e.g.
  float32, to train on from a checkpoint's master weights)."""
  store = checkpoint.Checkpoints(directory, resume=resume)
  meta = store.read_meta()
  if "head" not in meta:
    raise checkpoint.CheckpointError(f"{store.directory} holds no feature head (no 'head' meta).")
  head_config = FeatureHeadConfig.from_config(meta["head"])
  # The saved head config read with today's defaults for fields added since it was written.
  meta = dict(meta, head=head_meta(head_config, target)["head"])
  checkpoint.check_meta(meta, head_meta(head_config, target), store.directory)
  if expected_meta is not None:
    checkpoint.check_meta(meta, expected_meta, store.directory)
  head_target = (
    target.config if param_dtype is None else target.config.replace(param_dtype=param_dtype)
  )
  abstract = sharding.abstract_model(
    lambda rngs: FeatureHead(head_config, head_target, rngs=rngs),
    mesh or checkpoint.default_mesh(),
  )
  restored, read = store.restore({"params": abstract.arrays()})
  return FeatureDraftModel(abstract.merge(restored["params"]), target), read
