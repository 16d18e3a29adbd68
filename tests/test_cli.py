"""The scripts' shared start: argument check and multi-host flags."""

import pytest
from absl import app

from specsamp import cli


def test_stray_arguments_are_refused():
  with pytest.raises(app.UsageError, match="Unexpected arguments"):
    cli.start(["script.py", "oops"])


def test_manual_distributed_needs_its_three_flags():
  with pytest.raises(app.UsageError, match="needs --coordinator_address, --process_id"):
    cli.initialize_distributed("manual", num_processes=2)
  with pytest.raises(app.UsageError, match="--process_id=2 must be in \\[0, 2\\)"):
    cli.initialize_distributed("manual", "localhost:1234", 2, 2)
  cli.initialize_distributed("off")  # One process: nothing to do.
