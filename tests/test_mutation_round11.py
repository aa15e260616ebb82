"""Mutation testing, round 11: tests that kill the mutants the suite let live in `attnlab convert`'s tokenizer files
(added_tokens.json, additional_special_tokens), the record a resumed or replacing fine-tune writes to run.json, the
warning for a language model's text that spells special tokens, the bf16 refusal on a GPU and `~` expansion of
settings that are not text. Each test is named after the mutant it kills (the ids of the round's report); every one
passes on the code as it is."""

from __future__ import annotations

import json
import pathlib
import warnings

import pytest
import torch
from cli_helpers import run_cli, run_cli_warned, train_in_process
from cli_helpers import toml_str as _q
from test_convert_to_run import _bert_config, _wordpiece

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from test_convert_tokenizer_audit3 import _folder, _same_ids_as_hf  # noqa: E402

from attnlab.convert import save_hf_as_run  # noqa: E402
from attnlab.data.tokenizers import load_tokenizer  # noqa: E402
from attnlab.errors import CheckpointError, ConfigError  # noqa: E402
from attnlab.training import device  # noqa: E402
from attnlab.training.recipe import load_run_config  # noqa: E402


@pytest.fixture(scope="module")
def cased():
    wp = _wordpiece(lowercase=False)
    torch.manual_seed(0)
    return wp, transformers.BertForPreTraining(_bert_config(wp.get_vocab_size()))


@pytest.fixture(scope="module")
def uncased():
    wp = _wordpiece(lowercase=True)
    torch.manual_seed(0)
    return wp, transformers.BertForPreTraining(_bert_config(wp.get_vocab_size()))


def _with_added_tokens(folder, vocab_size: int, added: dict, new: int):
    """`folder` with an added_tokens.json and its model's embeddings resized for `new` added tokens."""
    (folder / "added_tokens.json").write_text(json.dumps(added), encoding="utf-8")
    resized = transformers.BertForPreTraining(_bert_config(vocab_size))
    resized.resize_token_embeddings(vocab_size + new)
    resized.save_pretrained(folder)
    return folder


# ---- added_tokens.json of a vocab.txt folder (c03, c05, c15, c16)

def test_c03_an_added_token_of_an_uncased_model_matches_lowercased_text_as_hf_does(tmp_path, uncased):
    # No additional_special_tokens: the token of added_tokens.json alone, matched after the lowercasing as HF does
    wp, _ = uncased
    n = wp.get_vocab_size()
    folder = _folder(tmp_path, uncased, vocab_only=True, config={"tokenizer_class": "BertTokenizer"})
    _with_added_tokens(folder, n, {"[E1]": n}, 1)
    ours, hf = _same_ids_as_hf(folder, tmp_path / "run")
    assert ours.encode("the [e1] fox") == hf("the [e1] fox", add_special_tokens=False)["input_ids"]
    assert ours.encode("the [e1] fox")[1] == n


def test_c05_an_added_tokens_json_naming_a_token_of_the_vocabulary_is_read_as_hf_reads_it(tmp_path, cased):
    wp, _ = cased
    n = wp.get_vocab_size()
    folder = _folder(tmp_path, cased, vocab_only=True, config={"do_lower_case": False})
    _with_added_tokens(folder, n, {"[MASK]": wp.token_to_id("[MASK]"), "[E1]": n}, 1)
    ours, _ = _same_ids_as_hf(folder, tmp_path / "run")
    assert ours.encode("the [E1] fox")[1] == n
    assert ours.token_to_id("[MASK]") == wp.token_to_id("[MASK]")


