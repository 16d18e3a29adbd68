"""The scripts' shared start: argument check and multi-host flags."""

import pytest
from absl import app

from specsamp.experiments import cli


def test_stray_arguments_are_refused():
  with pytest.raises(app.UsageError, match="Unexpected arguments"):
    cli.start(["script.py", "oops"])


def test_manual_distributed_needs_its_three_flags():
  with pytest.raises(app.UsageError, match="needs --coordinator_address, --process_id"):
    cli.initialize_distributed("manual", num_processes=2)
  with pytest.raises(app.UsageError, match="--process_id=2 must be in \\[0, 2\\)"):
    cli.initialize_distributed("manual", "localhost:1234", 2, 2)
  cli.initialize_distributed("off")  # One process: nothing to do.


_WORKER = r"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, numpy as np
from specsamp.experiments import cli
from specsamp import sharding
cli.initialize_distributed("manual", sys.argv[1], 2, int(sys.argv[2]))
mesh = sharding.make_mesh({"data": -1})
batch = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)  # Every host builds the same batch ...
spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
rows = []
global_batch = jax.make_array_from_callback(  # ... and hands over only its devices' rows.
    batch.shape, spec, lambda index: rows.append(index) or batch[index])
total = jax.jit(lambda x: x.sum(), out_shardings=jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec()))(global_batch)
# Each process's own "timing"; agreed, every process has process 0's.
from specsamp import multihost
one = multihost.agreed(0.25 + jax.process_index())
several = multihost.agreed([3 + jax.process_index(), 0.5 * (1 + jax.process_index())])
# Process 1's clock says 11 s have passed, process 0's 1 s: neither stops at a 5 s budget.
late = multihost.out_of_time(0.0, 1.0 + 10 * jax.process_index(), 5.0)
# A Ctrl-C that reached process 1 alone, before its second check: both see it at the third.
interrupt = multihost.RaisedAnywhere()
seen = [interrupt.check(jax.process_index() == 1 and i == 1) for i in range(4)]
# Agreed at once (a shard's start): set on process 1 only, or on none.
anywhere = [multihost.any_process(jax.process_index() == 1), multihost.any_process(False)]
print(jax.process_index(), jax.device_count(), len(rows), int(total.addressable_data(0)), one,
      *several, late, "".join("x" if s else "." for s in seen + anywhere))
"""


@pytest.mark.slow
def test_two_processes_join_one_mesh(tmp_path):
  """--distributed=manual for real: two CPU processes of 2 devices form one 4-device mesh, each
  places only its own rows of a global batch, and a jitted reduction sees all of it; a timing
  ``multihost.agreed`` shares is process 0's on both (a number and a list); a flag one process
  raises (``multihost.RaisedAnywhere``, a Ctrl-C) is seen by both at the same check, and at once
  by ``multihost.any_process``."""
  import socket
  import subprocess
  import sys

  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  script = tmp_path / "worker.py"
  script.write_text(_WORKER)
  env = {k: v for k, v in __import__("os").environ.items() if k != "XLA_FLAGS"}
  workers = [
    subprocess.Popen(
      [sys.executable, str(script), f"localhost:{port}", str(i)],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env=env,
    )
    for i in range(2)
  ]
  results = [worker.communicate(timeout=120) for worker in workers]
  for worker, (_, err) in zip(workers, results):
    assert worker.returncode == 0, err[-2000:]
  lines = sorted(out.strip().splitlines()[-1] for out, _ in results)
  # 4 devices, 2 local shards each, sum of 0..23; process 0's 0.25, 3, 0.5 and clock on both;
  # process 1's interrupt seen by both at the check after it.
  assert lines == ["0 4 2 276 0.25 3 0.5 False ..x.x.", "1 4 2 276 0.25 3 0.5 False ..x.x."]


def test_a_time_budget_in_one_process_is_its_own_clock():
  from specsamp import multihost

  assert multihost.agreed(0.5) == 0.5 and multihost.agreed([1, 2.5]) == [1, 2.5]
  assert not multihost.out_of_time(10.0, 14.9, 5.0) and multihost.out_of_time(10.0, 15.0, 5.0)
  assert not multihost.out_of_time(0.0, 1e9, None)  # No budget.
  interrupt = multihost.RaisedAnywhere()  # One process: its own flag, at once.
  assert [interrupt.check(raised) for raised in (False, True, False)] == [False, True, False]
  assert multihost.any_process(True) and not multihost.any_process(False)


def test_an_output_flag_must_name_a_file_that_can_be_written(tmp_path):
  """Checked as the flags are parsed (a directory as --output sampled for a minute, then failed
  with a traceback and no report, 2026-11-30)."""
  import os

  from absl import flags

  values = flags.FlagValues()
  holder = cli.output_file(flags.DEFINE_string("output", None, "", flag_values=values))
  readonly = tmp_path / "readonly"
  readonly.mkdir()
  os.chmod(readonly, 0o500)
  for path, message in (
    (tmp_path, "it is a directory"),
    (tmp_path / "missing" / "a.json", "no directory"),
    (readonly / "a.json", "is not writable"),
  ):
    if "writable" in message and os.access(readonly, os.W_OK):
      continue  # Root writes anywhere: nothing to check.
    with pytest.raises(flags.IllegalFlagValueError, match=message):
      values(["prog", f"--output={path}"])
  values(["prog", f"--output={tmp_path / 'a.json'}"])
  assert holder.value == str(tmp_path / "a.json")
  values(["prog", "--output=/dev/stdout"])  # Written through (files.write_atomically).
