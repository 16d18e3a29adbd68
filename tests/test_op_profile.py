"""Where a call's time goes (experiments/benchmarks/op_profile.py): scopes read from HLO text,
and a profiled call's operations summed by the scopes they came from."""

import jax
import jax.numpy as jnp

from specsamp.experiments.benchmarks import op_profile

HLO = """HloModule jit_f, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%body (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %norm_fusion = f32[1,4] fusion(%p), metadata={op_name="jit(f)/while/body/score/layer_2/mlp/mul"}
  %dot.7 = f32[1,4]{1,0} dot(%norm_fusion, %w), lhs_contracting_dims={1}
  %gte = f32[4]{0} get-tuple-element(%t), index=0
  %dot.8 = f32[1,4]{1,0} dot(%gte, %w)
  ROOT %ynn_fusion.3 = f32[4]{0} fusion(%dot.7), metadata={op_name="jit(f)/draft/logits/x" id=3}
}
"""


def test_scopes_come_from_op_names_and_a_product_without_one_takes_its_inputs():
  scopes = op_profile.op_scopes(HLO)
  assert scopes["norm_fusion"] == "jit(f)/while/body/score/layer_2/mlp/mul"
  assert scopes["ynn_fusion.3"] == "jit(f)/draft/logits/x"
  # XLA's CPU backend drops the op_name of the one-row products it rewrites: the product is
  # its input's (the layer's norm), not unattributed.
  assert scopes["dot.7"] == scopes["norm_fusion"]
  assert "dot.8" not in scopes  # Its only operand has no scope: left unattributed.
  assert op_profile.scope_of(scopes["dot.7"], 3) == "score/layer/mlp"
  assert op_profile.scope_of(scopes["dot.7"], 1) == "score"
  assert op_profile.scope_of("jit(f)/while/body/add", 2) == "add"
  assert op_profile.scope_of("jit(f)", 2) == "(top level)"


def test_a_profiled_call_sums_its_operations_by_scope():
  def f(x, w):
    def body(i, x):
      with jax.named_scope("first"):
        x = jnp.tanh(x @ w)
      with jax.named_scope("second"):
        x = jnp.sin(x @ w) + jnp.cos(x @ (2 * w))
      return x

    return jax.lax.fori_loop(0, 20, body, x)

  x, w = jnp.ones((4, 128)), jnp.eye(128) * 0.5
  result = op_profile.profile_call(jax.jit(f), (x, w), depth=1)
  assert set(result["scopes"]) >= {"first", "second"}, result
  # Each of the 20 trips runs each scope's operations: counted per trip, not once.
  assert min(result["operations"]["first"], result["operations"]["second"]) >= 20, result
  assert result["wall_ms"] > 0 and result["traced_ms"] >= sum(result["scopes"].values())
  table = op_profile.format_profile("f", result)
  assert "| first |" in table and "| second |" in table
