"""Regenerated training data: the prompt set (standard library instructions, chat lines, a
user's JSONL) and the target's answers as resumable token shards (specsamp/training/)."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from conftest import flip_a_byte, largest_file, tiny_config

from specsamp.experiments.jobs import prompts as prompts_lib
from specsamp.models import transformer
from specsamp.sampling import autoregressive
from specsamp.training import answers, instructions, regenerate
from specsamp.training.bpe_tokenizer import BpeTokenizer

TEMPLATE = (
  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def word_tokenizer(template: str = TEMPLATE, **kwargs) -> BpeTokenizer:
  """A word-level tokenizer of 64 ids with ChatML's specials and template."""
  import tokenizers

  words = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "\n"]
  words += [f"w{i}" for i in range(64 - len(words))]
  backend = tokenizers.Tokenizer(
    tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
  )
  split = tokenizers.pre_tokenizers
  backend.pre_tokenizer = split.Sequence(
    [split.Split("\n", "isolated"), split.Split(" ", "removed")]
  )
  backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
  return BpeTokenizer(backend, eos_id=2, pad_id=0, chat_template=template, **kwargs)


def prompts(count: int) -> list[instructions.Prompt]:
  return [
    instructions.Prompt(f"test:{i}", ({"role": "user", "content": "w7 " * (1 + i % 9)},))
    for i in range(count)
  ]


@pytest.fixture(scope="module")
def target():
  return transformer.create(tiny_config(vocab_size=64), seed=3)


def test_stdlib_instructions_explain_document_and_complete_real_functions():
  path = os.path.join(os.path.dirname(os.__file__), "textwrap.py")
  made = instructions.stdlib_prompts([path])
  by_kind = {kind: [p for p in made if p.id.endswith(":" + kind)] for kind in instructions.KINDS}
  assert len(by_kind["explain"]) == len(by_kind["document"]) == len(by_kind["complete"]) >= 3
  indent = [p for p in made if ":indent:" in p.id]
  explain, document, complete = (p.messages[0]["content"] for p in indent)
  assert explain.startswith("Explain what this Python function does.") and '"""' in explain
  assert (
    "def indent(text, prefix, predicate=None):" in document and '"""' not in document
  )  # Its docstring cut.
  assert complete.rstrip("`\n").endswith('"""') and "return" not in complete.split('"""')[-1]
  for prompt in made:  # Every code block is valid Python (methods are dedented).
    code = prompt.messages[0]["content"].split("```python\n")[1].rsplit("\n```", 1)[0]
    compile(code if not prompt.id.endswith(":complete") else code + "\n    pass", "<p>", "exec")
  both = instructions.default_prompts([path])
  assert both[: len(made)] == made and {p.id.split(":")[0] for p in both} == {"stdlib", "chat"}
  assert "What is the difference between a list and a tuple in Python?" in [
    p.messages[0]["content"] for p in both
  ]


def test_function_sources_are_cut_as_the_standard_librarys_get_source_segment():
  """``instructions._source_segment`` on lines split once per file gives what
  ``ast.get_source_segment`` gives (which splits the file again per node): multi-byte
  characters before and inside a function (offsets are UTF-8 bytes), CR LF and lone CR line
  ends, a form feed (not a line end to the parser), one-line and nested functions, a file
  without a final newline."""
  import ast

  text = (
    "x = 'é'; y = 1\r\n"
    "def f(a='ü'):\r\n    'Döc.'\r\n    return a\r\n"
    "\x0cclass C:\r"
    "    def m(self): 'one line'; return 'ß'\r"
    '    async def n(self):\n        """Doc."""\n        def inner():\n'
    "            'Inner.'\n            return '€'\n        return inner"
  )
  tree = ast.parse(text)
  lines = instructions._source_lines(text)
  assert lines == ast._splitlines_no_ff(text) and "".join(lines) == text
  functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
  assert sorted(n.name for n in functions) == ["f", "inner", "m", "n"]
  for node in functions:
    assert instructions._source_segment(lines, node) == ast.get_source_segment(text, node)


def test_the_chat_template_compiles_once_and_again_when_it_changes():
  tokenizer = word_tokenizer()
  messages = [{"role": "user", "content": "w7 w8"}]
  first = tokenizer.apply_chat_template(messages)
  assert first == "<|im_start|>user\nw7 w8<|im_end|>\n<|im_start|>assistant\n"
  compiled = tokenizer._compiled_template()
  assert tokenizer.apply_chat_template(messages) == first
  assert tokenizer._compiled_template() is compiled  # Not compiled again per prompt.
  tokenizer.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
  assert tokenizer.apply_chat_template(messages) == "[w7 w8]"  # The new template, not the old.


def test_the_held_out_split_is_stable_and_about_one_in_fifty():
  ids = [f"stdlib:x.py:f{i}:1:explain" for i in range(5000)]
  held = [i for i in ids if instructions.held_out(i)]
  assert 0.01 < len(held) / len(ids) < 0.03
  assert held == [i for i in ids if instructions.held_out(i)]


def test_a_users_jsonl_prompts_and_their_errors(tmp_path):
  path = tmp_path / "p.jsonl"
  path.write_text(
    json.dumps({"prompt": "hi"})
    + "\n\n"
    + json.dumps(
      {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}
    )
    + "\n"
  )
  made = instructions.jsonl_prompts(str(path))
  assert len(made) == 2 and made[1].messages[0]["role"] == "system"
  # Ids are the content's: a line added above and a repeated line move nothing (the split
  # follows the ids), and the repeat is answered once.
  path.write_text(
    json.dumps({"prompt": "new"}) + "\n" + path.read_text() + json.dumps({"prompt": "hi"}) + "\n"
  )
  again = instructions.jsonl_prompts(str(path))
  assert [p.id for p in again[1:]] == [p.id for p in made] and len(again) == 3
  for text, message in (
    ("{", "2: not JSON"),
    (json.dumps({"text": "x"}), "expected"),
    (json.dumps({"messages": [{"role": "assistant", "content": "a"}]}), "last message"),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "text"}]}]}), "strings"),
    (json.dumps({"messages": [{"role": "user", "content": None}]}), "strings"),
  ):
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + text + "\n")
    with pytest.raises(ValueError, match=message):
      instructions.jsonl_prompts(str(path))
  path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')  # Latin-1, not UTF-8
  with pytest.raises(ValueError, match=r"p.jsonl:2: not UTF-8"):
    instructions.jsonl_prompts(str(path))
  with pytest.raises(FileNotFoundError, match="no file"):
    instructions.jsonl_prompts(str(tmp_path / "missing.jsonl"))


