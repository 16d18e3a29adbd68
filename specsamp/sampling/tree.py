r"""Static tree shapes for multi-draft and tree speculative sampling.

A proposal is a tree of N draft nodes hanging under the ROOT, the row's last
token (already sampled, not yet fed to either model). Nodes are numbered
0..N-1 in breadth-first order: ``parents[i]`` is node i's parent, -1 for a
child of the root, and every parent comes before its children, depth by depth.
Node i at depth d (1 for a child of the root) holds a token x~_i drawn from
q(. | root path of i's parent) and sits at position n-1+d of a row of n tokens.

Shapes (the ``--config.speculative.tree`` strings, ``parse``):

  chains:KxD       K independent draft chains of D tokens each (multi-draft,
                   SpecTr / SpecInfer): K children of the root, each the start
                   of a chain. N = K D. Siblings are i.i.d. draws.
  tree:b1,b2,..    every node at depth d-1 has b_d children (SpecInfer- /
                   Sequoia-style token tree). N = b1 + b1 b2 + ...
                   Siblings are drawn WITHOUT replacement (distinct tokens).
  parents:p0,p1,.. any tree, by its parent list (siblings without replacement).
  chain:D          one chain, N = D: the ordinary draft block.
  dynamic:w1,..,wD a DYNAMIC tree (EAGLE-2, Li et al. 2024, arXiv 2406.16858) of w_d nodes at
  dynamic:WxD      depth d (WxD: W at every depth): the drafter expands, per row, the w_d
                   children of highest joint draft probability among the w_d most likely
                   children of each depth-(d-1) node. Its shape is static (N = sum w_d slots,
                   depth by depth); which node is whose parent is chosen per row
                   (``TreeProposal.parents``). Its tokens are deterministic choices, so only
                   the 'greedy' proposal mode (one-hot q) fills it (``proposals.py``).
  dynamic:WxD@tau  the same, ranking paths by the draft's confidence sharpened to
                   temperature tau (softmax(log c / tau), c: the draft's softmax at T=0, its
                   warped q at T > 0); tau < 1 calibrates an over-spread draft
                   (``calibration.fit_rank_temperature``), tau = 1 is EAGLE-2's ranking.
  sequoia:NxD@a0,a1,..  the static tree of at most N nodes and depth D with the most expected
                   accepted tokens when a node's rank-r child is accepted with probability
                   a_r (Sequoia; ``sequoia``). The a_r are what a run measured: its summary's
                   ``acceptance_at_rank``.

A suffix ``/iid`` or ``/distinct`` overrides how siblings are drawn:
``/iid`` draws each sibling independently from its parent's q (duplicates
possible); ``/distinct`` draws siblings without replacement, each from q
renormalised over the tokens its earlier siblings did not take (Jeon et al.
2024, arXiv 2402.14160). Either way every node records the distribution it was
actually drawn from, which is all the verifiers need.

Everything here is static (numpy or Python tuples): the loop compiles once per
shape. For a dynamic tree ``parents`` is only its slot layout (each depth's slots hang under
the previous depth's first slot); the structure that counts is the proposal's per-row parents,
and what needs it (the tree calls' masks, the verifiers) takes it from there.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

MAX_NODES = 1024  # Draft nodes one tree call scores (TreeShape refuses more; Sequoia: <= 768).


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """A tree of N draft nodes under the root (see the module docstring).

  Attributes:
    parents: parent of each node, -1 for a child of the root; breadth-first order (for a
      dynamic tree: its slot layout only, module docstring).
    distinct_siblings: siblings are drawn without replacement (else i.i.d.).
    dynamic: the parents are chosen per row by the drafter (EAGLE-2, ``dynamic``).
    rank_temperature: a dynamic tree ranks paths by the product of the draft's confidence
      along them, each sharpened to this temperature (module docstring); 1 for a static tree.
  """

  parents: tuple[int, ...]
  distinct_siblings: bool = True
  dynamic: bool = False
  rank_temperature: float = 1.0

  def __post_init__(self):
    parents = tuple(int(p) for p in self.parents)
    object.__setattr__(self, "parents", parents)
    if not parents:
      raise ValueError("A tree needs at least one node.")
    if len(parents) > MAX_NODES:
      raise ValueError(
        f"A tree of {len(parents):,} nodes: specsamp scores at most {MAX_NODES:,} per call "
        "(published trees have 60 to 768; the loop's compile grows with the nodes, about 0.5 s "
        "a node on a 2-core CPU)."
      )
    tau = self.rank_temperature
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 < tau < float("inf"):
      raise ValueError(f"rank_temperature must be a finite number > 0, got {tau!r}.")
    if tau != 1.0 and not self.dynamic:
      raise ValueError("Only a dynamic tree ranks its paths: rank_temperature needs dynamic.")
    object.__setattr__(self, "rank_temperature", float(tau))
    depth = []
    for i, parent in enumerate(parents):
      if not -1 <= parent < i:
        raise ValueError(
          f"Node {i}'s parent is {parent}: every parent must be -1 (the root) or an earlier "
          "node, in breadth-first order."
        )
      depth.append(1 if parent < 0 else depth[parent] + 1)
    if any(b < a for a, b in zip(depth, depth[1:])):
      raise ValueError(f"Nodes must come depth by depth (breadth-first); depths are {depth}.")

  @functools.cached_property
  def depths(self) -> tuple[int, ...]:
    """Depth of each node: 1 for a child of the root."""
    depth = []
    for parent in self.parents:
      depth.append(1 if parent < 0 else depth[parent] + 1)
    return tuple(depth)

  @property
  def num_nodes(self) -> int:
    return len(self.parents)

  @property
  def max_depth(self) -> int:
    """D: the most draft tokens one iteration can accept."""
    return max(self.depths)

  @functools.cached_property
  def is_chain(self) -> bool:
    return self.parents == tuple(range(-1, self.num_nodes - 1))

  def nodes_at_depth(self, depth: int) -> tuple[int, ...]:
    return tuple(i for i, d in enumerate(self.depths) if d == depth)

  @functools.cached_property
  def _children(self) -> dict[int, tuple[int, ...]]:
    """node (-1: the root) -> its children, in order; one pass over the parents."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(self.parents):
      children.setdefault(parent, []).append(i)
    return {node: tuple(nodes) for node, nodes in children.items()}

  def children(self, node: int) -> tuple[int, ...]:
    """Children of ``node`` (-1: the root), in order."""
    return self._children.get(node, ())

  @functools.cached_property
  def sibling_rank(self) -> tuple[int, ...]:
    """Each node's index among its parent's children."""
    rank = [0] * self.num_nodes
    for nodes in self._children.values():
      for index, node in enumerate(nodes):
        rank[node] = index
    return tuple(rank)

  @functools.cached_property
  def ancestors(self) -> np.ndarray:
    """[N, N] bool: ancestors[i, j] iff node j is node i or one of its ancestors."""
    mask = np.zeros((self.num_nodes, self.num_nodes), bool)
    for i, parent in enumerate(self.parents):
      mask[i, i] = True
      if parent >= 0:
        mask[i] |= mask[parent]
    return mask

  def attention_mask(self) -> np.ndarray:
    """[N+1, N+1] bool over the scored tokens [root, node 0, .., node N-1]: token t sees token
    u iff u is t or one of its ancestors (the root is everyone's ancestor)."""
    mask = np.zeros((self.num_nodes + 1, self.num_nodes + 1), bool)
    mask[:, 0] = True
    mask[1:, 1:] = self.ancestors
    return mask

  def position_offsets(self) -> np.ndarray:
    """[N+1] int32: each scored token's position after the root's (0, then the depths)."""
    return np.asarray((0, *self.depths), np.int32)

  @functools.cached_property
  def max_children(self) -> int:
    """R: the most children one node (the root included) can have; a dynamic tree's node may
    hold all of the next depth's slots."""
    if self.dynamic:
      return max(self.widths)
    return max(len(nodes) for nodes in self._children.values())

  @property
  def widths(self) -> tuple[int, ...]:
    """Nodes per depth, 1..D."""
    return tuple(len(self.nodes_at_depth(d)) for d in range(1, self.max_depth + 1))

  def describe(self) -> str:
    if self.dynamic:
      tau = self.rank_temperature
      ranking = "" if tau == 1.0 else f" at rank temperature {tau:g}"
      return (
        f"a dynamic tree of {self.num_nodes} nodes, depth {self.max_depth}, nodes per depth "
        f"{list(self.widths)}, parents chosen per row by joint draft probability{ranking}"
      )
    draws = "without replacement" if self.distinct_siblings else "i.i.d."
    return (
      f"{self.num_nodes} nodes, depth {self.max_depth}, nodes per depth {list(self.widths)}, "
      f"siblings {draws}"
    )


