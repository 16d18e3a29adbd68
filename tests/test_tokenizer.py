"""SentencePiece tokenizer: training, exact round trips, loading, and refusing a mismatched pair."""

import json
import os

import pytest

from specsamp.training import data
from specsamp.training.tokenizer import Tokenizer, check_same

TEXTS = [
  "def f(x):\n    return x + 1\n\n\tif  x:  # tab, double spaces\n",
  "x = 'ünïcode 漢字 🙂'\n",
  "",
  "   leading spaces and trailing   \n\n\n",
  "class A:\n        def __init__(self):\n            pass\n",
]


@pytest.fixture(scope="module")
def chunks():
  files = data.shuffled(data.stdlib_files(), seed=0)[:40]
  return list(data.text_chunks(files, max_chars=150_000))


@pytest.fixture(scope="module")
def trained(chunks, tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tok") / "code.model")
  return Tokenizer.train(chunks, vocab_size=400, path=path)


def test_train_saves_and_loads_the_same_tokenizer(trained):
  loaded = Tokenizer.load(trained.path)
  assert loaded.vocab_size == trained.vocab_size == 400
  assert loaded.fingerprint == trained.fingerprint
  text = "import os\nprint(os.getcwd())\n"
  assert loaded.encode(text) == trained.encode(text)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_exact(trained, text):
  assert trained.decode(trained.encode(text)) == text


def test_code_compresses(trained, chunks):
  text = "".join(chunks[:50])
  # 400 pieces leave ~50 merges over the characters, yet code compresses well past bytes.
  assert len(text.encode()) / len(trained.encode(text)) > 1.4


def test_bos_eos_and_decode_of_special_and_padded_ids(trained):
  ids = trained.encode("pass", add_bos=True, add_eos=True)
  assert ids[0] == trained.bos_id and ids[-1] == trained.eos_id
  assert trained.decode(ids) == "pass"
  body = trained.encode("a = 1")
  # Ids past the tokenizer (a model vocabulary padded to a multiple) and pads are dropped,
  # and decoding stops at EOS.
  assert trained.decode([trained.pad_id] + body + [trained.vocab_size + 3]) == "a = 1"
  assert trained.decode(body + [trained.eos_id] + trained.encode("junk")) == "a = 1"
  assert {trained.pad_id, trained.bos_id, trained.eos_id} == {0, 2, 3}


def test_mismatched_tokenizers_are_refused(trained, chunks):
  other = Tokenizer.train(chunks, vocab_size=450)
  check_same(trained, Tokenizer.load(trained.path))
  with pytest.raises(ValueError, match="different tokenizers.*share one tokenizer"):
    check_same(trained, other)


def test_load_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="No SentencePiece model"):
    Tokenizer.load(str(tmp_path / "missing.model"))
  corrupt = tmp_path / "corrupt.model"
  corrupt.write_bytes(os.urandom(64))
  with pytest.raises(ValueError, match="Not a valid SentencePiece model"):
    Tokenizer.load(str(corrupt))


def test_too_small_vocabulary_is_a_clear_error(chunks):
  with pytest.raises(ValueError, match="vocab_size must be at least 300"):
    Tokenizer.train(chunks, vocab_size=100)