def test_shards_hold_the_targets_answers_and_a_stopped_run_resumes(target, tmp_path):
  tokenizer = word_tokenizer()
  plan = regenerate.Plan(
    settings=("greedy", "nucleus"),
    batch_size=4,
    max_prompt_tokens=32,
    max_new_tokens=6,
    shard_prompts=5,
    split="train",
  )
  made = prompts(14)
  train = [p for p in made if not instructions.held_out(p.id)]
  out = str(tmp_path / "shards")
  first = regenerate.regenerate(target, tokenizer, made, out, plan, target_id="t", max_shards=1)
  assert [s["file"] for s in first["shards"]] == ["shard_00000.npz"]
  full = regenerate.regenerate(target, tokenizer, made, out, plan, target_id="t")
  assert [s["setting"] for s in full["shards"]] == ["greedy", "nucleus", "greedy"][
    : -(-len(train) // 5)
  ]
  assert full["shards"][0] == first["shards"][0]  # Resumed: the first shard was not redone.
  # Greedy answers are the target's greedy continuation of the chat-templated prompt.
  with np.load(os.path.join(out, "shard_00000.npz")) as shard:
    tokens, offsets, lengths = shard["tokens"], shard["offsets"], shard["prompt_lengths"]
    ids, finished = list(shard["ids"]), shard["finished"]
  every = []
  for shard in full["shards"]:
    with np.load(os.path.join(out, shard["file"])) as f:
      every += list(f["ids"])
  assert sorted(every) == sorted(p.id for p in train) and len(offsets) == len(ids) + 1 == 6
  prompt_of = {p.id: p for p in train}
  rows = [tokenizer.encode(tokenizer.apply_chat_template(list(prompt_of[i].messages))) for i in ids]
  padded = np.zeros((len(rows), 32), np.int32)
  for row, prompt in enumerate(rows):
    padded[row, : len(prompt)] = prompt
  reference = autoregressive.generate(
    target,
    padded,
    np.asarray([len(r) for r in rows]),
    jax.random.key(0),
    max_new_tokens=6,
    temperature=0.0,
    eos_id=2,
  )
  for row, prompt in enumerate(rows):
    sequence = tokens[offsets[row] : offsets[row + 1]]
    np.testing.assert_array_equal(sequence[: lengths[row]], prompt)
    answer = np.asarray(reference.generated(row))
    np.testing.assert_array_equal(sequence[lengths[row] :], answer)
    assert finished[row] == (answer[-1] == 2)
  # Each shard counts its answers' repeated 4-grams (checked by brute force below).
  for shard in full["shards"]:
    with np.load(os.path.join(out, shard["file"])) as f:
      pieces = np.split(f["tokens"], f["offsets"][1:-1])
      answers_ = [piece[n:] for piece, n in zip(pieces, f["prompt_lengths"])]
    counts = [regenerate.repeated_ngrams(a) for a in answers_]
    assert shard["repeated_ngrams"] == sum(c[0] for c in counts)
    assert shard["ngrams"] == sum(max(len(a) - 3, 0) for a in answers_)
  # Another plan in the same directory is refused; nothing there changes.
  before = open(os.path.join(out, regenerate.MANIFEST)).read()
  with pytest.raises(ValueError, match="another run's shards"):
    regenerate.regenerate(
      target, tokenizer, made, out, regenerate.Plan(max_new_tokens=7), target_id="t"
    )
  # So is another target of the same shape and name (a "trained:LxD" retrained apart: its
  # shards filled the same directory until 2026-11-30).
  retrained = transformer.create(tiny_config(vocab_size=64), seed=4)
  with pytest.raises(ValueError, match="another run's shards .*target_weights"):
    regenerate.regenerate(retrained, tokenizer, made, out, plan, target_id="t")
  assert open(os.path.join(out, regenerate.MANIFEST)).read() == before
  # A manifest from before target_weights was recorded resumes (the field is then not compared).
  old = json.loads(before)
  del old["target_weights"]
  assert regenerate.differing(old, dict(json.loads(before), target_weights="another")) == []


def test_answers_ship_compressed_and_a_fresh_workdir_starts_from_them(target, tmp_path):
  """Shards are compressed with 16-bit ids (read back as int32); ``merge`` copies the shards a
  folder lacks (how answers ship in the repository), and a run seeded from such a folder answers
  only what it lacks, while another run's shards are neither used nor overwritten."""
  tokenizer = word_tokenizer()
  plan = regenerate.Plan(
    batch_size=4, max_prompt_tokens=32, max_new_tokens=5, shard_prompts=4, split="train"
  )
  made = prompts(14)
  here, shipped = str(tmp_path / "here"), str(tmp_path / "shipped")
  one = regenerate.regenerate(target, tokenizer, made, here, plan, target_id="t", max_shards=1)
  with np.load(os.path.join(here, "shard_00000.npz")) as f:
    assert f["tokens"].dtype == np.uint16
  (tokens, _, _), *_ = regenerate.read_shards(here)
  assert tokens.dtype == np.int32
  lines = []
  assert regenerate.merge(here, shipped, lines.append) == 1
  assert regenerate.merge(here, shipped, lines.append) == 0 and "0 shards" in lines[-1]
  # A fresh workdir seeded from the shipped folder answers only the shards it lacks.
  fresh = str(tmp_path / "fresh")
  seeded = regenerate.regenerate(
    target, tokenizer, made, fresh, plan, target_id="t", max_shards=0, seed_dir=shipped
  )
  assert seeded["shards"] == one["shards"]
  full = regenerate.regenerate(
    target, tokenizer, made, fresh, plan, target_id="t", seed_dir=shipped
  )
  assert full["shards"][0] == one["shards"][0] and len(full["shards"]) > 1
  for a, b in zip(regenerate.read_shards(here), regenerate.read_shards(fresh)):
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
  assert regenerate.merge(fresh, shipped, lines.append) == len(full["shards"]) - 1
  assert regenerate.read_manifest(shipped)["shards"] == full["shards"]
  # Another run's shards seed nothing, and a folder of another run takes none.
  other = dataclasses.replace(plan, max_new_tokens=6)
  elsewhere = str(tmp_path / "elsewhere")
  kept = regenerate.regenerate(
    target,
    tokenizer,
    made,
    elsewhere,
    other,
    target_id="t",
    max_shards=1,
    seed_dir=shipped,
    log=lines.append,
  )
  assert len(kept["shards"]) == 1 and "another run" in " ".join(lines)
  before = open(os.path.join(shipped, regenerate.MANIFEST)).read()
  with pytest.raises(ValueError, match="another run's shards"):
    regenerate.merge(elsewhere, shipped)
  assert open(os.path.join(shipped, regenerate.MANIFEST)).read() == before
  # A run that would merge into it (--ship_to) is refused before it decodes anything.
  with pytest.raises(ValueError, match=r"holds another run's shards than this run .*plan differ"):
    regenerate.regenerate(
      target, tokenizer, made, str(tmp_path / "third"), other, target_id="t",
      merge_into=shipped,
    )  # fmt: skip
  assert not os.path.exists(tmp_path / "third")
  lines.clear()
  assert regenerate.seed(shipped, elsewhere, lines.append) == 0 and "another run" in lines[0]
  assert len(regenerate.read_manifest(elsewhere)["shards"]) == 1


def test_a_run_resumes_with_another_batch_size_and_stops_on_its_time(target, tmp_path):
  """A larger machine may answer more prompts at once: the batch size is not part of what a
  resumed run must share. max_seconds starts no new shard once spent (0: none at all)."""
  tokenizer = word_tokenizer()
  plan = regenerate.Plan(
    batch_size=2, max_prompt_tokens=32, max_new_tokens=4, shard_prompts=4, split="train"
  )
  made, out = prompts(14), str(tmp_path / "shards")
  first = regenerate.regenerate(target, tokenizer, made, out, plan, target_id="t", max_shards=1)
  none = regenerate.regenerate(
    target,
    tokenizer,
    made,
    out,
    dataclasses.replace(plan, batch_size=4),
    target_id="t",
    max_seconds=0,
  )
  assert none["shards"] == first["shards"]  # Out of time before its first shard.
  wider = dataclasses.replace(plan, batch_size=4)
  full = regenerate.regenerate(target, tokenizer, made, out, wider, target_id="t")
  assert full["shards"][0] == first["shards"][0] and len(full["shards"]) > 1
  assert [s["batch_size"] for s in full["shards"]] == [2] + [4] * (len(full["shards"]) - 1)
  assert full["plan"]["batch_size"] == 2  # The manifest keeps the plan that began it.
  # One width for every batch and no compaction (a GPU's setting) answer greedy prompts the same.
  one_width = str(tmp_path / "one_width")
  regenerate.regenerate(
    target, tokenizer, made, one_width, wider, target_id="t", width_step=32, compact=False
  )
  greedy = [s["file"] for s in full["shards"][1:] if s["setting"] == "greedy"]
  assert greedy
  for name in greedy:
    with np.load(os.path.join(out, name)) as a, np.load(os.path.join(one_width, name)) as b:
      np.testing.assert_array_equal(a["tokens"], b["tokens"])
  with pytest.raises(ValueError, match="another run's shards"):  # Other answers are refused.
    regenerate.regenerate(
      target, tokenizer, made, out, dataclasses.replace(plan, max_new_tokens=5), target_id="t"
    )


def test_a_ctrl_c_begins_no_new_shard_and_a_resumed_run_answers_the_rest(target, tmp_path):
  """The first Ctrl-C: the shards begun are answered and written, none begins after it, the
  run raises KeyboardInterrupt (the scripts exit with 130) and SIGINT's handler is the one
  before the run again (Python's, or SIG_IGN where the suite was started in the background);
  a resumed run answers the rest as an uninterrupted run does."""
  import signal

  tokenizer = word_tokenizer()
  plan = regenerate.Plan(
    settings=("greedy",), batch_size=2, max_prompt_tokens=32, max_new_tokens=4, shard_prompts=2
  )
  made = prompts(14)
  out, logs = str(tmp_path / "shards"), []

  def log(line: str) -> None:
    logs.append(line)
    if line.startswith("regenerate: shard_00000.npz ("):  # The first shard written: Ctrl-C.
      assert signal.getsignal(signal.SIGINT) is not before  # The run's own handler is in.
      os.kill(os.getpid(), signal.SIGINT)

  before = signal.getsignal(signal.SIGINT)
  with pytest.raises(KeyboardInterrupt):
    regenerate.regenerate(target, tokenizer, made, out, plan, target_id="t", log=log)
  assert signal.getsignal(signal.SIGINT) is before
  stopped = [line for line in logs if "interrupted; stopping before" in line]
  assert len(stopped) == 1 and "resume to go on" in logs[-1], logs
  written = regenerate.read_manifest(out)["shards"]
  full = regenerate.regenerate(target, tokenizer, made, out, plan, target_id="t", log=print)
  assert 1 <= len(written) < len(full["shards"]) and full["shards"][: len(written)] == written
  alone = str(tmp_path / "uninterrupted")
  regenerate.regenerate(target, tokenizer, made, alone, plan, target_id="t", log=print)
  for shard in full["shards"]:
    with np.load(os.path.join(out, shard["file"])) as a:
      with np.load(os.path.join(alone, shard["file"])) as b:
        np.testing.assert_array_equal(a["tokens"], b["tokens"])


def test_a_second_pass_answers_every_prompt_with_the_other_setting(target, tmp_path):
  """passes=2 extends a finished one-pass run: its shards stay, and the new ones answer the
  same blocks of prompts, each with the setting its block did not have, so every prompt is
  answered once greedily and once sampled. A manifest older than the field resumes."""
  tokenizer = word_tokenizer()
  plan = regenerate.Plan(batch_size=4, max_prompt_tokens=32, max_new_tokens=4, shard_prompts=4)
  made, out = prompts(14), str(tmp_path / "shards")
  one = regenerate.regenerate(target, tokenizer, made, out, plan, target_id="t")
  blocks = len(one["shards"])
  assert blocks > 1 and [s["setting"] for s in one["shards"]] == [
    ("greedy", "nucleus")[i % 2] for i in range(blocks)
  ]
  manifest_path = os.path.join(out, regenerate.MANIFEST)
  with open(manifest_path) as f:
    older = json.load(f)
  del older["plan"]["passes"]  # As a run before the field wrote it.
  with open(manifest_path, "w") as f:
    json.dump(older, f)
  two = regenerate.regenerate(
    target, tokenizer, made, out, dataclasses.replace(plan, passes=2), target_id="t"
  )
  assert two["shards"][:blocks] == one["shards"] and len(two["shards"]) == 2 * blocks
  assert two["plan"]["passes"] == 2
  answered = {}
  for shard in two["shards"]:
    with np.load(os.path.join(out, shard["file"])) as f:
      for prompt_id in f["ids"]:
        answered.setdefault(str(prompt_id), []).append(shard["setting"])
  assert len(answered) == one["prompts"]
  assert all(sorted(settings) == ["greedy", "nucleus"] for settings in answered.values())
  again = regenerate.regenerate(target, tokenizer, made, out, plan, target_id="t")
  assert again["shards"] == two["shards"]  # Fewer passes: nothing to do, nothing changed.
  with pytest.raises(ValueError, match=r"greedily\s+twice"):
    regenerate.Plan(passes=3)
  with pytest.raises(ValueError, match="greedily"):
    regenerate.Plan(settings=("greedy",), passes=2)
  assert regenerate.Plan(settings=("nucleus",), passes=3).passes == 3  # New draws each pass.


def _repeated_by_brute_force(answer, n):
  grams = [answer[i - n : i] for i in range(n, len(answer) + 1)]
  return sum(any(np.array_equal(g, h) for h in grams[:j]) for j, g in enumerate(grams))


def test_repeated_ngrams_count_a_loop_and_not_fresh_text():
  loop = np.array([7, 8, 9] * 10)
  assert regenerate.repeated_ngrams(loop) == (24, 27)  # 3 distinct 4-grams of 27.
  assert regenerate.repeated_ngrams(np.arange(10)) == (0, 7)
  assert regenerate.repeated_ngrams(np.arange(3)) == (0, 0)
  rng = np.random.default_rng(0)
  for _ in range(20):
    answer = rng.integers(0, 3, rng.integers(0, 40))
    repeated, counted = regenerate.repeated_ngrams(answer)
    assert repeated == _repeated_by_brute_force(answer, 4)
    assert counted == max(len(answer) - 3, 0)
  shards = [{"repeated_ngrams": 24, "ngrams": 27}, {"repeated_ngrams": 0, "ngrams": 7}]
  assert regenerate.repetition(shards) == pytest.approx(24 / 34)
  assert regenerate.repetition([{"file": "an older manifest's shard"}]) is None
  assert "these repeat 71% of their 4-grams" in regenerate.repetition_warning(shards, "these")
  loops = [{"repeated_ngrams": 9, "ngrams": 10}]
  assert "these answers repeat 90% of their 4-grams" in regenerate.repetition_warning(
    loops, "these answers"
  )
  assert regenerate.repetition_warning([{"repeated_ngrams": 5, "ngrams": 10}], "x") is None
  assert regenerate.repetition_warning([{"file": "older"}], "x") is None


def test_a_looping_target_is_warned_about(target, tmp_path, monkeypatch):
  """A target whose answers loop (here: every answer token the same) warns, once per shard."""

  def looping(target, rows, plan, setting, eos_id, pad_id, key, width_step, compact, admit, hear):
    for i, row in enumerate(rows):
      assert admit(i)
      hear(i, np.concatenate([row, np.full(12, 5, np.int32)]), False)
    return len(rows)

  monkeypatch.setattr(regenerate, "_answer_group", looping)
  plan = regenerate.Plan(settings=("greedy",), batch_size=4, max_prompt_tokens=32, shard_prompts=5)
  logs = []
  manifest = regenerate.regenerate(
    target, word_tokenizer(), prompts(8), str(tmp_path), plan, target_id="t", log=logs.append
  )
  warnings = [line for line in logs if "warning" in line]
  assert len(warnings) == len(manifest["shards"]) >= 1
  assert "repeat 89% of their 4-grams" in warnings[0]  # 8 of the 9 4-grams of 12 equal tokens.
  assert regenerate.repetition(manifest["shards"]) == pytest.approx(8 / 9)


def test_too_long_prompts_are_skipped_and_counted_and_bad_plans_refused(target, tmp_path):
  tokenizer = word_tokenizer()
  made = prompts(20)
  plan = regenerate.Plan(
    settings=("greedy",), batch_size=2, max_prompt_tokens=12, max_new_tokens=2, shard_prompts=50
  )
  manifest = regenerate.regenerate(target, tokenizer, made, str(tmp_path), plan, target_id="t")
  assert manifest["skipped"] > 0 and manifest["prompts"] + manifest["skipped"] == len(
    [p for p in made if not instructions.held_out(p.id)]
  )
  with pytest.raises(ValueError, match="settings"):
    regenerate.Plan(settings=("hot",))
  with pytest.raises(ValueError, match="repeat"):  # It would answer greedily twice.
    regenerate.Plan(settings=("greedy", "greedy"), passes=2)
  with pytest.raises(ValueError, match="split"):
    regenerate.Plan(split="test")
  # max_shards=-2 answered all shards but two (Python's slice), and said nothing (2026-11-30).
  for limits, message in ((dict(max_shards=-2), "max_shards"), (dict(max_seconds=-1), "seconds")):
    with pytest.raises(ValueError, match=f"{message} must be None or"):
      regenerate.regenerate(target, tokenizer, made, str(tmp_path), plan, target_id="t", **limits)


def test_answer_batches_weigh_only_answer_tokens():
  shards = [
    (np.arange(10, dtype=np.int32), np.array([0, 4, 10]), np.array([2, 3])),
    (np.arange(10, 16, dtype=np.int32), np.array([0, 6]), np.array([1])),
  ]
  tokens, answer = answers.stream(shards)
  np.testing.assert_array_equal(tokens, np.arange(16))
  np.testing.assert_array_equal(answer, [0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1])
  packed = answers.batches(shards, seq_len=3, batch_size=2)
  rows, weights = packed.at(0)
  assert rows.shape == weights.shape == (2, 4)
  for row, weight in zip(rows, weights):  # Each token keeps its own weight.
    np.testing.assert_array_equal(weight, answer[row])


@pytest.mark.parametrize("min_ngram", [1, 2])
def test_lookups_offline_runs_are_what_the_drafter_copies(min_ngram):
  """answers.lookup_accepted against PromptLookupDrafter itself, proposing after every prefix
  of packed rows (three tokens, so n-grams repeat; sequences back to back in a row, a lookup
  never reaching into the one before), and the feature+lookup combination's shift."""
  import jax.numpy as jnp

  from specsamp.sampling.drafters import PromptLookupDrafter
  from specsamp.sampling.warping import SamplingConfig

  rng = np.random.default_rng(min_ngram)
  K, L = 3, 24
  tokens = rng.integers(0, 3, (3, L))
  weights = np.ones((3, L), np.float32)
  weights[:, [0, 1, 9, 10, 11]] = 0  # Prompts: a second sequence begins at 9.
  weights[2, 15:] = 0  # A third at 15 in the last row.
  accepted, matched = answers.lookup_accepted(tokens, weights, K, 3, min_ngram)
  begins = {(b, t) for b in range(3) for t in (9, 15) if weights[b, t - 1] and not weights[b, t]}
  contexts, truths, anchors = [], [], []
  for b in range(3):
    start = 0
    for t in range(L - 1):
      if (b, t) in begins:
        start = t
      contexts.append(np.pad(tokens[b, start : t + 1], (0, L - (t + 1 - start))))
      truths.append(np.pad(tokens[b, t + 1 : t + 1 + K], (0, K), constant_values=-1)[:K])
      anchors.append((b, t, t + 1 - start))
  lengths = jnp.asarray([n for _, _, n in anchors], jnp.int32)
  proposal, _ = PromptLookupDrafter(max_ngram=3, min_ngram=min_ngram).propose(
    (),
    jnp.asarray(np.stack(contexts)),
    lengths,
    None,
    K,
    jnp.full(len(anchors), K),
    SamplingConfig(0.0),
    3,
  )
  counted = 0
  for i, (b, t, _) in enumerate(anchors):
    count = int(proposal.num_proposed[i])
    assert matched[b, t] == (count > 0)
    same = np.asarray(proposal.tokens[i, :count]) == truths[i][:count]
    run = count if same.all() else int(np.argmin(same))
    if accepted[b, t] >= 0:
      assert accepted[b, t] == run, (b, t)
      counted += 1
  assert counted > 20 and matched.any() and (accepted > 0).any()
  head = np.arange(L)[None].repeat(3, 0)  # A head's accepted_unrolled: its p drafts after p+1.
  both = answers.lookup_first(accepted, matched, answers.chain_layout(head))
  window = accepted >= 0
  expected = np.where(matched, accepted, np.arange(-1, L - 2)[None])
  np.testing.assert_array_equal(both[window], expected[window])
  assert (both[~window] == -1).all()
  # Side by side in one tree: the longer run where lookup matched, the head's elsewhere.
  beside = answers.lookup_beside(accepted, matched, answers.chain_layout(head))
  head_run = np.arange(-1, L - 2)[None]
  expected = np.where(matched, np.maximum(accepted, head_run), head_run)
  np.testing.assert_array_equal(beside[window], expected[window])
  assert (beside[~window] == -1).all() and (beside >= both).all()
  assert (beside[window & matched] > both[window & matched]).any()  # Where the head ran longer.


def test_the_loops_tau_walks_each_sequence_from_its_prompt_and_skips_a_cut_one():
  """``answers.loop_tau``: a row's first sequence, whose prompt lies before the row, is left
  out; the next starts after its last prompt token and moves on by 1 + accepted."""
  weights = np.array([[1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1]], np.float32)
  accepted = np.array([[2, 2, 2, -1, 1, 0, 3, 0, 0, 0, -1]])  # t drafts after x_<=t.
  tau, acc, histogram = answers.loop_tau([accepted], [weights], 3)
  assert histogram.tolist() == [0, 1, 0, 1] and tau == 3.0  # t = 4 (1), t = 6 (3), t = 10.
  np.testing.assert_allclose(acc, [1.0, 0.5, 1.0])
  assert answers.tau(accepted, 3)[0] == pytest.approx(1 + 10 / 9)  # The position mean.
  with pytest.raises(ValueError, match="No held-out sequence starts"):
    answers.loop_tau([accepted[:, :3]], [weights[:, :4]], 3)


def test_tau_from_one_teacher_forced_pass_is_what_a_greedy_chain_accepts(target):
  """On the target's greedy text, the run of correct teacher-forced predictions from t is the
  number of tokens a K-token greedy chain drafted after x_<=t accepts: checked against the
  draft generating K tokens itself after every prefix."""
  from specsamp.testing import exactness

  draft = exactness.noisy_copy(target, 0.5, seed=4)
  K, prompt = 3, np.asarray([[5, 9, 3, 7]], np.int32)
  text = autoregressive.generate(
    target, prompt, np.asarray([4]), jax.random.key(0), max_new_tokens=14, temperature=0.0
  )
  sequence = np.asarray(text.tokens[0, :18])
  logits, _ = draft(jax.numpy.asarray(sequence[None, :-1]))
  correct = np.asarray(logits[0].argmax(-1) == sequence[1:])[None]
  valid = (np.arange(1, 18) >= 4)[None]  # Answer tokens: the generated ones.
  accepted = answers.accepted_run(correct, valid, K)
  checked = 0
  for t in range(17):
    if accepted[0, t] < 0:
      continue
    prefix = np.zeros((1, 18), np.int32)  # One padded width: one compiled program.
    prefix[0, : t + 1] = sequence[: t + 1]
    drafted = autoregressive.generate(
      draft, prefix, np.asarray([t + 1]), jax.random.key(0), max_new_tokens=K, temperature=0.0
    ).generated(0)
    leading = 0
    while leading < K and drafted[leading] == sequence[t + 1 + leading]:
      leading += 1
    assert accepted[0, t] == leading, t
    checked += 1
  assert checked == 17 - K - 2  # Positions 3..14: the K next tokens are all generated.
  tau, acc = answers.tau(accepted, K)
  counts = accepted[accepted >= 0]
  assert tau == 1 + counts.mean() and acc.shape == (K,)
  np.testing.assert_allclose(1 + sum(np.prod(acc[: k + 1]) for k in range(K)), tau)
  # The loop's own figure: walked from the prompt's end over the same counts, it is what the
  # greedy speculative loop does on this text (its iterations that drafted all K tokens).
  weights = (np.arange(18) >= 4).astype(np.float32)[None]
  loop, loop_acc, histogram = answers.loop_tau([accepted], [weights], K)
  from specsamp.sampling.speculative import speculative_generate

  out = speculative_generate(
    target, draft, prompt, np.asarray([4]), jax.random.key(0), max_new_tokens=14,
    num_draft_tokens=K, temperature=0.0,
  )  # fmt: skip
  assert np.asarray(out.tokens[0, :18]).tolist() == sequence.tolist()
  np.testing.assert_array_equal(histogram, np.asarray(out.uncapped_histogram)[0])
  assert loop == 1 + (histogram * np.arange(K + 1)).sum() / histogram.sum()
  assert loop_acc.shape == (K,)


def test_a_shipped_draft_loads_in_bfloat16_and_a_corrupted_copy_is_refused(tmp_path):
  import dataclasses
  import shutil

  from specsamp.experiments.jobs import answer_training
  from specsamp.training import checkpoint, shipped, train

  model = transformer.create(tiny_config(), seed=0)
  best = str(tmp_path / "best")
  store = checkpoint.Checkpoints(best)
  meta = {"model": dataclasses.asdict(model.config), "tokenizer": "abc"}
  store.save(7, {"params": train.params_of(model)}, meta)
  store.wait()
  folder = str(tmp_path / "shipped")
  meta = answer_training.ship(best, folder, "# A card\n")
  assert meta["model"]["param_dtype"] == "bfloat16" and meta["tokenizer"] == "abc"
  shipped.verify(folder)
  assert shipped.resolve(folder) == os.path.join(folder, "checkpoint")
  assert shipped.resolve(best) == best  # Not a shipped folder: loaded as it is.
  loaded, _ = checkpoint.load_model(shipped.resolve(folder))
  expected = jax.tree.map(lambda x: np.asarray(x).astype("bfloat16"), train.params_of(model))
  for got, want in zip(jax.tree.leaves(train.params_of(loaded)), jax.tree.leaves(expected)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), want)
  with pytest.raises(FileExistsError, match="not empty"):
    answer_training.ship(best, folder, "")
  # A flipped byte in any file, a file gone or one added: refused by name.
  largest = largest_file(folder)
  for damage, message in (("flip", "sha256"), ("remove", "missing"), ("add", "not in")):
    copy = str(tmp_path / damage)
    shutil.copytree(folder, copy)
    target = os.path.join(copy, os.path.relpath(largest, folder))
    if damage == "flip":
      flip_a_byte(target)
    elif damage == "remove":
      os.remove(target)
    else:
      open(os.path.join(copy, "extra.txt"), "w").write("x")
    with pytest.raises(ValueError, match=message):
      shipped.resolve(copy)
  # The checkpoint inside named directly is verified too; a folder that lost its sums, or sums
  # that are not text, are refused (it loaded unverified, or failed to load, before).
  with pytest.raises(ValueError, match="sha256"):
    shipped.resolve(os.path.join(str(tmp_path / "flip"), "checkpoint"))
  assert shipped.resolve(os.path.join(folder, "checkpoint")) == os.path.join(folder, "checkpoint")
  lost = str(tmp_path / "lost")
  shutil.copytree(folder, lost)
  os.remove(os.path.join(lost, shipped.SHA256SUMS))
  with pytest.raises(FileNotFoundError, match="without its SHA256SUMS"):
    shipped.resolve(lost)
  open(os.path.join(lost, shipped.SHA256SUMS), "wb").write(b"\xff\xfe\x00binary")
  with pytest.raises(ValueError, match="not a text file"):
    shipped.resolve(lost)


