"""What every script does first: refuse stray arguments, quiet library logs, and (on a
multi-host slice) join the other hosts with ``jax.distributed.initialize``.

Flags defined here, shared by every script in scripts/:
  --distributed=off|auto|manual
      off     one process (the default; a single GPU host or TPU VM, a CPU).
      auto    Cloud TPU / GKE / SLURM: jax finds the coordinator, process count and id
              from the environment. Run the same command on every host.
      manual  --coordinator_address=host:port --num_processes=N --process_id=i, one
              command per host.
After initialisation jax.devices() lists the devices of ALL hosts, so the mesh
built from the config spans the whole slice.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
from absl import app, flags, logging

import specsamp

_DISTRIBUTED = flags.DEFINE_enum(
  "distributed",
  "off",
  ["off", "auto", "manual"],
  "Multi-host initialisation: off, auto (Cloud TPU etc.), manual.",
)
_COORDINATOR = flags.DEFINE_string(
  "coordinator_address", None, "host:port of process 0 (--distributed=manual)."
)
_NUM_PROCESSES = flags.DEFINE_integer(
  "num_processes", None, "Number of processes (--distributed=manual)."
)
_PROCESS_ID = flags.DEFINE_integer(
  "process_id", None, "This process's id in [0, num_processes) (--distributed=manual)."
)


def initialize_distributed(
  mode: str,
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
) -> None:
  """Joins the processes of a multi-host job (a no-op for 'off')."""
  if mode == "off":
    return
  # CPU processes (tests, or a CPU cluster) reduce across hosts with gloo; accelerators ignore it.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if mode == "auto":
    jax.distributed.initialize()
    return
  missing = [
    name
    for name, value in (
      ("coordinator_address", coordinator_address),
      ("num_processes", num_processes),
      ("process_id", process_id),
    )
    if value is None
  ]
  if missing:
    raise app.UsageError(f"--distributed=manual needs --{', --'.join(missing)}.")
  if not 0 <= process_id < num_processes:
    raise app.UsageError(f"--process_id={process_id} must be in [0, {num_processes}).")
  jax.distributed.initialize(
    coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
  )


LIBTPU_QUIET_DEFAULTS = (
  ("TPU_ACCELERATOR_TYPE", "v4-8"),
  ("TPU_WORKER_HOSTNAMES", "localhost"),
  ("TPU_SKIP_MDS_QUERY", "1"),
)
"""What libtpu reads when jax starts its backends, set so that it neither probes for hardware nor
warns on a machine with no TPU (the AOT tool's ``aot.quiet_libtpu`` sets these too)."""


def set_libtpu_defaults() -> None:
  """``LIBTPU_QUIET_DEFAULTS``, each where the user has not set it."""
  for name, value in LIBTPU_QUIET_DEFAULTS:
    os.environ.setdefault(name, value)


def quiet_libtpu_without_tpu() -> None:
  """On a machine with no TPU, the environment libtpu (the 'tpu' extra) reads when jax starts
  its backends, set to harmless defaults where the user has not set it: otherwise it probes
  for hardware and prints a page of warnings. A script's business, not the library's:
  importing specsamp changes no environment variable. Nothing is touched on a TPU VM."""
  if glob.glob("/dev/accel*") or os.path.exists("/dev/vfio"):
    return
  set_libtpu_defaults()


def start(argv: Sequence[str]) -> None:
  """Call first in a script's main(argv) (before any jax computation starts its backends)."""
  quiet_libtpu_without_tpu()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # orbax logs every save at INFO, and warns while it fails to read a corrupt step (which
  # specsamp then reports in one line); --verbosity=0 shows all of it.
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.ERROR)
  initialize_distributed(
    _DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value
  )
  if jax.process_count() > 1:
    print(
      f"process {jax.process_index()} of {jax.process_count()}: "
      f"{jax.local_device_count()} local of {jax.device_count()} devices",
      flush=True,
    )


