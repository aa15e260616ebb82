"""The tokenizer of a converted BERT or GPT-2 gives HF's ids where the folder's tokenizer files say more than the
seven named specials (third convert audit): additional_special_tokens in special_tokens_map.json or
tokenizer_config.json (entity markers: they were split into pieces), a vocab.txt folder's added_tokens.json (refused
as "embeddings padded beyond the vocabulary"), tokenizer_config.json's casing, accent and Chinese character settings
over a BertTokenizer's tokenizer.json (HF reads the config)."""

from __future__ import annotations

import json

import pytest
import torch
from test_convert_to_run import AWKWARD, BERT_SPECIALS, _bert_config, _fast, _wordpiece

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from attnlab.convert import save_hf_as_run  # noqa: E402
from attnlab.data.tokenizers import load_tokenizer  # noqa: E402
from attnlab.errors import CheckpointError  # noqa: E402

TEXTS = [*AWKWARD, "the [E1] fox [E2] jumps", "x[E1]y and [e1] lower", "Hello Café 東京 naïve", "THE [MASK] [E2]"]


@pytest.fixture(scope="module")
def bert_model(tmp_path_factory):
    wp = _wordpiece(lowercase=False)  # cased pieces: casing settings change the ids
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(_bert_config(wp.get_vocab_size()))
    return wp, model


def _folder(tmp_path, bert_model, *, vocab_only: bool, config: dict | None = None, special_map: dict | None = None,
            rename_last: tuple[str, ...] = ()):
    wp, model = bert_model
    folder = tmp_path / "hf"
    folder.mkdir()
    model.save_pretrained(folder)
    _fast(wp._tokenizer, folder, **dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
                                            BERT_SPECIALS)))
    vocab = [t for t, _ in sorted(wp.get_vocab().items(), key=lambda item: item[1])]
    for i, token in enumerate(rename_last):  # tokens of the vocabulary renamed, as a vocabulary with markers has them
        vocab[-1 - i] = token
    if vocab_only or rename_last:
        (folder / "tokenizer.json").unlink()
        (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if special_map is not None:
        (folder / "special_tokens_map.json").write_text(json.dumps(special_map), encoding="utf-8")
    return folder


def _same_ids_as_hf(folder, run):
    ours = load_tokenizer(save_hf_as_run(folder, run))
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert ours.vocab_size == len(hf)
    for text in TEXTS:
        assert ours.encode(text) == hf(text, add_special_tokens=False)["input_ids"], text
    return ours, hf


@pytest.mark.parametrize("where", ["special_tokens_map.json", "tokenizer_config.json"])
def test_additional_special_tokens_are_matched_whole(tmp_path, bert_model, where):
    listed = {"additional_special_tokens": ["[E1]", "[E2]"]}
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": False,
              **(listed if where == "tokenizer_config.json" else {})}
    folder = _folder(tmp_path, bert_model, vocab_only=True, config=config, rename_last=("[E1]", "[E2]"),
                     special_map=listed if where == "special_tokens_map.json" else None)
    ours, hf = _same_ids_as_hf(folder, tmp_path / "run")
    ids = ours.encode("the [E1] fox")
    assert ours.token_to_id("[E1]") in ids
    # Specials, as HF's are: left out of decoded text (and so of what generate prints), as HF's decode leaves them.
    assert {ours.token_to_id("[E1]"), ours.token_to_id("[E2]")} <= set(ours.special_ids)
    assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True) == "the fox"


def test_an_additional_special_token_the_vocabulary_lacks_is_refused(tmp_path, bert_model):
    folder = _folder(tmp_path, bert_model, vocab_only=True, config={"do_lower_case": False},
                     special_map={"additional_special_tokens": ["[NOPE]"]})
    with pytest.raises(CheckpointError, match=r"special_tokens_map.json names '\[NOPE\]' among "
                                              r"additional_special_tokens, and the tokenizer's vocabulary lacks it"):
        save_hf_as_run(folder, tmp_path / "run")


def test_added_tokens_json_of_a_vocab_txt_folder_is_read(tmp_path, bert_model):
    wp, model = bert_model
    folder = _folder(tmp_path, bert_model, vocab_only=True, config={"do_lower_case": False})
    n = wp.get_vocab_size()
    (folder / "added_tokens.json").write_text(json.dumps({"[E2]": n + 1, "[E1]": n}), encoding="utf-8")
    resized = transformers.BertForPreTraining(_bert_config(n))
    resized.resize_token_embeddings(n + 2)
    resized.save_pretrained(folder)
    ours, _ = _same_ids_as_hf(folder, tmp_path / "run")
    assert ours.encode("the [E1] fox")[1] == n
    # ids that do not follow the vocabulary's: refused, naming the file
    (folder / "added_tokens.json").write_text(json.dumps({"[E1]": n + 5, "[E2]": n + 6}), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"added_tokens.json: the ids of its tokens \('\[E1\]' \d+, '\[E2\]' "
                                              r"\d+\) do not follow the vocabulary's \d+ tokens"):
        save_hf_as_run(folder, tmp_path / "run2")