def test_a_card_reports_what_the_best_evaluation_was_trained_and_measured_on(tmp_path):
  """The card's data, held-out sample and hardware are best.json's (recorded at the best
  evaluation), not the workdir's answers when the card is written: a --ship_only after more
  answers arrived, or on another machine, still tells what the head was trained on."""
  from specsamp.experiments import config_files
  from specsamp.experiments.jobs import answer_training

  path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs/smollm2_pair.py")
  config = config_files.load_module(path).get_config()
  best = {
    "step": 120,
    "tau": 1.8,
    "acc": [0.5, 0.4, 0.3, 0.2],
    "tokens_seen": 245_760,
    "seconds": 60.0,
    "seconds_total": 90.0,
    "curve": [{"step": 120, "tokens_seen": 245_760, "tau": 1.8}],
    "data": {
      "target": "smollm2:30x576",
      "tokenizer": "2225e8fb",
      "prompts_sha256": "ab" * 32,
      "shards": 3,
      "prompts": 384,
      "answer_tokens": 51_234,
      "settings": ["greedy", "nucleus"],
      "regeneration_seconds": 7200.0,
    },
    "held_out": {
      "answers": 127,
      "left_out": 1,
      "rows": 48,
      "row_tokens": 257,
      "answer_tokens": 9_876,
    },
    "hardware": "1 x NVIDIA H200 (gpu), 16 CPU cores",
  }
  # No answers in this workdir: everything comes from best.json.
  card = answer_training.card(config, str(tmp_path), best, "feature")
  assert "384 answers by the target" in card and "3 shards" in card
  assert "51,234 answer tokens" in card
  assert "2.00 h of" in card and "`smollm2:30x576`" in card
  assert "48 rows of 257 tokens (9,876 answer tokens) spread over 127 held-out" in card
  assert "1 more left out" in card and "NVIDIA H200" in card and "**1.800**" in card
  assert "lacked them" not in card and "Started from" not in card
  # A run that went on from a trained head (answers.init_from) says so.
  start = {"path": "/x/smollm2_head", "parameters": "0123", "sha256sums": "ef" * 32, "step": None}
  card = answer_training.card(config, str(tmp_path), dict(best, init_from=start), "feature")
  assert "**Started from** the trained head in `/x/smollm2_head` (parameters 0123;" in card
  assert "`efefefefefefefef...`" in card and "step 0 below is that head" in card
  start = dict(start, sha256sums="", step=300)  # A run's checkpoint: its step, no hashes.
  card = answer_training.card(config, str(tmp_path), dict(best, init_from=start), "feature")
  assert "(step 300 of its run; parameters 0123;" in card and "SHA256SUMS hashes" not in card
  assert "grown" not in card
  start = dict(start, widened_from_ffn_dim=1536)  # Grown to a wider MLP: said.
  card = answer_training.card(config, str(tmp_path), dict(best, init_from=start), "feature")
  assert "its MLP grown from 1536 hidden units" in card and "step 0 below is that head" in card
  # A best.json from before these were recorded: the workdir's manifests, and the card says so.
  for split, prompts in (("train", 128), ("held_out", 128)):
    folder = tmp_path / config.answers[f"{split}_dir"]
    folder.mkdir(parents=True)
    shard = dict(file="shard_00000.npz", prompts=prompts, answer_tokens=1000, setting="greedy")
    shard["seconds"] = 36.0
    manifest = dict(target="t:1x2", tokenizer="ff", prompts_sha256="cd" * 32, shards=[shard])
    (folder / regenerate.MANIFEST).write_text(json.dumps(manifest))
  old = {k: v for k, v in best.items() if k not in ("data", "held_out", "hardware")}
  card = answer_training.card(config, str(tmp_path), old, "feature")
  assert "1 shards" in card and "1,000 answer tokens" in card and "`t:1x2`" in card
  assert "rows of the 128 held-out greedy answers" in card
  assert "Written from a best.json that lacked them" in card and "the hardware is" in card