def chain(length: int) -> TreeShape:
  """One draft chain of ``length`` tokens: the ordinary block (N = K)."""
  return TreeShape(tuple(range(-1, length - 1)), distinct_siblings=False)


def chains(num_chains: int, length: int) -> TreeShape:
  """``num_chains`` independent chains of ``length`` tokens (multi-draft), i.i.d. siblings.
  Breadth-first: node (depth d, chain c) is index (d - 1) * num_chains + c."""
  if num_chains < 1 or length < 1:
    raise ValueError(f"chains needs at least 1 chain of 1 token, got {num_chains}x{length}.")
  parents = [-1] * num_chains
  for depth in range(1, length):
    parents += [(depth - 1) * num_chains + c for c in range(num_chains)]
  return TreeShape(tuple(parents), distinct_siblings=False)


def branching(factors: tuple[int, ...] | list[int]) -> TreeShape:
  """Every node at depth d-1 has ``factors[d-1]`` children (siblings without replacement)."""
  if not factors or any(int(b) < 1 for b in factors):
    raise ValueError(f"Branching factors must be >= 1 per depth, got {tuple(factors)}.")
  parents: list[int] = []
  level = [-1]
  for factor in factors:
    next_level = []
    for parent in level:
      for _ in range(int(factor)):
        next_level.append(len(parents))
        parents.append(parent)
    level = next_level
  return TreeShape(tuple(parents), distinct_siblings=True)


