"""scripts/sample.py end to end, with config overrides, as a user runs it."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(*args):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sample.py"), *args],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_sample_script_with_overrides_on_a_mesh():
  result = run_script("--config=configs/tiny.py:llama", "--config.sampling.temperature=0.8",
                      "--config.sampling.top_p=0.95", "--config.sampling.max_new_tokens=5",
                      "--config.mesh.data=2", "--config.mesh.tensor=4",
                      "--config.model.tensor_parallel=shard_map",
                      "--prompt=def main():", "--prompt=import os")
  assert result.returncode == 0, result.stderr
  assert result.stdout.count("prompt: ") == 2
  assert "autoregressive tokens: [" in result.stdout
  assert "ms/token" in result.stdout and "speculative" not in result.stdout


def test_sample_script_speculative_side_by_side():
  result = run_script("--config=configs/tiny.py", "--draft_config=configs/tiny.py:draft",
                      "--config.sampling.temperature=1.0", "--config.sampling.max_new_tokens=6",
                      "--config.speculative.num_draft_tokens=3",
                      "--config.speculative.verifier=block", "--prompt=def main():")
  assert result.returncode == 0, result.stderr
  for needle in ("autoregressive tokens: [", "speculative tokens: [", "speedup:",
                 "acceptance:", "t=1..3:", "tokens/target call:"):
    assert needle in result.stdout, needle


def test_sample_script_reports_bad_overrides():
  result = run_script("--config=configs/tiny.py", "--config.sampling.top_p=1.5",
                      "--config.sampling.max_new_tokens=2")
  assert result.returncode != 0
  assert "top_p must be in (0, 1]" in result.stderr