def test_an_unrolled_drafters_accepted_runs_are_the_chain_drafts_shifted_by_one():
  """A feature head's step k at row p drafts after x_<=p+1+k: flags laid out that way give the
  counts of a draft model's run from t = p + 1, and the same answer-token windows, but for a
  row whose chain reaches into the next sequence (here one-token prompts: a single weight 0
  begins a sequence), which reads another sequence's feature at p."""
  rng = np.random.default_rng(0)
  B, L, K = 3, 20, 4
  correct_BT = rng.random((B, L)) < 0.7
  weights_BT = (rng.random((B, L)) < 0.9).astype(np.float32)
  chain = answers.accepted_run(correct_BT[:, : L - 1], weights_BT[:, 1:] > 0, K)
  steps = np.zeros((K, B, L), bool)
  for k in range(K):
    for p in range(L):
      if p + 1 + k < L - 1:
        steps[k, :, p] = correct_BT[:, p + 1 + k]
  unrolled = answers.accepted_unrolled(steps, weights_BT, K)
  sequence = np.pad(np.asarray(answers.segments(weights_BT)), ((0, 0), (0, K)), constant_values=-1)
  crosses = sequence[:, : L - 2] != sequence[:, 1 + K : 1 + K + L - 2]
  assert crosses.any() and (chain[:, 1 : L - 1][crosses] >= 0).any()  # Such rows occur here.
  np.testing.assert_array_equal(unrolled[:, : L - 2], np.where(crosses, -1, chain[:, 1 : L - 1]))
  assert (unrolled[:, L - 2 :] == -1).all() and (unrolled >= 0).any()
  with pytest.raises(ValueError, match="cannot measure"):
    answers.accepted_unrolled(steps[:2], weights_BT, K)