def test_a_workdirs_tokenizer_is_refused_for_another_corpus(tmp_path):
  """A run that failed before its first checkpoint left its tokenizer, and a later run on
  another corpus trained its models with it, with no error (the review of 2026-11-29)."""
  import sys

  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs"))
  import code_pair

  from specsamp.experiments.jobs import pair

  files = data.shuffled(data.stdlib_files(), seed=0)[:160]
  for name, chosen in (("a", files[:80]), ("b", files[80:])):
    os.makedirs(tmp_path / name)
    for i, path in enumerate(chosen):
      (tmp_path / name / f"{i}.py").write_text(
        open(path, encoding="utf-8", errors="replace").read()
      )
  config = code_pair.get_config()
  config.tokenizer.vocab_size, config.tokenizer.max_chars = 600, 200_000
  config.data.corpus = str(tmp_path / "a" / "*.py")
  workdir = str(tmp_path / "work")
  os.makedirs(workdir)
  first = pair.load_tokenizer(config, workdir, pair.corpus_split(config), lambda _: None)
  again = pair.load_tokenizer(config, workdir, pair.corpus_split(config), lambda _: None)
  assert again.fingerprint == first.fingerprint  # The same data: reused.
  # A field the record lacks (a tokenizer setting added later) changes nothing.
  record = os.path.join(workdir, pair.TOKENIZER_SOURCE)
  saved = json.loads(open(record).read())
  del saved["tokenizer.max_chars"]
  open(record, "w").write(json.dumps(saved))
  pair.load_tokenizer(config, workdir, pair.corpus_split(config), lambda _: None)
  config.data.corpus = str(tmp_path / "b" / "*.py")
  with pytest.raises(ValueError, match="trained on other data .*'corpus'"):
    pair.load_tokenizer(config, workdir, pair.corpus_split(config), lambda _: None)


def test_a_target_checkpoint_that_does_not_exist_is_named_as_missing(tmp_path):
  """A mistyped --config.target.checkpoint read "has no tokenizer beside it" (2026-12-01)."""
  import code_pair

  from specsamp.experiments.jobs import pair

  config = code_pair.get_config()
  config.target.checkpoint = str(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError, match="nowhere: no such file or directory"):
    pair.load_tokenizer(config, str(tmp_path), pair.corpus_split(config), lambda _: None)
  (tmp_path / "nowhere").mkdir()  # There, but without a tokenizer: the message that fits.
  with pytest.raises(FileNotFoundError, match="has no tokenizer .* beside it"):
    pair.load_tokenizer(config, str(tmp_path), pair.corpus_split(config), lambda _: None)


def test_a_corpus_a_tokenizer_cannot_learn_from_is_named_in_specsamps_flags():
  """SentencePiece's own messages named an option specsamp does not have (the review of
  2026-11-29)."""
  import random

  with pytest.raises(ValueError, match="holds no text .*--config.data.corpus"):
    Tokenizer.train(["", ""], vocab_size=300)
  rng = random.Random(0)
  noise = "".join(chr(rng.randrange(32, 0x250)) for _ in range(200_000))  # Bytes read as text.
  with pytest.raises(ValueError, match="characters need .*--config.tokenizer.vocab_size"):
    Tokenizer.train([noise[i : i + 100] for i in range(0, len(noise), 100)], vocab_size=300)
  with pytest.raises(ValueError, match="model_type='word': must be one of"):  # No round trip.
    Tokenizer.train(["def f(x):\n"] * 3, vocab_size=300, model_type="word")
  small = "too small for a tokenizer of vocab_size=5000 \\(it supports at most \\d+\\)"
  with pytest.raises(ValueError, match=small):
    Tokenizer.train(["def f(x):\n    return x\n"] * 3, vocab_size=5000)


