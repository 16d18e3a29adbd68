"""Benchmark figures (matplotlib, no display needed), modelled on Chen et al. Figure 1.

speedup_vs_k.png            measured speedup over K, one panel per sampling mode, a line per
                            drafter/verifier, the predicted speedup dashed in the same colour
acceptance_per_position.png P(draft token t accepted), t = 1..K, at the largest K swept
ms_per_token.png            autoregressive vs speculative ms/token (best K) per mode and batch
tree_attention.png          a draft tree and the attention mask of the one target call that
                            scores it (``tree_figure``; docs/how_it_works.md)
"""

from __future__ import annotations

import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)


def _by(records, *fields):
  groups = defaultdict(list)
  for record in records:
    groups[tuple(record[f] for f in fields)].append(record)
  return groups


def _label(drafter: str, verifier: str) -> str:
  return drafter if verifier in ("synthetic", "token") else f"{drafter} ({verifier})"


def speedup_vs_k(records: list[dict], batch_size: int, path: str) -> str:
  modes = sorted({r["mode"] for r in records})
  figure, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 4), squeeze=False)
  for axis, mode in zip(axes[0], modes):
    chosen = [r for r in records if r["mode"] == mode and r["batch_size"] == batch_size]
    for index, ((drafter, verifier), group) in enumerate(
      sorted(_by(chosen, "drafter", "verifier").items())
    ):
      group.sort(key=lambda r: r["num_draft_tokens"])
      ks = [r["num_draft_tokens"] for r in group]
      color = f"C{index}"
      axis.plot(
        ks, [r["speedup"] for r in group], "o-", color=color, label=_label(drafter, verifier)
      )
      axis.plot(  # A marker: one K alone is one point, which a bare dashed line does not draw.
        ks, [r["predicted_speedup"] for r in group], "x--", color=color, alpha=0.7
      )
    axis.axhline(1.0, color="gray", lw=0.8)
    axis.set(
      title=f"{mode}, batch {batch_size}",
      xlabel="K (draft tokens per target call)",
      ylabel="speedup over autoregressive",
    )
    axis.legend(fontsize=8, title="solid, o: measured; dashed, x: predicted", title_fontsize=7)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)
  return path


def acceptance_per_position(records: list[dict], batch_size: int, path: str) -> str:
  modes = sorted({r["mode"] for r in records})
  figure, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 4), squeeze=False)
  for axis, mode in zip(axes[0], modes):
    chosen = [r for r in records if r["mode"] == mode and r["batch_size"] == batch_size]
    if not chosen:
      continue
    num_draft_tokens = max(r["num_draft_tokens"] for r in chosen)
    for index, ((drafter, verifier), group) in enumerate(
      sorted(
        _by(
          [r for r in chosen if r["num_draft_tokens"] == num_draft_tokens], "drafter", "verifier"
        ).items()
      )
    ):
      at = group[0]["acceptance_at_position"]
      axis.plot(
        range(1, len(at) + 1),
        at,
        "o-",
        color=f"C{index}",
        label=f"{_label(drafter, verifier)}: alpha {group[0]['alpha']:.2f}",
      )
    axis.set(
      title=f"{mode}, K={num_draft_tokens}, batch {batch_size}",
      xlabel="draft position t",
      ylabel="P(draft token t accepted)",
      ylim=(0, 1.02),
    )
    axis.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)
  return path