def test_c15_an_added_tokens_json_with_an_id_that_is_not_a_whole_number_is_refused(tmp_path, cased):
    wp, _ = cased
    n = wp.get_vocab_size()
    folder = _folder(tmp_path, cased, vocab_only=True, config={"do_lower_case": False})
    _with_added_tokens(folder, n, {"[E1]": float(n)}, 1)  # 30522.0: not an id
    with pytest.raises(CheckpointError, match=r"added_tokens.json is not a JSON object of tokens and their ids"):
        save_hf_as_run(folder, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_c16_a_tokenizer_config_that_cannot_be_read_is_refused_in_one_line(tmp_path, cased, monkeypatch):
    folder = _folder(tmp_path, cased, vocab_only=True, config={"do_lower_case": False})
    read_text = pathlib.Path.read_text

    def denied(self, *args, **kwargs):  # what reading a file the user may not read raises
        if self.name == "tokenizer_config.json":
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", denied)
    with pytest.raises(CheckpointError) as caught:
        save_hf_as_run(folder, tmp_path / "run")
    assert str(caught.value).startswith(f"cannot read {folder / 'tokenizer_config.json'}: ")
    assert "Permission denied" in str(caught.value) and "\n" not in str(caught.value)


# ---- additional_special_tokens (c08, c09, c10, c11)

def test_c08_additional_special_tokens_given_as_an_object_is_refused(tmp_path, cased):
    # An object of named tokens is transformers 5's extra_special_tokens only; additional_special_tokens is a list
    value = {"marker": "[unused1]"}
    folder = _folder(tmp_path, cased, vocab_only=True, rename_last=("[unused1]",),
                     config={"tokenizer_class": "BertTokenizer", "do_lower_case": False,
                             "additional_special_tokens": value})
    with pytest.raises(CheckpointError, match=r"tokenizer_config.json: additional_special_tokens is "
                                              r"\{\"marker\": \"\[unused1\]\"\}; it must be a list of tokens"):
        save_hf_as_run(folder, tmp_path / "run")


@pytest.mark.parametrize("in_config", ["additional_special_tokens", "extra_special_tokens"])
def test_c09_special_tokens_maps_list_of_extra_specials_is_matched_whole(tmp_path, cased, in_config):
    # special_tokens_map.json lists every marker, tokenizer_config.json one of them: HF matches each whole
    folder = _folder(tmp_path, cased, vocab_only=True, rename_last=("[E1]", "[E2]"),
                     config={"tokenizer_class": "BertTokenizer", "do_lower_case": False, in_config: ["[E1]"]},
                     special_map={"extra_special_tokens": ["[E1]", "[E2]"]})
    ours, _ = _same_ids_as_hf(folder, tmp_path / "run")
    assert ours.encode("the [E2] fox")[1] == ours.token_to_id("[E2]")


def test_c10_additional_special_tokens_null_names_none(tmp_path, cased):
    folder = _folder(tmp_path, cased, vocab_only=True,
                     config={"tokenizer_class": "BertTokenizer", "do_lower_case": False,
                             "additional_special_tokens": None})
    ours, _ = _same_ids_as_hf(folder, tmp_path / "run")
    assert ours.encode("Hello") != ours.encode("hello")


@pytest.mark.parametrize("key", ["additional_special_tokens", "extra_special_tokens"])
def test_c11_special_tokens_given_as_added_token_fields_are_matched_whole(tmp_path, cased, key):
    listed = [{"content": "[E1]", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}]
    folder = _folder(tmp_path, cased, vocab_only=True, rename_last=("[E1]",),
                     config={"tokenizer_class": "BertTokenizer", "do_lower_case": False},
                     special_map={key: listed})
    if key == "extra_special_tokens":
        ours, _ = _same_ids_as_hf(folder, tmp_path / "run")
    else:  # as transformers 4 writes it (transformers 5.25 fails to read such a list: no ids to compare with)
        ours = load_tokenizer(save_hf_as_run(folder, tmp_path / "run"))
    assert ours.encode("x[E1]y")[1] == ours.token_to_id("[E1]")


# ---- run.json of a fine-tune resumed or replaced (r19, r20)

T = ["--set", "train.progress=false", "--set", "train.device=cpu", "--set", "train.precision=fp32", "--set",
     "train.batch_size=4", "--set", "train.steps=2", "--set", "train.warmup_steps=0", "--set", "train.eval_every=0"]


@pytest.fixture(scope="module")
def encoder_lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("round11")
    (root / "docs.txt").write_text("the good cat sat\nthe bad dog ran\n" * 40, encoding="utf-8")
    (root / "cls.tsv").write_text("text\tlabel\n" + "the good cat\t1\nthe bad dog\t0\n" * 10, encoding="utf-8")
    train_in_process(*T, "--set", "model.family=encoder", "--set", "model.d_model=16", "--set", "model.n_layers=1",
                     "--set", "model.n_heads=2", "--set", "model.d_ff=32", "--set", "model.head=lm",
                     "--set", "data.block_size=8", "--set", "data.tokenizer=word",
                     "--set", f"data.path={_q(root / 'docs.txt')}", "--set", f"train.out_dir={_q(root / 'lm')}")
    return root


def _fine_tune(root, out):
    return [*T, "--set", f"model.init_from={_q(root / 'lm')}", "--set", "data.task=classification",
            "--set", f"data.path={_q(root / 'cls.tsv')}", "--set", f"train.out_dir={_q(out)}"]


def _recorded(out) -> dict:
    return json.loads((out / "run.json").read_text(encoding="utf-8"))["model"]


def test_r19_a_fine_tune_resumed_with_another_dropout_records_the_new_one(encoder_lm, capsys, tmp_path):
    from attnlab.training.checkpoint import load_model

    out = tmp_path / "ft"
    code, _, err = run_cli(capsys, "train", *_fine_tune(encoder_lm, out), "--set", "model.pooling=last",
                           "--set", "model.dropout=0.1")
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", *_fine_tune(encoder_lm, out), "--set", "model.dropout=0.3",
                           "--set", "train.steps=3", "--resume")
    assert code == 0, err
    assert load_model(out).config.dropout == 0.3  # the resumed session trained with the dropout it was given
    recorded = _recorded(out)
    assert recorded["dropout"] == 0.3, recorded
    assert recorded["pooling"] == "last", recorded  # what the resume left out: the checkpoint's, as before