def test_a_parallel_drafts_accepted_runs_read_segment_k_at_its_anchor_plus_k():
  """A parallel draft's k-th token after x_<=t comes from query (k - 1, t + k - 1): counted by
  hand from the definition, and equal to a chain draft's runs when every segment is right
  exactly where the chain draft is."""
  rng = np.random.default_rng(1)
  B, T, K = 3, 16, 4
  correct_KBT = rng.random((K, B, T)) < 0.75
  valid_BT = rng.random((B, T)) < 0.9
  counted = answers.accepted_parallel(correct_KBT, valid_BT, K)
  for b in range(B):
    for t in range(T):
      if t + K > T or not valid_BT[b, t : t + K].all():
        assert counted[b, t] == -1
        continue
      run = 0
      while run < K and t + run < T and correct_KBT[run, b, t + run]:
        run += 1
      assert counted[b, t] == run, (b, t)
  chain_BT = correct_KBT[0]
  same = np.broadcast_to(chain_BT, (K, B, T))
  np.testing.assert_array_equal(
    answers.accepted_parallel(same, valid_BT, K), answers.accepted_run(chain_BT, valid_BT, K)
  )
  with pytest.raises(ValueError, match="cannot measure"):
    answers.accepted_parallel(correct_KBT[:2], valid_BT, K)


