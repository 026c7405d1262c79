"""The fast copy of a tokenizer (loading/tokenizer_cache.py): loaded without transformers'
slow path, and the same tokenizer as that path builds, token for token."""

import json
import shutil

import pytest

from specgen.loading import cache, cache_listing, tokenizer_cache
from specgen.loading.sources import ModelFiles
from specgen.loading.tokenizer_cache import load_tokenizer

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXTS = ["write quicksort in python", "e\u0301 = \u00e9, \ufb01", "in the tin\n\n  x",
         "\u4f60\u597d \U0001f600", "<|im_start|>user<|im_end|><|endoftext|>"]


@pytest.fixture(autouse=True)
def temp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))


def tiny_qwen_tokenizer(folder):
    """A tiny Qwen2 tokenizer saved as a converted GGUF's is: Qwen2Tokenizer rebuilds its
    backend on load with an NFC normalizer that the saved tokenizer.json lacks, so the file
    read as it is would be another tokenizer."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("i", "n"), ("\u0120", "t"), ("\u0120t", "in")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                         extra_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    data["normalizer"] = None
    path.write_text(json.dumps(data))
    return folder


def same(a, b):
    assert (a.eos_token, a.pad_token, a.bos_token, a.unk_token) == (b.eos_token, b.pad_token, b.bos_token,
                                                                    b.unk_token)
    assert (a.eos_token_id, a.pad_token_id, len(a)) == (b.eos_token_id, b.pad_token_id, len(b))
    assert a.all_special_tokens == b.all_special_tokens and a.get_vocab() == b.get_vocab()
    assert {i: str(t) for i, t in a.added_tokens_decoder.items()} == {
        i: str(t) for i, t in b.added_tokens_decoder.items()}
    for text in TEXTS:
        ids = a.encode(text)
        assert b.encode(text) == ids
        assert b.decode(ids) == a.decode(ids)
        assert b.decode(ids, skip_special_tokens=True) == a.decode(ids, skip_special_tokens=True)
    messages = [{"role": "user", "content": t} for t in TEXTS]
    for tokenize in (False, True):
        want = a.apply_chat_template(messages, add_generation_prompt=True, tokenize=tokenize)
        assert b.apply_chat_template(messages, add_generation_prompt=True, tokenize=tokenize) == want


def test_the_second_load_is_the_fast_copy_of_the_same_tokenizer(monkeypatch):
    from transformers import AutoTokenizer, Qwen2Tokenizer, TokenizersBackend

    folder = tiny_qwen_tokenizer(cache.cache_dir() / "converted" / "tiny-float32")
    source = ModelFiles("tiny", folder)
    slow = load_tokenizer(source)  # as transformers loads it; the copy is kept
    assert type(slow) is Qwen2Tokenizer
    assert TokenizersBackend.from_pretrained(folder).encode(TEXTS[1]) != slow.encode(TEXTS[1])

    def no_slow_load(*args, **kwargs):
        raise AssertionError("the second load went the slow way")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", no_slow_load)
    fast = load_tokenizer(source)
    assert type(fast) is TokenizersBackend and fast.name_or_path == str(folder)
    same(slow, fast)
    kinds = {e.kind for e in cache_listing.entries()}
    assert "tokenizer" in kinds

    (folder / "chat_template.jinja").write_text(TEMPLATE.replace("assistant", "bot"))
    assert tokenizer_cache.load(folder) is None  # other files: another entry, not made yet


def test_a_class_that_adds_behaviour_keeps_the_slow_load():
    from transformers import AutoTokenizer, Qwen2Tokenizer

    class Shouting(Qwen2Tokenizer):
        def decode(self, *args, **kwargs):
            return super().decode(*args, **kwargs).upper()

    folder = tiny_qwen_tokenizer(cache.cache_dir() / "converted" / "tiny-float32")
    tok = Shouting.from_pretrained(folder)
    assert not tokenizer_cache.store(folder, tok)
    assert tokenizer_cache.load(folder) is None
    refused = [e for e in cache_listing.entries() if e.kind == "tokenizer"]
    assert len(refused) == 1 and "refused" in refused[0].what
    assert type(load_tokenizer(ModelFiles("tiny", folder))) is type(AutoTokenizer.from_pretrained(folder))


def test_a_local_folder_gets_no_copy(tmp_path):
    folder = tiny_qwen_tokenizer(tmp_path / "mine")
    load_tokenizer(ModelFiles("mine", folder))
    assert not (cache.cache_dir() / tokenizer_cache.FOLDER).exists()


def test_a_copy_goes_with_the_model_it_was_made_from():
    folder = tiny_qwen_tokenizer(cache.cache_dir() / "converted" / "tiny-float32")
    cache.finish(folder, kind="converted", sha256="ab" * 32, dtype="float32", source="x.gguf", model="x")
    load_tokenizer(ModelFiles("tiny", folder))
    copy = next(e for e in cache_listing.entries() if e.kind == "tokenizer")
    assert not copy.used_by  # no profile uses its model
    assert {e.path for e in cache_listing.prune()} == {folder, copy.path}


def test_a_damaged_copy_is_made_again():
    folder = tiny_qwen_tokenizer(cache.cache_dir() / "converted" / "tiny-float32")
    slow = load_tokenizer(ModelFiles("tiny", folder))
    copy = tokenizer_cache.entry_dir(tokenizer_cache.key(folder))
    (copy / "tokenizer.json").write_text("{}")
    assert tokenizer_cache.load(folder) is None
    same(slow, load_tokenizer(ModelFiles("tiny", folder)))  # the slow way, and the copy made again
    assert cache.check(copy) is None
    same(slow, tokenizer_cache.load(folder))


CONVERSATIONS = [[{"role": "user", "content": TEXTS[0]}],
                 [{"role": "system", "content": TEXTS[2]}, {"role": "user", "content": TEXTS[3]},
                  {"role": "assistant", "content": TEXTS[1]}, {"role": "user", "content": TEXTS[4]}]]


def test_a_lean_load_is_a_plain_tokenizer_that_answers_as_transformers_does(monkeypatch):
    """A command that only generates gets a PlainTokenizer (no transformers import) from a kept
    copy, and it encodes, decodes and renders the chat template as transformers' tokenizer,
    on texts and conversations other than those compared when the copy was kept."""
    from transformers import AutoTokenizer

    from specgen.loading.tokenizer_cache import PlainTokenizer

    folder = tiny_qwen_tokenizer(cache.cache_dir() / "converted" / "tiny-float32")
    slow = load_tokenizer(ModelFiles("tiny", folder))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: pytest.fail("slow load"))
    plain = load_tokenizer(ModelFiles("tiny", folder), lean=True)
    assert type(plain) is PlainTokenizer and plain.name_or_path == str(folder)
    assert (plain.eos_token, plain.bos_token, plain.unk_token, plain.pad_token, plain.eos_token_id) == (
        slow.eos_token, slow.bos_token, slow.unk_token, slow.pad_token, slow.eos_token_id)
    assert plain.get_vocab() == slow.get_vocab() and plain.chat_template == slow.chat_template
    for text in [*TEXTS, "tin tin\tin", "", " \u00a0x"]:
        for special in (True, False):
            ids = slow(text, add_special_tokens=special)["input_ids"]
            assert plain(text, add_special_tokens=special)["input_ids"] == ids
            for skip in (True, False):
                assert plain.decode(ids, skip_special_tokens=skip) == slow.decode(ids, skip_special_tokens=skip)
    for messages in CONVERSATIONS:
        for prompt in (True, False):
            assert plain.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False) == \
                slow.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
    assert plain.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True) == \
        slow.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True, tokenize=True)["input_ids"]
    assert type(load_tokenizer(ModelFiles("tiny", folder))).__name__ == "TokenizersBackend"  # not lean


def test_a_plain_tokenizer_that_would_answer_otherwise_is_never_used(monkeypatch):
    """Where the plain tokenizer differs from transformers' in anything compared (here its
    decoding), the copy is kept without it and a lean load gets transformers' tokenizer."""
    from specgen.loading.tokenizer_cache import PlainTokenizer

    monkeypatch.setattr(PlainTokenizer, "decode", lambda self, ids, skip_special_tokens=False: "")
    folder = tiny_qwen_tokenizer(cache.cache_dir() / "converted" / "tiny-float32")
    load_tokenizer(ModelFiles("tiny", folder))
    manifest = cache.read_manifest(tokenizer_cache.entry_dir(tokenizer_cache.key(folder)))
    assert manifest["same"] and not manifest["plain"] and "decoding" in manifest["plain_problem"]
    assert type(load_tokenizer(ModelFiles("tiny", folder), lean=True)).__name__ == "TokenizersBackend"