@pytest.mark.parametrize("add_bos_token", [None, False, True])
def test_a_tokenizer_json_whose_post_processor_writes_bos_adds_it_as_transformers_does(
  tmp_path, add_bos_token
):
  """Llama 3 puts <|begin_of_text|> in tokenizer.json's post-processor and says nothing in
  tokenizer_config.json: prompts were encoded without it (the review of 2026-11-29). An
  explicit add_bos_token still decides, as in transformers."""
  tokenizers = pytest.importorskip("tokenizers")
  from specsamp.training import tokenizer as tokenizer_lib

  vocab = {"<|begin_of_text|>": 0, "<|end_of_text|>": 1}
  vocab.update({c: i + 2 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")})
  backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
  backend.add_special_tokens(
    [tokenizers.AddedToken(t, special=True) for t in ("<|begin_of_text|>", "<|end_of_text|>")]
  )
  backend.post_processor = tokenizers.processors.TemplateProcessing(
    single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
  )
  backend.save(str(tmp_path / "tokenizer.json"))
  config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
  if add_bos_token is not None:
    config["add_bos_token"] = add_bos_token
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  loaded = tokenizer_lib.load(str(tmp_path))
  assert loaded.add_bos == (add_bos_token is not False)
  # Without a post-processor that writes it, no BOS unless the config asks.
  backend.post_processor = None
  backend.save(str(tmp_path / "tokenizer.json"))
  assert tokenizer_lib.load(str(tmp_path)).add_bos == bool(add_bos_token)


@pytest.mark.parametrize(
  "config, expected",
  [
    (None, False),  # A tokenizer specsamp trained: no BOS.
    ({"tokenizer_class": "LlamaTokenizer"}, True),  # transformers' default for the class.
    ({"tokenizer_class": "GemmaTokenizerFast"}, True),
    ({"tokenizer_class": "LlamaTokenizer", "add_bos_token": False}, False),
    ({"tokenizer_class": "T5Tokenizer"}, False),
    ({"add_bos_token": True}, True),
  ],
)
def test_an_hf_sentencepiece_tokenizer_adds_bos_as_transformers_does(
  trained, tmp_path, config, expected
):
  """A Llama 2 or Gemma tokenizer.model went without BOS (the review of 2026-11-29); its
  tokenizer_config.json decides, as in transformers, and an import keeps it."""
  from specsamp.training import tokenizer as tokenizer_lib

  (tmp_path / "tokenizer.model").write_bytes(trained.model_proto)
  if config is not None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  loaded = tokenizer_lib.load(str(tmp_path))
  assert loaded.add_bos == expected
  saved = tmp_path / "saved"
  saved.mkdir()
  loaded.save(str(saved))
  assert tokenizer_lib.load(str(saved)).add_bos == expected
  assert tokenizer_lib.load(str(saved)).fingerprint == trained.fingerprint


def test_an_hf_folders_generation_config_lists_the_ids_that_end_generation(tmp_path):
  """Llama 3's and Gemma's generation_config.json end generation at several ids (end of text,
  end of turn): the tokenizer's stop ids hold them all, decoding stops at any, and saving
  keeps them (as generation_config.json beside the tokenizer). A bad list is one line."""
  from test_regenerate import word_tokenizer

  from specsamp.training import tokenizer as tokenizer_lib
  from specsamp.training.bpe_tokenizer import BpeTokenizer

  folder = tmp_path / "hf"
  assert word_tokenizer().save(str(folder)) == ["tokenizer.json", "tokenizer_config.json"]
  assert BpeTokenizer.load(str(folder)).stop_ids == (2,)  # No generation_config: the EOS.
  (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 2, 9, 1]}))
  loaded = tokenizer_lib.load(str(folder))
  assert loaded.eos_id == 2 and loaded.stop_ids == (2, 9, 1)
  ids = loaded.encode("w3 w4") + [9] + loaded.encode("w5")
  assert loaded.decode(ids) == loaded.decode(loaded.encode("w3 w4"))
  again = tmp_path / "again"
  assert "generation_config.json" in loaded.save(str(again))
  assert tokenizer_lib.load(str(again)).stop_ids == (2, 9, 1)
  # A prompt's turns are read whole when asked (the main job shows its prompts so).
  assert loaded.decode(ids, stop=False) == "w3 w4 w3 w5"  # Id 9 is w3.
  # Ids past the tokenizer's own (a model's added tokens: Phi-3's <|end|> past its
  # tokenizer.model) are kept for the sampler to check against the model; the BOS is never
  # a stop (a generation_config written with a family's default ids).
  (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [70, 5, 2]}))
  assert BpeTokenizer(loaded.backend, eos_id=2, bos_id=5, stop_ids=[70]).stop_ids == (2, 70)
  assert tokenizer_lib.read_stop_ids(str(folder), 2, bos_id=5) == (2, 70)
  # A stop id the model cannot emit is named with its file before anything samples.
  model_vocab = 64
  with pytest.raises(ValueError, match=r"include \[70\], past the model's 64 tokens: .*generation"):
    tokenizer_lib.check_stop_ids(tokenizer_lib.load(str(folder)), model_vocab)
  # Regeneration's identity names several stop ids; training on the answers needs the same
  # tokenization only (the fingerprint).
  from specsamp.training import regenerate

  several = tokenizer_lib.load(str(again))
  assert regenerate.tokenizer_identity(several) == f"{several.fingerprint} stops [2, 9, 1]"
  assert regenerate.tokenizer_identity(word_tokenizer()) == word_tokenizer().fingerprint
  for tokenizer in (several, word_tokenizer()):
    identity = regenerate.tokenizer_identity(tokenizer)
    assert regenerate.tokenization_of(identity) == tokenizer.fingerprint
  (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, -1]}))
  with pytest.raises(ValueError, match=r"eos_token_id must be a token id or a list of them"):
    tokenizer_lib.load(str(folder))
  # A damaged file is named (json named a line and column only; a list failed in .get).
  for text, message in (
    ('{"eos_token_id": [2', "is not valid JSON"),
    ("[3]", "is not a generation"),
  ):
    (folder / "generation_config.json").write_text(text)
    with pytest.raises(ValueError, match=f"generation_config.json {message}"):
      tokenizer_lib.load(str(folder))
  (folder / "generation_config.json").unlink()
  (folder / "tokenizer_config.json").write_text('{"eos_token": ')
  with pytest.raises(ValueError, match="tokenizer_config.json is not valid JSON"):
    tokenizer_lib.load(str(folder))


