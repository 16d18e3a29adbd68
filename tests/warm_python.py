"""Scripts run from a warm interpreter: a test starts scripts/*.py as a user does, minus the
2.3 s every fresh process spends importing JAX, flax, optax, orbax and specsamp.

A server process imports those once, before any JAX backend exists, then forks one child per
request. The child is what ``python scripts/<name>.py args`` would be: its own process, with the
request's working directory, environment, ``sys.argv`` and ``sys.path[0]``, stdin from
/dev/null and stdout / stderr of its own; it runs the script as ``__main__`` and exits the way
a script exits (``SystemExit``, atexit handlers, buffers flushed). XLA reads ``XLA_FLAGS`` (the
simulated device count, the compile flags) when the child first starts a backend, so those can
differ per request. What JAX reads at import (every ``JAX_*`` variable) cannot: a request whose
``JAX_*`` or ``PYTHONPATH`` differ from the server's first restarts the server with them. A
server that cannot start (it failed to import what it preloads) leaves the run to a plain
subprocess.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile

# The modules scripts/*.py import (and what they import): loaded once, by the server.
PRELOAD = (
  "jax",
  "flax.nnx",
  "optax",
  "orbax.checkpoint",
  "ml_collections.config_flags",
  "absl.app",
  "sentencepiece",
  "specsamp.experiments.cli",
  "specsamp.experiments.jobs.sample_job",
  "specsamp.experiments.jobs.answer_training",
  "specsamp.experiments.benchmarks.benchmark",
  "specsamp.training.train",
  "specsamp.training.regenerate",
)

_SERVER = r"""
import gc, importlib, json, os, runpy, sys, traceback
for name in json.loads(sys.argv[1]):
  importlib.import_module(name)
gc.freeze()  # The preloaded modules are never garbage: no collection in a child walks them.
channel = os.fdopen(int(sys.argv[2]), "w")
print(json.dumps({"ready": True}), file=channel, flush=True)
while True:
  line = sys.stdin.readline()
  if not line:
    break
  request = json.loads(line)
  sys.stdout.flush(); sys.stderr.flush()
  pid = os.fork()
  if pid == 0:
    channel.close()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
      os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = request["argv"]
    sys.path[0] = os.path.dirname(os.path.abspath(request["argv"][0]))
    code = 0
    try:
      runpy.run_path(request["argv"][0], run_name="__main__")
    except SystemExit as exit_:
      code = exit_.code
    except BaseException:
      traceback.print_exc()
      code = 1
    raise SystemExit(code)  # Out of the loop: the child ends here, as a script would.
  print(json.dumps({"pid": pid}), file=channel, flush=True)
  _, status = os.waitpid(pid, 0)
  print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=channel, flush=True)
"""


def _import_time_environment(env: dict[str, str]) -> dict[str, str]:
  return {k: v for k, v in env.items() if k.startswith("JAX_") or k == "PYTHONPATH"}


class WarmPython:
  """Runs ``python <script> args`` through a preloaded, forking server (``run``)."""

  def __init__(self) -> None:
    self._server: subprocess.Popen | None = None
    self._channel = None
    self._env: dict[str, str] = {}

  def _start(self, env: dict[str, str]) -> None:
    read, write = os.pipe()
    self._server = subprocess.Popen(
      [sys.executable, "-c", _SERVER, json.dumps(PRELOAD), str(write)],
      stdin=subprocess.PIPE,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      env=env,
      pass_fds=(write,),
      text=True,
    )
    os.close(write)
    self._channel = os.fdopen(read)
    self._env = _import_time_environment(env)

  def _message(self, timeout: float | None) -> dict:
    ready, _, _ = select.select([self._channel], [], [], timeout)
    if not ready:
      raise TimeoutError
    line = self._channel.readline()
    if not line:
      raise EOFError("the warm interpreter exited")
    return json.loads(line)

  def run(
    self, argv: list[str], env: dict[str, str], cwd: str, timeout: float
  ) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True,
    text=True, timeout=timeout)``, from the warm interpreter where it can."""
    if self._server is not None and self._env != _import_time_environment(env):
      self.close()
    if self._server is None:
      self._start(env)
      try:
        self._message(120)
      except (EOFError, TimeoutError):  # It could not import what it preloads: no server.
        self.close()
        return subprocess.run(
          [sys.executable, *argv],
          env=env,
          cwd=cwd,
          capture_output=True,
          text=True,
          timeout=timeout,
        )
    with tempfile.TemporaryDirectory() as folder:
      paths = {name: os.path.join(folder, name) for name in ("stdout", "stderr")}
      request = {"argv": argv, "env": env, "cwd": cwd, **paths}
      self._server.stdin.write(json.dumps(request) + "\n")
      self._server.stdin.flush()
      pid = self._message(60)["pid"]
      try:
        returncode = self._message(timeout)["returncode"]
      except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        self._message(60)
        raise subprocess.TimeoutExpired(argv, timeout) from None
      output = {name: open(path, encoding="utf-8").read() for name, path in paths.items()}
    return subprocess.CompletedProcess([sys.executable, *argv], returncode, **output)

  def close(self) -> None:
    if self._server is not None:
      self._server.stdin.close()
      try:
        self._server.wait(30)
      except subprocess.TimeoutExpired:
        self._server.kill()
      self._channel.close()
      self._server = None
