r"""The exactness certificate: G-tests of speculative samples against exact enumeration.

  python scripts/certify.py                       # every case, 10^6 sequences each
  python scripts/certify.py --scope=quick --num_samples=100000
  python scripts/certify.py --scope=trees --output=docs/certificate_trees.md   # trees only
  python scripts/certify.py --scope=trees --model=transformer --num_samples=100000
  python scripts/certify.py --scope=proposals --num_samples=100000   # proposal modes, dynamic trees
  python scripts/certify.py --output=docs/certificate.md
  # Are the thresholds honest? Fresh null values of G against each distribution's thresholds:
  python scripts/certify.py --null_check=20000 --num_samples=1000000
  # A real pretrained target: SmolLM2-135M-Instruct at top-k 4, 3 new tokens (4^3 continuations
  # enumerated from its own logits), a self-speculative draft, and a planted bug:
  python scripts/certify.py --real_target=smollm2 --num_samples=100000 --real_bug_samples=20000

Runs on a CPU with 8 simulated devices (for the 2x4 mesh cases; the real target on one); see
specsamp/experiments/proofs/certify.py for the cases, the planted bugs and the test. Exits 1 if
any real case is rejected or any planted bug is not.
"""

import os
import sys
import time

if not any(arg.startswith("--real_target") for arg in sys.argv):
  # The 2x4 mesh cases need 8 simulated devices. The real target runs on one, and splitting
  # the host into 8 devices made its draws 8x slower (42 s against 5 s per 256 rows).
  # XLA aborts a process whose simulated devices wait over 40 s in a collective's rendezvous,
  # which a certificate of hours beside other work on a small machine can reach: raised.
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8"
    + " --xla_cpu_collective_call_terminate_timeout_seconds=3600"
  ).strip()

from absl import flags  # noqa: E402

from specsamp import files
from specsamp.experiments import cli  # noqa: E402
from specsamp.experiments.proofs import certify

