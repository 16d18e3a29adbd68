"""What every process of a multi-host run must decide alike.

Every host runs the same command (docs/cloud_tpu.md), and every jitted program over the global
mesh is one SPMD program that all of them must run, in the same order. A choice made on one
host's clock (a timing, a time budget) can differ between hosts; hosts that chose differently
run different programs, whose collectives never match: two CPU processes sampling one batch
aborted in gloo ("Received data size doesn't match expected size", 2026-11-30) when their step
timings chained different numbers of calls, and a TPU slice's hosts would wait for each other
forever. ``agreed`` makes such a measurement process 0's on every host before anything is
decided from it.

A Ctrl-C is the same kind of choice: it reaches the hosts at different moments, or only some
of them, and a host that stopped alone to save (a collective) while the others stepped hung two
CPU processes (2026-11-30). ``DeferredInterrupt`` stops every host at the same point: the same
step (``RaisedAnywhere``, an all-reduce read one check later) or the same shard
(``any_process``, agreed at once).
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from typing import Any

import jax
import numpy as np


def agreed(values: Any) -> Any:
  """``values`` (a number, or a sequence of numbers) as process 0 measured them, on every
  process of a multi-host run; themselves in a one-process run. Every process must call it, at
  the same point (it is a collective)."""
  if jax.process_count() == 1:
    return values
  from jax.experimental import multihost_utils

  shared = np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(values, np.float64)))
  if np.ndim(values) == 0:
    return type(values)(shared)
  return [type(v)(s) for v, s in zip(values, shared.tolist())]


def out_of_time(started: float, now: float, max_seconds: float | None) -> bool:
  """Whether ``max_seconds`` (None: no limit) have passed since ``started`` by process 0's
  clock: a run that stops on its time stops at the same step on every host. With a budget on
  several processes each check is a small collective that waits for the work queued before it,
  so a training loop with a budget no longer dispatches a step before the last one ends;
  without a budget, or in one process, it costs nothing."""
  return max_seconds is not None and agreed(now - started) >= max_seconds


def to_host(array: jax.Array) -> np.ndarray:
  """``array`` whole on this host: gathered from every process when some of it lives on
  another host (a collective: every process must call it at the same point)."""
  if not array.is_fully_addressable:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
  return np.asarray(jax.device_get(array))


def any_process(flag: bool) -> bool:
  """Whether ``flag`` is set on any process of a multi-host run (itself in one process). Every
  process must call it at the same point; it waits for the work queued before it, so it suits
  a rare check (a shard's start), where ``RaisedAnywhere`` suits one per step."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils

  return bool(np.asarray(multihost_utils.process_allgather(np.asarray([bool(flag)]))).any())


class RaisedAnywhere:
  """A flag any process may raise (a Ctrl-C that reached some hosts), seen by every process at
  the same check.

  ``check(raised)`` returns whether any process had raised the flag by the *previous* check.
  Each check starts an all-reduce of this process's flag over every device and returns the one
  started by the check before: every process gets the same answer at the same check, a step
  later than its own flag, and nothing waits for the step just dispatched (reading the previous
  all-reduce waits only for the step before it). In one process it is the flag itself, at
  once. Every process must call ``check`` at the same points (it is a collective)."""

  def __init__(self):
    self._pending: jax.Array | None = None

  def check(self, raised: bool) -> bool:
    if jax.process_count() == 1:
      return bool(raised)
    spread, reduce = _any_over_devices()
    local = np.full((jax.local_device_count(),), bool(raised))
    flags = jax.make_array_from_process_local_data(spread, local, (jax.device_count(),))
    previous, self._pending = self._pending, reduce(flags)
    return previous is not None and bool(np.asarray(previous.addressable_data(0)))


@functools.cache
def _any_over_devices() -> tuple[jax.sharding.Sharding, Any]:
  """(a sharding of one flag per device, the jitted OR of them replicated on every device): one
  program per process, whichever loop checks."""
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("all",))
  spread = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("all"))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return spread, jax.jit(lambda flags: flags.any(), out_shardings=replicated)


class DeferredInterrupt:
  """The first Ctrl-C (SIGINT) as a flag that a loop reads at its safe points, agreed across the
  processes of a multi-host run; a second Ctrl-C interrupts at once, as usual. Installed by
  the constructor in the main thread (elsewhere SIGINT keeps raising KeyboardInterrupt) and
  taken down by ``restore``. ``notice``, if given, is printed to stderr at the first Ctrl-C
  (when the next safe point may be minutes away)."""

  def __init__(self, notice: str = ""):
    self.requested = False
    self.notice = notice
    self.previous = None
    self.anywhere = RaisedAnywhere()
    if threading.current_thread() is threading.main_thread():
      self.previous = signal.signal(signal.SIGINT, self._handle)

  def _handle(self, signum, frame):
    self.requested = True
    self.restore()  # A second Ctrl-C interrupts at once.
    if self.notice:
      print(self.notice, file=sys.stderr, flush=True)

  def check(self) -> None:
    """Raises KeyboardInterrupt once a Ctrl-C has reached this process or, on several, any of
    them (``RaisedAnywhere``: every host stops at the same check, one check after the first
    host saw it). For a check at every step."""
    if self.anywhere.check(self.requested):
      raise KeyboardInterrupt

  def requested_anywhere(self) -> bool:
    """Whether a Ctrl-C has reached any process, agreed now (``any_process``): for a rare
    check."""
    return any_process(self.requested)

  def restore(self) -> None:
    if self.previous is not None:
      signal.signal(signal.SIGINT, self.previous)
      self.previous = None