def test_the_shipped_answers_are_whole():
  """specsamp/shipped/smollm2_answers (configs/smollm2_pair.py's answers.shipped_dir): each
  split's manifest names exactly the shards there, each reads back with the tokens and answer
  tokens the manifest records, and both splits come from one target and tokenizer."""
  folder = os.path.join(os.path.dirname(regenerate.__file__), "..", "shipped", "smollm2_answers")
  manifests = {}
  for split in ("train", "held_out"):
    directory = os.path.join(folder, split)
    manifest = regenerate.read_manifest(directory)
    assert manifest is not None and manifest["shards"], directory
    assert manifest["plan"]["split"] == split
    names = {shard["file"] for shard in manifest["shards"]}
    assert names == {n for n in os.listdir(directory) if n.endswith(".npz")}
    for shard, (tokens, offsets, prompt_lengths) in zip(
      manifest["shards"], regenerate.read_shards(directory)
    ):
      assert tokens.dtype == np.int32 and len(tokens) == offsets[-1] == shard["tokens"]
      assert offsets[-1] - prompt_lengths.sum() == shard["answer_tokens"]
      assert len(prompt_lengths) == shard["prompts"]
    manifests[split] = manifest
  assert manifests["train"]["target"] == manifests["held_out"]["target"]
  assert manifests["train"]["tokenizer"] == manifests["held_out"]["tokenizer"]
  assert {s["setting"] for s in manifests["held_out"]["shards"]} == {"greedy"}