def dynamic(widths: tuple[int, ...] | list[int], rank_temperature: float = 1.0) -> TreeShape:
  """A dynamic tree (module docstring) of ``widths[d-1]`` nodes at depth d, any widths >= 1:
  depth d picks its w_d nodes among the w_{d-1} * w_d candidates (each depth-(d-1) node's w_d
  most likely children), so it can always fill them; paths ranked at ``rank_temperature``."""
  if not widths or any(int(w) < 1 for w in widths):
    raise ValueError(f"A dynamic tree needs >= 1 node per depth, got widths {tuple(widths)}.")
  parents: list[int] = []
  first = -1  # The previous depth's first slot.
  for width in widths:
    here = len(parents)
    parents += [first] * int(width)
    first = here
  return TreeShape(
    tuple(parents), distinct_siblings=True, dynamic=True, rank_temperature=rank_temperature
  )


def expected_accepted(tree: TreeShape, acceptance: tuple[float, ...] | list[float]) -> float:
  """Draft tokens a static tree is expected to get accepted per iteration when a node's
  rank-r child is the accepted one with probability ``acceptance[r]`` given its parent was
  (Sequoia's positional acceptance): the sum over nodes of the product along their path."""
  value, reach = 0.0, []
  for node, parent in enumerate(tree.parents):
    rank = tree.sibling_rank[node]
    p = acceptance[rank] if rank < len(acceptance) else 0.0
    reach.append(p * (1.0 if parent < 0 else reach[parent]))
    value += reach[-1]
  return value