_SCOPE = flags.DEFINE_enum(
  "scope", "full", list(certify.SCOPES), "Which cases (see certify.all_cases)."
)
_MODEL = flags.DEFINE_enum(
  "model",
  "all",
  ["all", "trigram", "transformer"],
  "Only this model's cases.",
)
_MESH = flags.DEFINE_enum("mesh", "all", ["all", "1", "2x4"], "Only the cases on this mesh.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1_000_000, "Sequences drawn per case.")
_LEVEL = flags.DEFINE_float("level", 1e-4, "Each G-test's false-rejection probability.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed (case i uses seed + i).")
_OUTPUT = cli.output_file(
  flags.DEFINE_string("output", None, "Also write the table (Markdown) to this file.")
)
_NULL_CHECK = flags.DEFINE_integer(
  "null_check",
  0,
  "Instead of sampling: for each exact distribution of the chosen cases, count how many of this "
  "many fresh bootstrap values of G exceed the calibrated threshold and the chi-square's "
  "(certify.null_check), at --num_samples draws.",
)
_REAL_TARGET = flags.DEFINE_string(
  "real_target",
  None,
  "Certify on a real target instead: a GGUF file or 'smollm2' (certify_real.py).",
)
_REAL_PROMPT = flags.DEFINE_string("real_prompt", "def fibonacci(n):", "The real target's prompt.")
_REAL_TOP_K = flags.DEFINE_integer("real_top_k", 4, "Top-k that makes the real target enumerable.")
_REAL_DRAFT_LAYERS = flags.DEFINE_integer(
  "real_draft_layers",
  12,
  "The real draft: the target's first L layers, its final norm and head. SmolLM2's first 4 "
  "put no top-4 mass where the target does (every draft token rejected, and a planted bug in "
  "the residual invisible); its first 12 overlap it.",
)
_REAL_BUG_SAMPLES = flags.DEFINE_integer(
  "real_bug_samples", 0, "Sequences drawn for the real target's planted bug (0: --num_samples)."
)
_REAL_CACHE = flags.DEFINE_string(
  "real_cache",
  "workdir/certify_real",
  "The real case's draws are saved here chunk by chunk; a rerun resumes ('' : not saved).",
)

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def real_target_main() -> None:
  from specsamp.experiments.proofs import certify_real
  from specsamp.hf import gguf

  path = gguf.resolve(_REAL_TARGET.value)
  target, _ = gguf.import_model(path)
  prompt = gguf.tokenizer(gguf.read(path)).encode(_REAL_PROMPT.value)
  start = time.perf_counter()
  results = certify_real.certify_real(
    target,
    prompt,
    name=f"{os.path.basename(path)} ({os.path.getsize(path):,} bytes)",
    top_k=_REAL_TOP_K.value,
    draft_layers=_REAL_DRAFT_LAYERS.value,
    num_samples=_NUM_SAMPLES.value,
    bug_samples=_REAL_BUG_SAMPLES.value or None,
    level=_LEVEL.value,
    seed=_SEED.value,
    cache_dir=_REAL_CACHE.value or None,
  )
  table = certify_real.format_table(results, _LEVEL.value)
  failed = [r for r in results if not r["passed"]]
  summary = (
    f"{os.path.basename(path)}, prompt {_REAL_PROMPT.value!r} ({len(prompt)} tokens), "
    f"{_NUM_SAMPLES.value:,} sequences per case, {(time.perf_counter() - start) / 60:.1f} min: "
    + ("ALL PASS" if not failed else f"{len(failed)} FAILED")
  )
  report(table, summary, failed)


def report(table: str, summary: str, failed: list) -> None:
  """Prints the table and summary, writes them to --output, exits 1 on a failed case."""
  print(table + "\n\n" + summary, flush=True)
  if _OUTPUT.value:
    files.write_atomically(_OUTPUT.value, table + "\n\n" + summary + "\n")
  sys.exit(1 if failed else 0)


def check_flags() -> None:
  """Refuses, before anything is drawn, what would end a run late or make its verdict empty."""
  if _NUM_SAMPLES.value < 1 or not 0 < _LEVEL.value < 1:
    raise ValueError(
      f"--num_samples must be >= 1 and --level in (0, 1), got {_NUM_SAMPLES.value} and "
      f"{_LEVEL.value}."
    )


def main(argv):
  cli.start(argv)
  check_flags()
  if _REAL_TARGET.value:
    return real_target_main()
  cases = certify.all_cases(_SCOPE.value)
  if _MODEL.value != "all":
    cases = [case for case in cases if case.model == _MODEL.value]
  if _MESH.value != "all":
    cases = [case for case in cases if case.mesh == _MESH.value]
  if not cases:  # A certificate of nothing would print ALL PASS.
    meshes = sorted({c.mesh for c in certify.all_cases(_SCOPE.value)})
    raise ValueError(
      f"--scope={_SCOPE.value} has no case with --model={_MODEL.value} and --mesh="
      f"{_MESH.value} (its cases' meshes: {', '.join(meshes)}); nothing to certify."
    )
  if _NULL_CHECK.value:
    table = certify.null_check(cases, _NUM_SAMPLES.value, _LEVEL.value, _NULL_CHECK.value)
    return report(table, "", [])
  start = time.perf_counter()
  results = certify.certify(cases, _NUM_SAMPLES.value, _LEVEL.value, _SEED.value)
  minutes = (time.perf_counter() - start) / 60
  table = certify.format_table(results, _LEVEL.value)
  failed = [r for r in results if not r.passed]
  summary = (
    f"{len(results)} cases ({sum(r.case.bug is None for r in results)} real, "
    f"{sum(r.case.bug is not None for r in results)} planted bugs), "
    f"{_NUM_SAMPLES.value:,} sequences each, {minutes:.1f} min: "
    + ("ALL PASS" if not failed else f"{len(failed)} FAILED")
  )
  report(table, summary, failed)


if __name__ == "__main__":
  cli.run(main)