def test_a_template_that_writes_bos_gets_no_second_one():
  """Llama's, Gemma's and Mistral's templates begin with bos_token and their tokenizers ask for
  BOS: transformers adds none to a template's text, and neither do the prompts here."""
  tokenizer = word_tokenizer("{{ bos_token }}" + TEMPLATE, bos_id=5, add_bos=True)
  prompt = instructions.Prompt("x", ({"role": "user", "content": "w7 w8"},))
  _, rows, _ = regenerate.encode([prompt], tokenizer, 64)
  assert rows[0][0] == 5 and rows[0][1] != 5
  chat = prompts_lib.encode(["w7 w8"], tokenizer, chat=True)
  np.testing.assert_array_equal(chat.tokens[0], rows[0])
  plain = prompts_lib.encode(["w7 w8"], tokenizer)  # No template: BOS as the tokenizer asks.
  assert plain.tokens[0, 0] == 5 and plain.tokens[0, 1] != 5
  refusing = word_tokenizer("{{ raise_exception('System role not supported') }}")
  with pytest.raises(ValueError, match="Prompt x: .*System role"):
    regenerate.encode([prompt], refusing, 64)


def test_held_out_answers_whose_prompt_is_trained_on_are_left_out_of_tau():
  def shard(*sequences):  # (prompt, answer) pairs
    tokens = np.concatenate([np.r_[p, a] for p, a in sequences]).astype(np.int32)
    offsets = np.cumsum([0] + [len(p) + len(a) for p, a in sequences])
    return tokens, offsets, np.asarray([len(p) for p, _ in sequences], np.int32)

  training = [shard(([1, 2], [3]), ([4, 5, 6], [7, 8]))]
  held = [shard(([1, 2], [9, 9]), ([1, 2, 3], [5])), shard(([4, 5, 6], [7]))]
  kept, removed = answers.without_trained_prompts(held, training)
  assert removed == 2 and len(kept) == 1
  np.testing.assert_array_equal(kept[0][0], [1, 2, 3, 5])
  np.testing.assert_array_equal(kept[0][1], [0, 4])
  np.testing.assert_array_equal(kept[0][2], [3])


