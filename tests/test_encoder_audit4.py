"""A classifier fine-tuned from an encoder language model (model.init_from) keeps the tokenizer's pad id in its
config, as one trained from scratch does (fourth encoder audit): the LM's config leaves pad_id unset, and the
classifier then read the padding of a batch given without an attention_mask as tokens."""

from __future__ import annotations

import warnings

import pytest
import torch
from cli_helpers import run_cli
from cli_helpers import toml_str as _q

from attnlab.data.tokenizers import load_tokenizer
from attnlab.training.checkpoint import find_checkpoint, load_model

T = ["--set", "train.progress=false", "--set", "train.device=cpu", "--set", "train.batch_size=4", "--set",
     "train.steps=2", "--set", "train.warmup_steps=0"]
M = ["--set", "model.family=encoder", "--set", "model.d_model=16", "--set", "model.n_layers=1", "--set",
     "model.n_heads=2", "--set", "model.d_ff=32"]


@pytest.mark.parametrize("tokenizer", ["word", "char"])
def test_a_classifier_from_an_encoder_lm_reads_padding_as_its_tokenizer_pads(capsys, tmp_path, tokenizer):
    docs, table = tmp_path / "docs.txt", tmp_path / "cls.tsv"
    docs.write_text("the good cat sat\nthe bad dog ran\n" * 40, encoding="utf-8")
    table.write_text("text\tlabel\n" + "the good cat\t1\nthe bad dog\t0\n" * 10, encoding="utf-8")
    code, _, err = run_cli(capsys, "train", *M, *T, "--set", "model.head=lm", "--set", "data.block_size=8",
                           "--set", f"data.tokenizer={_q(tokenizer)}", "--set", f"data.path={_q(docs)}",
                           "--set", f"train.out_dir={_q(tmp_path / 'lm')}")
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", *T, "--set", f"model.init_from={_q(tmp_path / 'lm')}",
                           "--set", "data.task=classification", "--set", f"data.path={_q(table)}",
                           "--set", "data.max_length=16", "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", *T, "--set", f"model.init_from={_q(tmp_path / 'lm')}",
                           "--set", "data.task=classification", "--set", f"data.path={_q(table)}",
                           "--set", "data.max_length=16", "--set", f"train.out_dir={_q(tmp_path / 'ft')}",
                           "--set", "train.steps=3", "--resume")
    assert code == 0, err  # its checkpoint's config holds the pad id: resumed as it is
    model = load_model(tmp_path / "ft").eval()
    tok = load_tokenizer(find_checkpoint(tmp_path / "ft"))
    assert model.config.pad_id == tok.pad_id  # None for the char LM's tokenizer, which has no pad
    if tok.pad_id is None:
        return
    a, b = tok.encode("the good cat"), tok.encode("the bad")
    with torch.no_grad():
        batched = model(torch.tensor([a, b + [tok.pad_id] * (len(a) - len(b))])).logits[1]
        alone = model(torch.tensor([b])).logits[0]
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


def test_a_fine_tune_resumed_without_its_model_settings_keeps_them_in_run_json(capsys, tmp_path):
    # Resumed without --set model.pooling=last, the run went on with its checkpoint's pooling (rightly), but
    # run.json, the run's settings, then read as the pretrained run's mean pooling.
    import json

    docs, table = tmp_path / "docs.txt", tmp_path / "cls.tsv"
    docs.write_text("the good cat sat\nthe bad dog ran\n" * 40, encoding="utf-8")
    table.write_text("text\tlabel\n" + "the good cat\t1\nthe bad dog\t0\n" * 10, encoding="utf-8")
    assert run_cli(capsys, "train", *M, *T, "--set", "model.head=lm", "--set", "data.block_size=8", "--set",
                   "data.tokenizer=word", "--set", f"data.path={_q(docs)}",
                   "--set", f"train.out_dir={_q(tmp_path / 'lm')}")[0] == 0
    fine_tune = [*T, "--set", f"model.init_from={_q(tmp_path / 'lm')}", "--set", "data.task=classification",
                 "--set", f"data.path={_q(table)}", "--set", f"train.out_dir={_q(tmp_path / 'ft')}"]
    assert run_cli(capsys, "train", *fine_tune, "--set", "model.pooling=last", "--set", "model.causal=false")[0] == 0
    before = json.loads((tmp_path / "ft" / "run.json").read_text())["model"]
    assert before["pooling"] == "last" and before["causal"] is False
    code, _, err = run_cli(capsys, "train", *fine_tune, "--set", "train.steps=3", "--resume")
    assert code == 0, err
    assert json.loads((tmp_path / "ft" / "run.json").read_text())["model"] == before
    assert load_model(tmp_path / "ft").config.pooling == "last"
    # init_from spelt another way (a trailing slash): the resume continues the checkpoint all the same, and run.json
    # had lost the settings (mutation audit 11); it keeps the spelling the run started with, without a warning
    respelt = [*fine_tune, "--set", f"model.init_from={_q(str(tmp_path / 'lm') + '/')}"]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*is not the run this one started from")
        assert run_cli(capsys, "train", *respelt, "--set", "train.steps=4", "--resume")[0] == 0
    assert json.loads((tmp_path / "ft" / "run.json").read_text())["model"] == before


@pytest.mark.parametrize(("norm", "given"), [("post", "true"), ("pre", "false")])
def test_a_final_norm_other_than_the_pretrained_models_is_named(capsys, tmp_path, norm, given):
    # final_norm left to its default is saved as null: the change was refused later, for a weight the checkpoint
    # lacks or holds ("encoder.norm.weight"), without naming the setting.
    from cli_helpers import one_line_error

    docs, table = tmp_path / "docs.txt", tmp_path / "cls.tsv"
    docs.write_text("the good cat sat\nthe bad dog ran\n" * 40, encoding="utf-8")
    table.write_text("text\tlabel\n" + "the good cat\t1\nthe bad dog\t0\n" * 10, encoding="utf-8")
    assert run_cli(capsys, "train", *M, *T, "--set", f"model.norm={_q(norm)}", "--set", "model.head=lm", "--set",
                   "data.block_size=8", "--set", "data.tokenizer=word", "--set", f"data.path={_q(docs)}",
                   "--set", f"train.out_dir={_q(tmp_path / 'lm')}")[0] == 0
    line = one_line_error(capsys, "train", *T, "--set", f"model.init_from={_q(tmp_path / 'lm')}", "--set",
                          f"model.final_norm={given}", "--set", "data.task=classification", "--set",
                          f"data.path={_q(table)}", "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    trained = "True" if norm == "pre" else "False"
    assert f"model.final_norm = {given.title()}, but the model in model.init_from was trained with {trained}, which " \
           "its weights keep; drop model.final_norm" in line, line
    # restating what it was trained with is no change
    assert run_cli(capsys, "train", *T, "--set", f"model.init_from={_q(tmp_path / 'lm')}", "--set",
                   f"model.final_norm={trained.lower()}", "--set", "data.task=classification", "--set",
                   f"data.path={_q(table)}", "--set", f"train.out_dir={_q(tmp_path / 'ft')}")[0] == 0