def sequoia(
  acceptance: tuple[float, ...] | list[float], num_nodes: int, max_depth: int
) -> TreeShape:
  """The static tree of at most ``num_nodes`` nodes and depth ``max_depth`` that maximises
  ``expected_accepted`` for the acceptance per sibling rank ``acceptance`` (Sequoia, Chen et
  al. 2024, arXiv 2402.12374: dynamic programming over subtree sizes). Siblings are drawn
  without replacement, in rank order, as measured (``statistics``: acceptance_at_rank)."""
  acceptance = [float(a) for a in acceptance]
  ranks = len(acceptance)
  if ranks < 1 or num_nodes < 1 or max_depth < 1 or any(not 0 <= a <= 1 for a in acceptance):
    raise ValueError(
      f"sequoia needs acceptances in [0, 1] per rank, >= 1 node and depth >= 1; got "
      f"{list(acceptance)}, {num_nodes} nodes, depth {max_depth}."
    )
  if num_nodes > MAX_NODES:  # Before the search, which grows with num_nodes squared.
    raise ValueError(
      f"sequoia asked for a tree of up to {num_nodes:,} nodes: specsamp scores at most "
      f"{MAX_NODES:,} per call."
    )
  none = -1.0  # No tree of that size fits (every value is >= 0).
  # best[d][n]: the most a node's subtree of n nodes below it, at most d deep, adds.
  # share[d][r][m]: the most children of ranks r.. with m nodes in all add, and how.
  best = [[0.0] + [none] * num_nodes]
  choice: dict[tuple[int, int, int], int] = {}
  for depth in range(1, max_depth + 1):
    share = [[0.0] + [none] * num_nodes for _ in range(ranks + 1)]
    for r in range(ranks - 1, -1, -1):
      for m in range(1, num_nodes + 1):
        for size in range(1, m + 1):  # The rank-r child's subtree, itself included.
          below, rest = best[depth - 1][size - 1], share[r + 1][m - size]
          if below < 0 or rest < 0:
            continue
          value = acceptance[r] * (1.0 + below) + rest
          if value > share[r][m] + 1e-12:
            share[r][m], choice[depth, r, m] = value, size
    best.append(share[0])
  size = max(range(num_nodes + 1), key=lambda m: (best[max_depth][m], -m))
  if size == 0:  # Every rank's acceptance is 0: no node is ever expected to be accepted.
    raise ValueError(
      f"sequoia's acceptances {list(acceptance)} are all 0, so every tree is expected to "
      "accept nothing and the best one is empty; give the acceptance per rank a run measured "
      "(its summary's acceptance_at_rank), or sample without a tree"
    )

  def children(depth: int, nodes: int) -> list:
    """The subtrees (lists of their children) under a node with ``nodes`` nodes below it."""
    kids, r = [], 0
    while nodes > 0:
      taken = choice[depth, r, nodes]
      kids.append(children(depth - 1, taken - 1))
      nodes, r = nodes - taken, r + 1
    return kids

  parents: list[int] = []
  level = [(-1, children(max_depth, size))]
  while level:  # Breadth first, siblings in rank order.
    next_level = []
    for parent, kids in level:
      for kid in kids:
        next_level.append((len(parents), kid))
        parents.append(parent)
    level = next_level
  return TreeShape(tuple(parents), distinct_siblings=True)


def parse(spec: str) -> TreeShape:
  """A TreeShape from its config string (module docstring): 'chains:2x4', 'tree:3,2,1,1',
  'parents:-1,-1,0', 'chain:4', each optionally with '/iid' or '/distinct'."""
  text, slash, draws = spec.strip().partition("/")
  kind, _, args = text.partition(":")
  kind = kind.strip()
  try:
    if kind == "chains":
      count, _, length = args.lower().partition("x")
      shape = chains(int(count), int(length))
    elif kind == "tree":
      shape = branching([int(b) for b in args.split(",")])
    elif kind == "parents":
      shape = TreeShape(tuple(int(p) for p in args.split(",")))
    elif kind == "chain":
      shape = chain(int(args))
    elif kind == "sequoia":
      budget, _, measured = args.partition("@")
      count, _, depth = budget.lower().partition("x")
      shape = sequoia([float(a) for a in measured.split(",")], int(count), int(depth))
    elif kind == "dynamic":
      budget, at, tau = args.partition("@")
      width, times, depth = budget.lower().partition("x")
      widths = [int(width)] * int(depth) if times else [int(w) for w in budget.split(",")]
      shape = dynamic(widths, float(tau) if at else 1.0)
    else:
      raise ValueError(f"unknown kind {kind!r}")
  except ValueError as error:
    raise ValueError(
      f"Bad tree {spec!r}: {str(error).rstrip('.')}. Use 'chains:KxD' (K chains of D tokens), "
      "'tree:b1,b2,...' (branching per depth), 'parents:-1,-1,0,...', 'chain:D' (each "
      "optionally with '/iid' or '/distinct'), 'dynamic:w1,w2,...' / 'dynamic:WxD' "
      "(EAGLE-2: w_d nodes at depth d, parents chosen per row; '@tau' ranks at temperature "
      "tau), or 'sequoia:NxD@a0,a1,...' "
      "(the best static tree of N nodes, depth D, for acceptance a_r per sibling rank)."
    ) from None
  if slash and not draws:  # 'tree:2/' was read as no suffix.
    raise ValueError(f"Bad tree {spec!r}: the suffix must be '/iid' or '/distinct'.")
  if draws and shape.dynamic:
    raise ValueError(
      f"Bad tree {spec!r}: a dynamic tree's siblings are its draft's most likely distinct "
      "tokens; it takes no '/iid' or '/distinct' suffix."
    )
  if draws:
    if draws not in ("iid", "distinct"):
      raise ValueError(f"Bad tree {spec!r}: the suffix must be '/iid' or '/distinct'.")
    shape = dataclasses.replace(shape, distinct_siblings=draws == "distinct")
  return shape