def test_r20_a_fresh_fine_tune_replacing_one_records_its_own_settings_not_the_old_runs(encoder_lm, capsys,
                                                                                         tmp_path):
    from attnlab.training.checkpoint import load_model

    out = tmp_path / "ft"
    code, _, err = run_cli(capsys, "train", *_fine_tune(encoder_lm, out), "--set", "model.pooling=last")
    assert code == 0, err
    assert _recorded(out)["pooling"] == "last"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "already holds a trained run; training from scratch replaces it"
        code, _, err = run_cli(capsys, "train", *_fine_tune(encoder_lm, out))  # the same init_from, no --resume
    assert code == 0, err
    assert load_model(out).config.pooling != "last"
    assert _recorded(out).get("pooling") != "last", _recorded(out)


# ---- a language model's text that spells special tokens (r12, r13)

def test_r12_r13_an_eval_text_spelling_eos_once_is_named_with_one_time(capsys, tmp_path):
    text, held_out = tmp_path / "text.txt", tmp_path / "held_out.txt"
    text.write_text("".join(f"plain line {i} about nothing special at all\n" for i in range(60)), encoding="utf-8")
    held_out.write_text("a held out line ends in <eos> once\n" + "plain line about nothing\n" * 20, encoding="utf-8")
    code, err, said = run_cli_warned(capsys, "train", *T, "--set", "model.preset=gpt-char-tiny", "--set",
                                     "data.tokenizer=word", "--set", f"data.path={_q(text)}", "--set",
                                     f"data.eval_path={_q(held_out)}", "--set", f"train.out_dir={_q(tmp_path / 'run')}",
                                     about="spells special tokens")
    assert code == 0, err
    assert said == [f"the text of {text} and {held_out} spells special tokens, which the word tokenizer reads as "
                    "those tokens ('<eos>' 1 time): generation stops at an end-of-sentence token and leaves the "
                    "others out of the text it prints; respell them where they are text (an end-of-sentence token "
                    "between documents is meant as one: leave those)"], said


# ---- outside the tokenizer and the run record (x05, x12)

@pytest.mark.parametrize(("setting", "said"), [
    ("train.precision", 'train.precision = "bf16" but this GPU does not support bf16; use train.precision = "fp32"'),
    ("--precision", "--precision bf16 but this GPU does not support bf16; use --precision fp32"),
])
def test_x05_bf16_on_a_gpu_that_cannot_run_it_says_to_use_fp32(monkeypatch, setting, said):
    # "auto" is fp32 on such a GPU too, but the one setting to give is fp32
    monkeypatch.setattr(device, "_cuda_bf16", lambda d: False)
    monkeypatch.setattr(device, "_cuda_bf16_runs", lambda: False)
    with pytest.raises(ConfigError) as caught:
        device.resolve_precision("bf16", "cuda", setting=setting)
    assert str(caught.value) == said


@pytest.mark.parametrize("setting", ["data.path=5", "train.out_dir=5", "model.init_from=5", "data.path=[1]"])
def test_x12_a_path_setting_that_is_not_text_is_refused_as_such(setting):
    name = setting.split("=")[0]
    with pytest.raises(ConfigError, match=f"^{name}: expected a string"):
        load_run_config(None, [setting])