@pytest.mark.parametrize("config", [
    {"tokenizer_class": "BertTokenizer", "do_lower_case": True},
    {"tokenizer_class": "BertTokenizerFast"},  # HF's default: lowercase
    {"tokenizer_class": "BertTokenizer", "do_lower_case": False, "strip_accents": True},
    {"tokenizer_class": "BertTokenizer", "do_lower_case": False, "tokenize_chinese_chars": False},
])
def test_a_bert_tokenizer_configs_settings_win_over_its_tokenizer_json(tmp_path, bert_model, config):
    # The tokenizer.json is cased (no lowercasing, accents kept, Chinese characters split): HF's BertTokenizer
    # rebuilds its normalizer from tokenizer_config.json, and so must the conversion.
    folder = _folder(tmp_path, bert_model, vocab_only=False, config=config)
    assert json.loads((folder / "tokenizer.json").read_text())["normalizer"]["lowercase"] is False
    ours, _ = _same_ids_as_hf(folder, tmp_path / "run")
    assert (ours.encode("Hello") == ours.encode("hello")) == config.get("do_lower_case", True)


def test_a_tokenizer_json_of_another_class_keeps_its_normalizer(tmp_path, bert_model):
    folder = _folder(tmp_path, bert_model, vocab_only=False, config={"tokenizer_class": "PreTrainedTokenizerFast",
                                                                    "do_lower_case": True})
    ours = load_tokenizer(save_hf_as_run(folder, tmp_path / "run"))
    assert ours.encode("Hello") != ours.encode("hello")


@pytest.fixture(scope="module")
def uncased_model():
    wp = _wordpiece(lowercase=True)
    torch.manual_seed(0)
    return wp, transformers.BertForPreTraining(_bert_config(wp.get_vocab_size()))


def test_markers_of_added_tokens_json_named_special_still_match_lowercased_text(tmp_path, uncased_model):
    # Marked special, the tokens of added_tokens.json were matched before the lowercasing only: an uncased model's
    # "[e1]" (the text lowercased, as for an uncased model) fell apart into pieces, where HF matches it.
    wp, _ = uncased_model
    folder = _folder(tmp_path, uncased_model, vocab_only=True, config={"tokenizer_class": "BertTokenizer"},
                     special_map={"additional_special_tokens": ["[E1]", "[E2]"]})
    n = wp.get_vocab_size()
    (folder / "added_tokens.json").write_text(json.dumps({"[E1]": n, "[E2]": n + 1}), encoding="utf-8")
    resized = transformers.BertForPreTraining(_bert_config(n))
    resized.resize_token_embeddings(n + 2)
    resized.save_pretrained(folder)
    ours, _ = _same_ids_as_hf(folder, tmp_path / "run")
    assert ours.encode("the [e1] fox")[1] == ours.encode("the [E1] fox")[1] == n


@pytest.mark.parametrize("layout", ["no tokenizer_class", "no tokenizer_config.json"])
def test_a_bert_folder_naming_no_tokenizer_class_is_read_as_bert_tokenizer(tmp_path, bert_model, layout):
    # HF reads a BERT folder with BertTokenizer unless its config names another class: with no class (as
    # bert-base-cased's) or no tokenizer_config.json at all, its settings (default: lowercase) still apply.
    folder = _folder(tmp_path, bert_model, vocab_only=False, config={"do_lower_case": False, "strip_accents": True})
    if layout == "no tokenizer_config.json":
        (folder / "tokenizer_config.json").unlink()
    ours, _ = _same_ids_as_hf(folder, tmp_path / "run")
    assert (ours.encode("Hello") == ours.encode("hello")) == (layout == "no tokenizer_config.json")


@pytest.mark.parametrize("listed", [["[unused1]"], {"marker": "[unused1]"}])
def test_transformers_5s_extra_special_tokens_are_matched_whole(tmp_path, bert_model, listed):
    folder = _folder(tmp_path, bert_model, vocab_only=True, rename_last=("[unused1]",),
                     config={"tokenizer_class": "BertTokenizer", "do_lower_case": False,
                             "extra_special_tokens": listed})
    ours = load_tokenizer(save_hf_as_run(folder, tmp_path / "run"))
    assert ours.encode("is [unused1] here")[1] == ours.token_to_id("[unused1]")
    if isinstance(listed, list):  # transformers 5 reads a list (an object of names is for its processors)
        _same_ids_as_hf(folder, tmp_path / "run2")