def test_damaged_lost_or_unreadable_answers_are_named_or_answered_again(target, tmp_path):
  tokenizer, made = word_tokenizer(), prompts(12)
  plan = regenerate.Plan(
    settings=("greedy",), batch_size=4, max_prompt_tokens=16, max_new_tokens=3, shard_prompts=4
  )
  run = str(tmp_path / "run")
  first = regenerate.regenerate(target, tokenizer, made, run, plan, target_id="t")
  names = [shard["file"] for shard in first["shards"]]
  whole = open(os.path.join(run, names[0]), "rb").read()
  # A deleted shard the manifest names is answered again, the same answers.
  before = regenerate.load_shard(run, names[1])
  os.remove(os.path.join(run, names[1]))
  again = regenerate.regenerate(target, tokenizer, made, run, plan, target_id="t")
  assert [shard["file"] for shard in again["shards"]] == names
  np.testing.assert_array_equal(regenerate.load_shard(run, names[1])["tokens"], before["tokens"])
  # A truncated shard: reading it names it; a merge from a whole copy replaces it.
  copy = str(tmp_path / "copy")
  regenerate.merge(run, copy, log=lambda line: None)
  with open(os.path.join(run, names[0]), "wb") as f:
    f.write(whole[: len(whole) // 2])
  with pytest.raises(ValueError, match=f"{names[0]} is damaged"):
    regenerate.read_shards(run)
  logged = []
  regenerate.merge(copy, run, log=logged.append)
  assert "1 missing or damaged" in logged[0] and len(regenerate.read_shards(run)) == len(names)
  # A manifest that is not JSON (a merge conflict's markers) is named.
  with open(os.path.join(run, regenerate.MANIFEST), "w") as f:
    f.write("<<<<<<< HEAD\n")
  with pytest.raises(ValueError, match="manifest.json is not a regeneration manifest"):
    regenerate.read_shards(run)
  # So is an edited entry without its file (a KeyError until 2026-11-30).
  regenerate.merge(copy, str(tmp_path / "edited"), log=lambda line: None)
  edited = json.load(open(tmp_path / "edited" / regenerate.MANIFEST))
  del edited["shards"][1]["file"]
  (tmp_path / "edited" / regenerate.MANIFEST).write_text(json.dumps(edited))
  with pytest.raises(ValueError, match="manifest.json: shard entry 1 .* names no file"):
    regenerate.read_shards(str(tmp_path / "edited"))


def test_the_shipped_prompt_set_is_the_one_the_shipped_answers_answered():
  """The default set is read from the shipped snapshot on every interpreter (a set built from
  Python 3.12's library has other functions at other lines): the shipped answers' ids are its
  ids, split as it splits them."""
  snapshot = instructions.default_prompts()
  ids = {prompt.id for prompt in snapshot}
  assert len(snapshot) == len(ids) == 17_171
  shipped = os.path.join(os.path.dirname(instructions.SNAPSHOT), "smollm2_answers")
  for split, held in (("train", False), ("held_out", True)):
    manifest = regenerate.read_manifest(os.path.join(shipped, split))
    answered = {
      str(i)
      for shard in manifest["shards"]
      for i in regenerate.load_shard(os.path.join(shipped, split), shard["file"])["ids"]
    }
    assert answered <= ids and all(instructions.held_out(i) == held for i in answered)


@pytest.mark.extended
def test_the_shipped_prompt_set_is_what_python_3_11_builds():
  import sys

  if sys.version_info[:2] != (3, 11):
    pytest.skip("The snapshot is Python 3.11's library; this interpreter's differs.")
  assert instructions.built_prompts() == instructions.read_snapshot()


def test_training_refuses_answers_made_by_another_targets_weights(target, tmp_path):
  """A drafter learns the target whose answers it reads: answers recorded with one target's
  weights are refused for another of the same shape and name."""
  from specsamp.experiments.jobs import answer_training

  tokenizer, made, dirs = word_tokenizer(), prompts(100), {}
  for split in ("train", "held_out"):
    dirs[split] = str(tmp_path / split)
    plan = regenerate.Plan(
      settings=("greedy",), batch_size=2, max_prompt_tokens=32, max_new_tokens=3,
      shard_prompts=2, split=split, max_prompts=2,
    )  # fmt: skip
    regenerate.regenerate(target, tokenizer, made, dirs[split], plan, target_id="t", log=print)
  manifests = answer_training.check_answers(dirs["train"], dirs["held_out"], tokenizer, target)
  assert manifests["train"]["target_weights"] == manifests["held_out"]["target_weights"]
  retrained = transformer.create(tiny_config(vocab_size=64), seed=4)
  with pytest.raises(ValueError, match="train answers in .* were made by another target's"):
    answer_training.check_answers(dirs["train"], dirs["held_out"], tokenizer, retrained)