def test_chat_templates_render_in_transformers_environment(tmp_path):
  """{% break %}, strftime_now and an unescaped tojson are what transformers gives a template;
  specsamp's environment lacked them (a TemplateSyntaxError, a fixed date, HTML-escaped JSON),
  and a template that failed raised from inside Jinja (the review of 2026-11-30)."""
  import datetime

  tokenizers = pytest.importorskip("tokenizers")
  from specsamp.training import tokenizer as tokenizer_lib

  backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={"<s>": 0, "</s>": 1}, merges=[]))
  backend.save(str(tmp_path / "tokenizer.json"))
  messages = [{"role": "user", "content": "h\u00e9llo <b>"}, {"role": "user", "content": "x"}]

  def rendered(template):
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer_lib.load(str(tmp_path)).apply_chat_template(messages)

  loop = (
    "{% for m in messages %}{{ m.content }}{% if loop.first %}{% break %}{% endif %}{% endfor %}"
  )
  assert rendered(loop) == "h\u00e9llo <b>"
  assert rendered("{{ strftime_now('%Y') }}") == str(datetime.date.today().year)
  assert rendered("{{ messages[0].content | tojson }}") == '"h\u00e9llo <b>"'
  with pytest.raises(ValueError, match="chat template fails to render: 'tools' is undefined"):
    rendered("{{ tools[0] }}")
  with pytest.raises(ValueError, match="chat template does not compile"):
    rendered("{% for m in messages %}")
  # Where today's save_pretrained keeps it, chat_template.jinja, and the older list of named
  # templates: neither was read (an export then had none; the review of 2026-11-30).
  config = {"bos_token": "<s>", "eos_token": "</s>", "model_max_length": 131072}
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  (tmp_path / "chat_template.jinja").write_text("{{ messages[1].content }}")
  loaded = tokenizer_lib.load(str(tmp_path))
  assert loaded.apply_chat_template(messages) == "x"
  loaded.save(str(tmp_path / "saved"))  # What an export writes: the template and the context.
  again = tokenizer_lib.load(str(tmp_path / "saved"))
  assert again.apply_chat_template(messages) == "x" and again.model_max_length == 131072
  os.remove(tmp_path / "chat_template.jinja")
  named = [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": named}))
  assert tokenizer_lib.load(str(tmp_path)).apply_chat_template(messages) == "d"