def ms_per_token(records: list[dict], drafter: str, verifier: str, path: str) -> str:
  """Autoregressive vs the best K of one drafter/verifier (greedy uses 'token')."""
  bars = []
  for (mode, batch), group in sorted(_by(records, "mode", "batch_size").items()):
    mine = [
      r
      for r in group
      if r["drafter"] == drafter
      and r["verifier"] == (verifier if r["temperature"] > 0 else "token")
    ]
    if mine:
      best = min(mine, key=lambda r: r["ms_per_token"])
      bars.append(
        (
          f"{mode}\nb={batch}",
          best["ar_ms_per_token"],
          best["ms_per_token"],
          best["num_draft_tokens"],
        )
      )
  figure, axis = plt.subplots(figsize=(max(6, 1.1 * len(bars)), 4))
  xs = range(len(bars))
  axis.bar([x - 0.2 for x in xs], [b[1] for b in bars], 0.4, label="autoregressive")
  axis.bar([x + 0.2 for x in xs], [b[2] for b in bars], 0.4, label=f"speculative ({drafter})")
  for x, bar in zip(xs, bars):
    axis.annotate(
      f"K={bar[3]}\n{bar[1] / bar[2]:.2f}x", (x + 0.2, bar[2]), ha="center", va="bottom", fontsize=7
    )
  axis.set_xticks(list(xs), [b[0] for b in bars], fontsize=8)
  axis.set(
    ylabel="ms per token (per row)", title="ms/token: autoregressive vs speculative (best K)"
  )
  axis.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)
  return path


def write_all(results: dict, output_dir: str, batch_size: int = 1) -> list[str]:
  """All figures of one results.json into ``output_dir``."""
  # Fixed-K records (the automatic length's records are in the summary's own table).
  records = [r for r in results["records"].values() if isinstance(r["num_draft_tokens"], int)]
  if not records:
    return []
  drafter = next(
    (r["drafter"] for r in records if r["drafter"] != "synthetic"), records[0]["drafter"]
  )
  batch = (
    batch_size if any(r["batch_size"] == batch_size for r in records) else records[0]["batch_size"]
  )
  return [
    speedup_vs_k(records, batch, os.path.join(output_dir, "speedup_vs_k.png")),
    acceptance_per_position(
      records, batch, os.path.join(output_dir, "acceptance_per_position.png")
    ),
    ms_per_token(records, drafter, "token", os.path.join(output_dir, "ms_per_token.png")),
  ]


def tree_figure(spec: str, path: str, accepted: tuple[int, ...] = ()) -> str:
  """A tree proposal (``sampling.tree`` string) drawn as a tree, beside the [N+1, N+1] mask of
  the target call that scores it; ``accepted`` nodes (a root path) are highlighted."""
  from specsamp.sampling import tree as tree_lib  # The figure's only sampling dependency.

  shape = tree_lib.parse(spec)
  names = ["root"] + [f"{i}" for i in range(shape.num_nodes)]
  # Leaves spread evenly; a parent sits above the middle of its children.
  x_of: dict[int, float] = {}
  leaves = iter(range(shape.num_nodes + 1))

  def place(node: int) -> float:
    children = shape.children(node)
    x_of[node] = (
      float(next(leaves)) if not children else sum(place(c) for c in children) / len(children)
    )
    return x_of[node]

  place(-1)
  figure, (left, right) = plt.subplots(1, 2, figsize=(12, 5), width_ratios=(1.1, 1))
  for node, parent in enumerate(shape.parents):
    depth = shape.depths[node]
    left.plot([x_of[parent], x_of[node]], [-(depth - 1), -depth], color="0.6", zorder=1)
  for node in [-1, *range(shape.num_nodes)]:
    depth = 0 if node < 0 else shape.depths[node]
    on_path = node < 0 or node in accepted
    left.scatter(x_of[node], -depth, s=500, zorder=2, color="tab:green" if on_path else "tab:blue")
    left.annotate(names[node + 1], (x_of[node], -depth), ha="center", va="center", color="white")
  left.set_yticks([-d for d in range(shape.max_depth + 1)])
  left.set_yticklabels([f"position n-1+{d}" for d in range(shape.max_depth + 1)])
  left.set_xticks([])
  left.set_title(
    f"{spec}: {shape.num_nodes} nodes, depth {shape.max_depth}"
    + ("; accepted path green" if accepted else "")
  )
  for side in ("top", "right", "bottom"):
    left.spines[side].set_visible(False)
  right.imshow(shape.attention_mask(), cmap="Blues", vmin=0, vmax=1.4)
  ticks = range(shape.num_nodes + 1)
  right.set_xticks(ticks, names, fontsize=8)
  right.set_yticks(ticks, names, fontsize=8)
  right.set_xlabel("slot root + m (key)")
  right.set_ylabel("scored token (query)")
  right.set_title("the score call's mask over the tree's slots\n(every slot before the root: all)")
  figure.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  figure.savefig(path, dpi=110)
  plt.close(figure)
  return path