USER_ERRORS = (
  ValueError,
  TypeError,
  FileNotFoundError,
  FileExistsError,
  NotADirectoryError,
  IsADirectoryError,
  PermissionError,
  FloatingPointError,
)
"""What bad input raises (a bad config value, a missing checkpoint, a path through a file or
into a read-only folder, NaN logits...): a script reports these in one line and exits with
status 2."""


def _exit_with_error(message: str) -> None:
  print(f"error: {' '.join(message.split())}", file=sys.stderr)
  sys.exit(2)


def _override_of(argv: Sequence[str], field: str) -> str:
  """The command-line argument that names ``field`` (e.g. --config.sampling.topp=1)."""
  return next((arg for arg in argv if re.search(rf"\.{re.escape(field)}(=|$)", arg)), field)


def _parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing, with config-file errors (a missing file, a misspelled override, a
  value of the wrong type) reported in one line with exit status 2 rather than a traceback."""
  try:
    args = flags.FLAGS(argv)
  except flags.Error as error:
    # 'flag --x=v: why'; a config file's get_config that raised shows as an embedded
    # traceback, whose last line says what went wrong.
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = lines[0].removeprefix("flag ")
    if "Traceback" in str(error):
      message = f"{message.split(': ')[0]}: {lines[-1]}"
    _exit_with_error(message)
  except (AttributeError, KeyError, OSError) as error:  # From ml_collections' config flags.
    text = str(error).replace("\\n", " ").replace("\\'", "'")
    hint = re.search(r'Did you mean "(\w+)" instead of "(\w+)"', text)
    if hint:
      _exit_with_error(
        f"{_override_of(argv, hint.group(2))}: the config has no field {hint.group(2)!r}; did "
        f"you mean {hint.group(1)!r}? (--help lists every field)"
      )
    missing = re.fullmatch(r"""["']*(\w+)["']*""", text.strip())
    if missing:  # A KeyError without a near miss: ml_collections names only the field.
      _exit_with_error(
        f"{_override_of(argv, missing.group(1))}: the config has no field "
        f"{missing.group(1)!r} (--help lists every field)"
      )
    _exit_with_error(text)
  for name in list(flags.FLAGS):
    value = flags.FLAGS[name].value
    if type(value).__name__ == "_ErrorConfig":  # config_flags keeps a load failure for later.
      cause = str(object.__getattribute__(value, "_error")).strip().splitlines()[-1].strip()
      _exit_with_error(f"--{name}={flags.FLAGS[name].config_filename}: {cause}")
  return args


def run(main: Callable[[Sequence[str]], Any]) -> None:
  """``app.run(main)``, with errors a user can act on reported in one line.

  A ``USER_ERRORS`` exception prints ``error: <message>`` on stderr and exits with status 2
  (``--verbosity=1`` shows the traceback instead). Ctrl-C exits with status 130 and one line
  (training saves a checkpoint before it gets here).
  """

  def guarded(argv):
    try:
      return main(argv)
    except USER_ERRORS as error:
      if flags.FLAGS["verbosity"].present and flags.FLAGS.verbosity >= 1:
        raise
      message = " ".join(str(error).split("\n"))
      print(f"error: {message}  (--verbosity=1 shows the traceback)", file=sys.stderr)
      sys.exit(2)
    except KeyboardInterrupt:
      print("interrupted.", file=sys.stderr)
      sys.exit(130)

  app.run(guarded, flags_parser=_parse_flags)


@dataclasses.dataclass(frozen=True)
class PairFlags:
  """The flags of a script driven by a pair config (``define_pair_flags``)."""

  config: Any
  corpus: flags.FlagHolder
  workdir: flags.FlagHolder
  resume: flags.FlagHolder

  def pair_config(self) -> Any:
    """The pair config, with --corpus and --resume applied."""
    config = self.config.value
    if self.corpus.value is not None:
      config.data.corpus = self.corpus.value
    if self.resume.value is not None:
      config.resume_from = self.resume.value
    return config


def define_config(name: str, default: str, title: str) -> flags.FlagHolder:
  """A config-file flag whose ``--help`` lists every field of the default config, its value
  and its comment (``config_files.describe``)."""
  from ml_collections import config_flags

  from specsamp.experiments import config_files

  path = default.split(":")[0]
  if not os.path.isfile(path):  # Run from elsewhere than the repository root.
    path = os.path.join(os.path.dirname(specsamp.__file__), os.pardir, path)
  help_text = f"{title} Override any field with --{name}.<field>=<value>."
  if os.path.isfile(path):
    help_text += f" The fields of {default}:\n" + config_files.describe(path)
  return config_flags.DEFINE_config_file(name, default, help_text)


def define_pair_flags() -> PairFlags:
  """--config (a pair config, default configs/code_pair.py), --corpus and --workdir: define
  them at a script's import, as absl wants."""
  return PairFlags(
    config=define_config("config", "configs/code_pair.py", "Pair config."),
    corpus=flags.DEFINE_string(
      "corpus",
      None,
      "Comma-separated globs of text files (e.g. '~/src/**/*.py'); sets config.data.corpus. "
      "Default: this Python's standard library source.",
    ),
    workdir=flags.DEFINE_string("workdir", None, "Checkpoint cache; default workdir/<name>."),
    resume=flags.DEFINE_enum(
      "resume",
      None,
      ["latest", "latest_intact"],
      "Sets config.resume_from: latest_intact moves a corrupt newest checkpoint step aside "
      "(to <dir>.corrupt/<step>) and loads or resumes from the previous one.",
    ),
  )


@dataclasses.dataclass(frozen=True)
class PromptFlags:
  """--prompt, --prompts_file and --humaneval (``define_prompt_flags``)."""

  prompt: flags.FlagHolder
  prompts_file: flags.FlagHolder
  humaneval: flags.FlagHolder

  def source(self) -> str | None:
    """The prompt source the flags name ('text:...', 'file:...', 'humaneval'), or None."""
    chosen = [
      source
      for given, source in (
        (self.prompt.value is not None, f"text:{self.prompt.value}"),
        (self.prompts_file.value is not None, f"file:{self.prompts_file.value}"),
        (self.humaneval.value, "humaneval"),
      )
      if given
    ]
    if len(chosen) > 1:
      raise ValueError("--prompt, --prompts_file and --humaneval: give at most one.")
    return chosen[0] if chosen else None


def output_file(holder: flags.FlagHolder) -> flags.FlagHolder:
  """Checks, as the flags are parsed, that a file flag names a file that can be written: its
  directory exists and is writable, and the path is not a directory. A run that would write its
  report, table or rows there fails at once, not after its work (the printed report of a sample
  job, the hours of a certificate). The file is written atomically (``files``)."""

  def writable(path: str | None) -> bool:  # As open() will see it: '~' is not expanded.
    if not path:
      return True
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(path) and not os.path.isdir(path) and os.access(path, os.W_OK):
      return True  # An existing file (or /dev/stdout) that can be written.
    if os.path.isdir(path):
      why = "it is a directory."
    elif not os.path.isdir(folder):
      why = f"no directory {folder!r} to write it in (the shell does not expand '~' inside "
      why += "a flag)."
    elif not os.access(folder, os.W_OK):
      why = f"the directory {folder!r} is not writable."
    else:
      return True
    raise flags.ValidationError(f"cannot write the file {path!r}: {why}")

  flags.register_validator(holder, writable)
  return holder


def define_prompt_flags() -> PromptFlags:
  """The prompt-source flags of the sample and benchmark scripts (``jobs/prompts.py``)."""
  return PromptFlags(
    prompt=flags.DEFINE_string("prompt", None, "Sample this prompt (prompt source text:...)."),
    prompts_file=flags.DEFINE_string(
      "prompts_file",
      None,
      "Sample the prompts of this file: JSONL with 'prompt' fields, or one per line.",
    ),
    humaneval=flags.DEFINE_bool(
      "humaneval", False, "Sample HumanEval's 164 prompts (the paper's code benchmark)."
    ),
  )
