"""The specsamp Transformer family: config, layers, attention with KV cache, model.

Shape letters, used as suffixes on array names (``logits_BTV``) and in einsum
strings (``'BTD,DNH->BTNH'``) throughout specsamp:

  B  batch (rows)
  T  query length: tokens processed in one call (a padded prompt, 1, or K+1)
  S  cache length (slots); slot s holds the key/value of absolute position s
  W  token buffer width: a row's prompt, its generated tokens and the draft slack
  D  model dim (d_model)
  N  query heads
  K  key/value heads (N == K: MHA; 1 < K < N: GQA; K == 1: MQA)
  R  query heads per key/value head, N // K
  H  head dim
  F  feed-forward (MLP) hidden dim
  V  vocabulary
  L  layers
  G  draft length (gamma, the paper's K draft tokens; K is taken by kv heads)

Each letter has this one meaning. A digit is a literal size (``logits_B2V``: two
positions), and ``G1`` is G + 1 (the K draft positions and the bonus position).
"""

from specsamp.models.config import TransformerConfig
from specsamp.models.kv_cache import KVCache
from specsamp.models.transformer import Transformer

__all__ = ["TransformerConfig", "KVCache", "Transformer"]
