"""specsamp/files.py: every file written for later is whole or absent, whatever stops the write."""

import json
import os

import numpy as np
import pytest

from specsamp import files


def test_bytes_text_and_a_writer_land_whole_and_leave_no_partial_file(tmp_path):
  target = tmp_path / "a" / "b.bin"  # The folder is made.
  files.write_atomically(str(target), b"\x00\x01")
  assert target.read_bytes() == b"\x00\x01"
  files.write_atomically(str(target), "é")
  assert target.read_text(encoding="utf-8") == "é"

  def save(path):
    with open(path, "wb") as f:
      np.savez_compressed(f, x=np.arange(3))

  shard = tmp_path / "shard.npz"
  files.write_atomically(str(shard), save)
  assert np.load(shard)["x"].tolist() == [0, 1, 2]
  files.write_json(str(tmp_path / "m.json"), {"k": [1, 2]})
  assert json.loads((tmp_path / "m.json").read_text()) == {"k": [1, 2]}
  assert sorted(os.listdir(tmp_path)) == ["a", "m.json", "shard.npz"]


@pytest.mark.parametrize("stop", [OSError("disk full"), KeyboardInterrupt()])
def test_a_write_stopped_midway_keeps_the_old_file_and_removes_its_partial(tmp_path, stop):
  target = tmp_path / "manifest.json"
  files.write_json(str(target), {"shards": 1})

  def half_then_stop(path):
    with open(path, "w") as f:
      f.write('{"shards": ')
    raise stop

  with pytest.raises(type(stop)):
    files.write_atomically(str(target), half_then_stop)
  assert json.loads(target.read_text()) == {"shards": 1}
  assert os.listdir(tmp_path) == ["manifest.json"]


def test_each_process_writes_through_a_partial_file_of_its_own(tmp_path):
  """Hosts writing the same replicated file into one shared folder never share a partial."""
  path = str(tmp_path / "shard.npz")
  import socket

  assert files.partial_path(path) == f"{path}.partial-{socket.gethostname()}-{os.getpid()}"


def test_a_link_or_a_special_file_is_written_through_not_replaced(tmp_path):
  """--output=/dev/stdout, or a link a user made to where reports go, keeps being that."""
  real = tmp_path / "real.json"
  real.write_text("old")
  link = tmp_path / "link.json"
  link.symlink_to(real)
  files.write_json(str(link), {"a": 1})
  assert link.is_symlink() and json.loads(real.read_text()) == {"a": 1}
  files.write_atomically("/dev/null", "discarded")  # Not replaced by a regular file.
  assert not os.path.isfile("/dev/null")
