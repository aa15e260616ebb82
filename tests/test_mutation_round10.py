"""Mutation testing, round 10: tests that kill the mutants of stop 44's code (`attnlab convert`'s run folder and
tokenizer, class names, the quiet ranks' wait, JSON labels, BERT settings) that the suite let live. Each test names the
mutants it kills (the ids of the round's report); every one passes on the code as it is."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from cli_helpers import run_cli
from test_convert_to_run import _fast

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from attnlab.convert import save_hf_as_run  # noqa: E402
from attnlab.data.tokenizers import load_tokenizer  # noqa: E402
from attnlab.errors import CheckpointError  # noqa: E402
from attnlab.training.checkpoint import class_names  # noqa: E402

TEXTS = ["The quick brown fox jumps over the lazy dog.", "story one is good", "story two is bad",
         "Café crème, naïve résumé!"] * 4
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf-gpt2")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    eos = bpe.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=32, n_embd=16, n_layer=1, n_head=2,
                                  bos_token_id=eos, eos_token_id=eos)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    _fast(bpe._tokenizer, folder, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    return folder


def _bert(folder, id2label=None, **tok_kwargs):
    wp = tokenizers.BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(TEXTS, vocab_size=200, min_frequency=1, special_tokens=SPECIALS)
    changes = {} if id2label is None else {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}}
    cfg = transformers.BertConfig(vocab_size=wp.get_vocab_size(), hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=20, max_position_embeddings=32,
                                  pad_token_id=0, **changes)
    cls = transformers.BertForSequenceClassification if id2label is not None else transformers.BertForPreTraining
    torch.manual_seed(1)
    cls(cfg).save_pretrained(folder)
    specials = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIALS))
    _fast(wp._tokenizer, folder, **{**specials, **tok_kwargs})
    return folder


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return _bert(tmp_path_factory.mktemp("hf-bert"))


# ---- save_hf_as_run / _check_run_folder (T02, T10, T04, T05, T09)

def test_overwrite_removes_the_old_runs_records_and_best(gpt2, tmp_path):   # T02, T10
    run = tmp_path / "run"
    save_hf_as_run(gpt2, run)
    shutil.copytree(run / "checkpoint", run / "best")          # an old best checkpoint
    (run / "run.json").write_text("{}", encoding="utf-8")      # an old run's records
    save_hf_as_run(gpt2, run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [".attnlab.lock", "checkpoint"]


def test_overwrite_unlinks_a_symlink_to_a_folder_and_keeps_its_target(gpt2, tmp_path):  # T04
    run, target = tmp_path / "run", tmp_path / "shared-data"
    save_hf_as_run(gpt2, run)
    target.mkdir()
    (target / "keep.txt").write_text("x", encoding="utf-8")
    (run / "data").symlink_to(target, target_is_directory=True)
    save_hf_as_run(gpt2, run, overwrite=True)
    assert not (run / "data").exists() and (target / "keep.txt").is_file()


def test_a_run_folder_holding_the_hf_folder_is_refused_even_with_overwrite(gpt2, tmp_path):  # T05
    run = tmp_path / "run"
    save_hf_as_run(gpt2, run)
    hf = run / "hf"
    shutil.copytree(gpt2, hf)
    with pytest.raises(CheckpointError, match="holds the HF folder"):
        save_hf_as_run(hf, run, overwrite=True)
    assert (hf / "model.safetensors").is_file()


def test_a_run_stopped_before_its_first_save_is_replaced(gpt2, tmp_path):  # T09
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}", encoding="utf-8")
    save_hf_as_run(gpt2, run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [".attnlab.lock", "checkpoint"]


def test_a_file_as_the_run_folder_is_named_a_file(gpt2, tmp_path):  # T01
    (tmp_path / "run").write_text("x", encoding="utf-8")
    with pytest.raises(CheckpointError, match="run is a file; give a new or empty folder for the run$"):
        save_hf_as_run(gpt2, tmp_path / "run")


# ---- _model_type (T11, T12)

def test_an_attnlab_checkpoint_given_as_the_hf_folder_is_named_so(gpt2, tmp_path):  # T11
    save_hf_as_run(gpt2, tmp_path / "run")
    with pytest.raises(CheckpointError, match="is an attnlab model config \\(family 'gpt'\\), not a HF one"):
        save_hf_as_run(tmp_path / "run" / "checkpoint", tmp_path / "again")


def test_a_file_given_as_the_hf_folder_is_named_a_file(gpt2, tmp_path):  # T12
    with pytest.raises(CheckpointError, match="config.json is a file; give the HF model's folder"):
        save_hf_as_run(gpt2 / "config.json", tmp_path / "run")


# ---- tokenizer (T13, T14, T15, T17, T20, T21, T22, T24, T25, T26)

def test_special_tokens_map_wins_over_tokenizer_config(bert, tmp_path):  # T13
    folder = tmp_path / "hf"
    shutil.copytree(bert, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"mask_token": "[UNK]"}), encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps({"mask_token": "[MASK]"}), encoding="utf-8")
    assert load_tokenizer(save_hf_as_run(folder, tmp_path / "run")).specials.mask == "[MASK]"


@pytest.mark.parametrize("value", [5, "", ["[MASK]"]])
def test_a_special_that_is_not_a_token_is_refused(bert, tmp_path, value):  # T14
    folder = tmp_path / "hf"
    shutil.copytree(bert, folder)
    (folder / "special_tokens_map.json").write_text(json.dumps({"mask_token": value}), encoding="utf-8")
    with pytest.raises(CheckpointError, match="mask_token is .*; it must be a token \\(a string\\)$"):
        save_hf_as_run(folder, tmp_path / "run")


def test_an_added_token_dict_names_its_content(bert, tmp_path):  # T15
    folder = tmp_path / "hf"
    shutil.copytree(bert, folder)
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"mask_token": {"content": "[MASK]", "lstrip": True, "normalized": False}}), encoding="utf-8")
    assert load_tokenizer(save_hf_as_run(folder, tmp_path / "run")).specials.mask == "[MASK]"


def test_a_usual_token_the_vocabulary_lacks_is_left_out(tmp_path):  # T17
    # A BERT vocabulary without [MASK] and no file naming specials: its defaults that the vocabulary has.
    folder = tmp_path / "hf"
    _bert(folder)
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    (folder / "vocab.txt").write_text("".join(("[unused0]" if t == "[MASK]" else t) + "\n" for t, _ in vocab),
                                      encoding="utf-8")
    ours = load_tokenizer(save_hf_as_run(folder, tmp_path / "run"))
    assert ours.mask_id is None and ours.cls_id == 2


def _vocab_only(bert, folder, settings):
    shutil.copytree(bert, folder)
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")


@pytest.mark.parametrize("settings, match", [
    ({"do_lower_case": 1}, "do_lower_case is 1; it must be true or false"),          # T20
    ({"strip_accents": 0}, "strip_accents is 0; it must be null or true or false"),  # T20
    ({"do_basic_tokenize": False}, "do_basic_tokenize false .* is not read"),         # T21
])
def test_vocab_txt_settings_are_checked(bert, tmp_path, settings, match):
    _vocab_only(bert, tmp_path / "hf", settings)
    with pytest.raises(CheckpointError, match=match):
        save_hf_as_run(tmp_path / "hf", tmp_path / "run")


def test_vocab_txt_takes_the_named_unk(bert, tmp_path):  # T22
    folder = tmp_path / "hf"
    _vocab_only(bert, folder, {"unk_token": "[unk2]"})
    with (folder / "vocab.txt").open("r+", encoding="utf-8") as f:
        text = f.read().replace("[UNK]\n", "[unk2]\n")
        f.seek(0)
        f.write(text)
        f.truncate()
    ours = load_tokenizer(save_hf_as_run(folder, tmp_path / "run"))
    assert ours.specials.unk == "[unk2]" and ours.encode("안녕") == [ours.unk_id]


def test_a_tokenizer_of_another_model_kind_is_refused(gpt2, bert, tmp_path):  # T24
    folder = tmp_path / "hf"
    shutil.copytree(bert, folder)
    shutil.copy(gpt2 / "tokenizer.json", folder / "tokenizer.json")
    with pytest.raises(CheckpointError, match="holds a BPE tokenizer; a BERT run reads a WordPiece one$"):
        save_hf_as_run(folder, tmp_path / "run")


def test_hf_tokenizer_refuses_another_model_type(bert):  # T26
    from attnlab.convert.to_run import hf_tokenizer

    with pytest.raises(CheckpointError, match="model_type 'roberta' has no tokenizer here"):
        hf_tokenizer(bert, "roberta")


# ---- _class_names (T28, T29, T30, T32)

@pytest.mark.parametrize("id2label", [{0: "LABEL_0", 1: "LABEL_1"}, {0: "same", 1: "same"}, {0: "", 1: "x"},
                                      {0: "neg", 2: "pos"}])
def test_class_names_that_no_data_uses_or_do_not_fit_are_not_kept(tmp_path, id2label):  # T28 T29 T32 T30
    folder = _bert(tmp_path / "hf", id2label={0: "neg", 1: "pos"})
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["id2label"] = {str(k): v for k, v in id2label.items()}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    save_hf_as_run(folder, tmp_path / "run")
    assert class_names(tmp_path / "run") is None


def test_a_run_folder_whose_config_cannot_be_read_is_refused_in_one_line(gpt2, tmp_path, monkeypatch):  # T08
    import attnlab.training.checkpoint as ckpt

    run = tmp_path / "run"
    save_hf_as_run(gpt2, run)

    def unreadable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(ckpt, "read_config", unreadable)
    with pytest.raises(CheckpointError, match="holds files that are not an attnlab run"):
        save_hf_as_run(gpt2, run, overwrite=True)


def test_a_tokenizer_json_load_would_refuse_is_refused_at_conversion(bert, tmp_path):  # T25
    folder = tmp_path / "hf"
    shutil.copytree(bert, folder)
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    data["model"]["unk_token"] = "[NOPE]"
    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CheckpointError, match="unknown token '\\[NOPE\\]' is not in its vocabulary"):
        save_hf_as_run(folder, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_larger_than_the_model_is_refused(gpt2, tmp_path):  # T33
    folder = tmp_path / "hf"
    shutil.copytree(gpt2, folder)
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS * 3 + ["more words here to merge further"], vocab_size=330, min_frequency=1,
                            special_tokens=["<|endoftext|>"])
    size = json.loads((folder / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    assert bpe.get_vocab_size() > size
    bpe.save(str(folder / "tokenizer.json"))
    with pytest.raises(CheckpointError,
                       match=f"the tokenizer has {bpe.get_vocab_size()} tokens and the GPT-2 model {size}"):
        save_hf_as_run(folder, tmp_path / "run")


# ---- outside to_run

def test_c02_a_quiet_rank_waits_seconds_not_no_time():
    import attnlab.cli as cli

    assert 1.0 <= cli.QUIET_RANK_WAIT_S <= 30.0  # long enough for rank 0's line, short of torchrun's own timeouts


@pytest.mark.parametrize("rank", ["1"])
def test_c06_a_refusal_that_may_be_this_rank_alone_is_said_at_once_without_a_wait(capsys, monkeypatch, tmp_path, rank):
    import attnlab.cli as cli

    waits = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(cli.time, "sleep", lambda s: waits.append(s))
    from attnlab.errors import PathError
    from attnlab.training import recipe

    def failing(run, resume=False):
        raise PathError("cannot make runs/x: Permission denied")

    monkeypatch.setattr(recipe, "train_run", failing)
    code, _, err = run_cli(capsys, "train")
    assert code == 2 and err.startswith("attnlab (rank 1): error:"), err   # a PathError: this process's own
    assert waits == []


def _read(tmp_path, *lines):
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "x.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return read_classification_file(path)


def test_d02_a_label_of_exactly_4300_digits_reads_as_such(tmp_path):
    labels = _read(tmp_path, '{"text": "a", "label": 1e4299}', '{"text": "b", "label": 2}').labels
    assert labels[0] == "1" + "0" * 4299


def test_d03_an_object_label_is_shown_with_its_characters(tmp_path):
    from attnlab.errors import DataError

    with pytest.raises(DataError, match='label {"catégorie": 1} is not a string or integer'):
        _read(tmp_path, '{"text": "a", "label": {"catégorie": 1}}')


def test_k02_a_non_string_model_type_is_not_called_a_hf_model(tmp_path):
    from attnlab.errors import CheckpointError
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.training.checkpoint import read_config, save_checkpoint

    save_checkpoint(tmp_path / "run" / "checkpoint", GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16,
                                                                    n_heads=2, n_layers=1)))
    (tmp_path / "run" / "checkpoint" / "config.json").write_text(json.dumps({"model_type": 5}), encoding="utf-8")
    with pytest.raises(CheckpointError, match="has no model family"):
        read_config(tmp_path / "run")


def test_b02_add_cross_attention_alone_is_named(tmp_path):
    from attnlab.convert.bert import bert_from_hf
    from attnlab.errors import CheckpointError

    cfg = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=20, max_position_embeddings=16, is_decoder=True,
                                  add_cross_attention=True)
    state = transformers.BertModel(cfg).state_dict()
    config = {**cfg.to_dict(), "is_decoder": False}
    with pytest.raises(CheckpointError, match="configured as a decoder"):
        bert_from_hf(state, config)


def test_c01_convert_refuses_torchrun_once(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    code, out, err = run_cli(capsys, "convert", str(tmp_path / "hf"), str(tmp_path / "run"))
    assert code == 2 and out == ""
    assert err.strip() == "attnlab: error: attnlab convert runs in one process; run it without torchrun", err
    assert not (tmp_path / "run").exists()


def test_r04_resuming_a_classifier_that_recorded_no_class_names_is_not_refused(tmp_path):
    from attnlab.training.recipe import _pretrained_class_order

    (tmp_path / "run").mkdir()  # class_names: None (no labels recorded, e.g. a checkpoint from before they were)
    assert _pretrained_class_order(tmp_path / "run", ["neg", "pos"], resumed_with="data.tsv") is None


def test_d10_a_decimal_text_field_is_called_a_number(tmp_path):
    from attnlab.errors import DataError

    with pytest.raises(DataError, match="no string field 'text': it holds a number, not a string"):
        _read(tmp_path, '{"text": 1.5, "label": 1}')


@pytest.mark.parametrize("change, match", [({"position_embedding_type": "relative_key"}, "position_embedding_type"),
                                           ({"is_decoder": True}, "configured as a decoder"),
                                           ({"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu' is not supported")])
def test_b04_bert_config_from_hf_refuses_what_our_bert_does_not_compute(change, match):
    from attnlab.convert.bert import bert_config_from_hf
    from attnlab.errors import CheckpointError

    config = {"model_type": "bert", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 20, "max_position_embeddings": 16}
    bert_config_from_hf(config)
    with pytest.raises(CheckpointError, match=match):
        bert_config_from_hf({**config, **change})