def feature_head_figure(path: str) -> str:
  """The feature head (``models/feature_head.py``) as a block diagram: its inputs (the
  target's features entering three layers, the next token's embedding), its one decoder
  layer, its output, and the loop by which its own h stands in for a feature."""
  from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

  figure, axis = plt.subplots(figsize=(12, 6.2))
  axis.set_xlim(0, 12)
  axis.set_ylim(0, 6.6)
  axis.axis("off")
  colours = {"target": "#dbe8f5", "head": "#fde3c8", "shared": "#dcefd9", "out": "#eeeeee"}

  def box(x, y, text, kind, width=2.1, height=0.62):
    axis.add_patch(
      FancyBboxPatch(
        (x - width / 2, y - height / 2),
        width,
        height,
        boxstyle="round,pad=0.04",
        facecolor=colours[kind],
        edgecolor="0.35",
      )
    )
    axis.text(x, y, text, ha="center", va="center", fontsize=9)
    return x, y, width, height

  def arrow(a, b, text="", dashed=False, bend=0.0):
    (xa, ya, wa, _), (xb, yb, wb, _) = a, b
    start = (xa + wa / 2, ya) if xb > xa + 0.5 else (xa, ya - 0.31 if yb < ya else ya + 0.31)
    end = (xb - wb / 2, yb) if xb > xa + 0.5 else (xb, yb + 0.31 if yb < ya else yb - 0.31)
    axis.add_patch(
      FancyArrowPatch(
        start,
        end,
        arrowstyle="-|>",
        mutation_scale=12,
        color="0.25",
        linestyle="--" if dashed else "-",
        connectionstyle=f"arc3,rad={bend}",
      )
    )
    if text:
      axis.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.18, text, fontsize=8)

  low = box(1.3, 6.0, "target: entering layer 2", "target")
  mid = box(1.3, 5.2, "entering layer N//2", "target")
  high = box(1.3, 4.4, "entering layer N-3", "target")
  fc = box(4.0, 5.2, "concat [3D] -> fc -> D\nfused f_p", "head", height=0.8)
  token = box(1.3, 2.2, "next token x_{p+1}", "out")
  embed = box(4.0, 2.2, "target's embedding\n(shared)", "shared", height=0.8)
  inputs = box(6.5, 3.7, "[norm_e(embed) | norm_f(f)]\n2D wide", "head", height=0.8)
  attention = box(
    9.0, 3.7, "attention, own KV cache\nRoPE at p; + f (residual)", "head", height=0.8
  )
  mlp = box(9.0, 2.2, "h_p = r + MLP(norm(r))", "head")
  out = box(
    9.0, 0.8, "final norm + head: the target's\n(shared) or own V_d + map", "shared", height=0.8
  )
  q = box(11.3, 0.8, "q over V\n(0 off the map)", "out", width=1.3, height=0.8)
  for source in (low, mid, high):
    arrow(source, fc)
  arrow(token, embed)
  arrow(fc, inputs)
  arrow(embed, inputs)
  arrow(inputs, attention)
  arrow(attention, mlp)
  arrow(mlp, out)
  arrow(out, q)
  axis.add_patch(
    FancyArrowPatch(
      (mlp[0] - 1.05, mlp[1]),
      (inputs[0] - 0.3, inputs[1] - 0.41),
      arrowstyle="-|>",
      mutation_scale=12,
      color="tab:red",
      linestyle="--",
      connectionstyle="arc3,rad=-0.35",
    )
  )
  axis.text(
    3.2,
    0.75,
    "drafting past the last scored position, the head's own h_p\nstands in for the next fused "
    "feature f (it skips fc)",
    fontsize=8,
    color="tab:red",
  )
  axis.set_title(
    "The feature head (EAGLE-3 style): blue = the target's features, orange = the head's own "
    "weights, green = shared with the target",
    fontsize=10,
  )
  figure.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  figure.savefig(path, dpi=110)
  plt.close(figure)
  return path
