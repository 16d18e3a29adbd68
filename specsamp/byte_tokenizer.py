"""ByteTokenizer: a byte-level FALLBACK tokenizer, used until a sentencepiece model exists.

Ids 0, 1, 2 are pad, BOS and EOS; id 3 + b is byte b. Any text round-trips.
Ids past 258 (a model's vocabulary may be padded to a round size) decode to
nothing, like the special ids.
"""

from __future__ import annotations

from typing import Iterable

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
_OFFSET = 3


class ByteTokenizer:
  """UTF-8 bytes as tokens; vocab_size 259."""

  pad_id = PAD_ID
  bos_id = BOS_ID
  eos_id = EOS_ID
  vocab_size = 256 + _OFFSET

  def encode(self, text: str, add_bos: bool = True, add_eos: bool = False) -> list[int]:
    ids = [byte + _OFFSET for byte in text.encode("utf-8")]
    return ([BOS_ID] if add_bos else []) + ids + ([EOS_ID] if add_eos else [])

  def decode(self, ids: Iterable[int]) -> str:
    data = bytes(int(i) - _OFFSET for i in ids if _OFFSET <= int(i) < self.vocab_size)
    return data.decode("utf-8", errors="replace")