def test_a_template_with_transformers_own_tags_keeps_transformers_tokenizer():
    from transformers import AutoTokenizer

    folder = tiny_qwen_tokenizer(cache.cache_dir() / "converted" / "tiny-float32")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    tok.save_pretrained(folder)
    load_tokenizer(ModelFiles("tiny", folder))
    assert type(load_tokenizer(ModelFiles("tiny", folder), lean=True)).__name__ != "PlainTokenizer"


def test_a_copy_of_an_older_format_lists_as_older_and_is_pruned():
    """A copy made by a release whose copies had another format is never loaded again (its
    key differs): it lists as "older", which `prune` removes; the current copy lists as a
    tokenizer."""
    folder = tiny_qwen_tokenizer(cache.cache_dir() / "converted" / "tiny-float32")
    cache.finish(folder, kind="converted", sha256="ab" * 32, dtype="float32", source="x.gguf", model="x")
    load_tokenizer(ModelFiles("tiny", folder))
    current = tokenizer_cache.entry_dir(tokenizer_cache.key(folder))
    old = current.with_name("0" * 32)
    shutil.copytree(current, old)
    manifest = cache.read_manifest(old)
    del manifest["tokenizer_format"]  # as the first format wrote it
    (old / cache.MANIFEST).write_text(json.dumps(manifest))
    kinds = {e.path: e.kind for e in cache_listing.entries()}
    assert kinds[old] == "older" and kinds[current] == "tokenizer"
    assert old in {e.path for e in cache_listing.prune(dry_run=True)}


def test_a_folders_key_is_hashed_once_until_one_of_its_files_changes(tmp_path, monkeypatch):
    """A load asks for the same folder's key twice (its copy; whether a GGUF draft matched it):
    its files are read and hashed once, and again once one changes, even to a file of the same
    size and time put in its place."""
    import os

    digests = []
    real = tokenizer_cache._digest
    monkeypatch.setattr(tokenizer_cache, "_digest", lambda *a: digests.append(a) or real(*a))
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"a": 1}')
    (folder / "tokenizer_config.json").write_text("{}")
    first = tokenizer_cache.key(folder)
    assert tokenizer_cache.key(folder) == first and len(digests) == 1
    other = tmp_path / "other.json"
    other.write_text('{"b": 2}')  # the same size
    before = (folder / "tokenizer.json").stat()
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, folder / "tokenizer.json")
    changed = tokenizer_cache.key(folder)
    assert changed != first and len(digests) == 2
    assert tokenizer_cache.key(folder) == changed and len(digests) == 2
