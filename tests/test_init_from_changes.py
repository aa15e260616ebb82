"""Model settings given beside model.init_from: those that change what the pretrained weights compute were taken
silently (another head count or activation: logits off before the first step; a pad id on [CLS]: a run whose own
tokenizer then did not fit it; no position scheme or segment table: pretrained weights dropped). Only the heads,
the mask and what any checkpoint may load into (dropout, the context length) may change."""

from __future__ import annotations

import pytest
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
        "--set", "train.steps=2", "--set", "train.eval_every=0", "--set", "train.warmup_steps=1",
        "--set", "data.val_fraction=0"]  # TINY[:10]: without the last, for a task that reads no val_fraction
SMALL = ["--set", "model.d_model=16", "--set", "model.n_heads=2", "--set", "model.n_layers=1", "--set",
         "model.d_ff=32", "--set", "data.vocab_size=200"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("init_from") / "bert"

    class Capsys:  # run_cli reads a capsys; a module-wide fixture has none
        def readouterr(self):
            class Out:
                out = err = ""
            return Out()

    code, _, err = run_cli(Capsys(), "train", "configs/bert-mlm.toml", *SMALL, *TINY,
                           "--set", f"train.out_dir={_q(folder)}")
    assert code == 0, err
    return folder


@pytest.mark.parametrize("setting, says", [
    ("model.n_heads=4", "model.n_heads = 4, but the model in model.init_from was trained with 2"),
    ("model.activation=\"relu\"", "model.activation = 'relu', but"),
    ("model.position=\"none\"", "model.position = 'none', but"),
    ("model.type_vocab_size=0", "model.type_vocab_size = 0, but"),
    ("model.pad_id=3", "model.pad_id = 3, but"),
    ("model.layer_norm_eps=0.001", "model.layer_norm_eps = 0.001, but"),
])
def test_a_setting_that_changes_the_pretrained_function_is_refused(pretrained, capsys, tmp_path, setting, says):
    line = one_line_error(capsys, "train", "configs/bert-mlm.toml", "--set", f"model.init_from={_q(pretrained)}",
                          "--set", setting, *TINY, "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert says in line and "which its weights keep; drop model." in line and "dropout" in line
    assert not (tmp_path / "ft" / "checkpoint").exists()


@pytest.mark.parametrize("settings", [["model.dropout=0.2"], ["model.nsp=false"],
                                      ["model.causal=true", "model.nsp=false"], ["model.n_heads=2"],
                                      ["model.max_len=64"]])
def test_the_heads_the_mask_and_regularisation_may_change(pretrained, capsys, tmp_path, settings):
    given = [item for setting in settings for item in ("--set", setting)]
    code, _, err = run_cli(capsys, "train", "configs/bert-mlm.toml", "--set", f"model.init_from={_q(pretrained)}",
                           *given, *TINY, "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert code == 0, err


def test_a_window_longer_than_a_pretrained_gpts_positions_says_to_shorten_the_window(capsys, tmp_path):
    # "raise the model's block_size" was the advice, which init_from then refused (the positions are weights).
    base = tmp_path / "gpt"
    code, _, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", *TINY,
                           "--set", f"train.out_dir={_q(base)}")
    assert code == 0, err
    line = one_line_error(capsys, "train", "--set", f"model.init_from={_q(base)}", "--set", "data.block_size=64",
                          *TINY, "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert line.endswith("is longer than the model's 32 positions; set data.block_size to at most 32"), line


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_a_file_given_for_a_run_folder_is_named_as_such(capsys, tmp_path, command):
    path = tmp_path / "cls.tsv"
    path.write_text("text\tlabel\ngood\t1\n", encoding="utf-8")
    args = (["train", "--set", f"model.init_from={_q(path)}", *TINY, "--set", f"train.out_dir={_q(tmp_path / 'ft')}"]
            if command == "train"
            else ["evaluate", str(path), "--data", str(path)])
    line = one_line_error(capsys, *args)
    assert f"{path} is a file; give a run folder" in line, line


@pytest.mark.parametrize("labels, kept", [(("0", "1"), True), (("zebra", "apple"), False)])
def test_a_classifier_without_class_names_keeps_its_head_only_for_the_numbers(pretrained, tmp_path, labels, kept):
    # Matched as `evaluate` matches it (label i is output i): any two names were mapped onto its outputs, and
    # evaluate then refused those very labels on it.
    import torch

    from attnlab.data.tokenizers import load_tokenizer
    from attnlab.models.bert import BertModel
    from attnlab.training import save_checkpoint
    from attnlab.training.checkpoint import load_model
    from attnlab.training.recipe import load_run_config, prepare

    classifier = BertModel(load_model(pretrained).config.replace(heads="classification", n_classes=2))
    with torch.no_grad():
        classifier.classifier.weight.fill_(0.5)
    save_checkpoint(tmp_path / "cls" / "checkpoint", classifier,
                    tokenizer=load_tokenizer(pretrained / "checkpoint"))  # no trainer state: no class names
    data = tmp_path / "data.tsv"
    data.write_text("text\tlabel\n" + "".join(f"story {i}\t{labels[i % 2]}\n" for i in range(8)), encoding="utf-8")
    prep = prepare(load_run_config(None, [f"model.init_from={_q(tmp_path / 'cls')}", "data.task=classification",
                                          f"data.path={_q(data)}", "data.max_length=16", "train.device=\"cpu\"",
                                          f"train.out_dir={_q(tmp_path / 'ft')}"]))
    assert bool((prep.model.classifier.weight == 0.5).all()) == kept


def test_a_setting_left_to_its_default_in_the_pretrained_run_may_be_written_out(capsys, tmp_path):
    # gpt-char-tiny keeps d_ff = None (4 × d_model, 128): writing the same width was refused as "trained with None".
    base = tmp_path / "gpt"
    assert run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", *TINY,
                   "--set", f"train.out_dir={_q(base)}")[0] == 0
    code, _, err = run_cli(capsys, "train", "--set", f"model.init_from={_q(base)}", "--set", "model.d_ff=128", *TINY,
                           "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert code == 0, err


def test_the_context_length_of_learned_positions_is_refused_with_the_data_fix(pretrained, capsys, tmp_path):
    # "may change: ... max_len" was listed, and then the weights did not load.
    line = one_line_error(capsys, "train", "configs/bert-mlm.toml", "--set", f"model.init_from={_q(pretrained)}",
                          "--set", "model.max_len=32", *TINY, "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert "model.max_len = 32, but the model in model.init_from was trained with 64" in line
    assert "positions are weights" in line and "max_len" not in line.split("may change:")[1]


def test_tokenizer_settings_beside_init_from_are_said_to_be_unused(pretrained, capsys, tmp_path):
    # run.json recorded them as the run's tokenizer while the pretrained one was used, without a word.
    import warnings

    args = ["train", "--set", f"model.init_from={_q(pretrained)}", "--set", "data.task=\"mlm\"", "--set",
            "data.max_length=64", *TINY]
    says = (r"data.tokenizer = 'bpe' and data.vocab_size = 500 are not used: the run keeps the tokenizer of "
            r"model.init_from, its weights' vocabulary \(wordpiece")
    with pytest.warns(UserWarning, match=says):
        assert run_cli(capsys, *args, "--set", "data.tokenizer=\"bpe\"", "--set", "data.vocab_size=500",
                       "--set", f"train.out_dir={_q(tmp_path / 'a')}")[0] == 0
    with warnings.catch_warnings(record=True) as caught:  # nothing given: nothing to say
        warnings.simplefilter("always")
        assert run_cli(capsys, *args, "--set", f"train.out_dir={_q(tmp_path / 'b')}")[0] == 0
    assert not [w for w in caught if "not used" in str(w.message)]


def test_a_pretrained_berts_positions_bound_the_data_not_the_model(pretrained, capsys, tmp_path):
    # "raise model.max_len" was the advice, which init_from refuses for learned positions.
    line = one_line_error(capsys, "train", "--set", f"model.init_from={_q(pretrained)}", "--set", "data.task=\"mlm\"",
                          *TINY, "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert line.endswith("data.max_length 128 is longer than the model's 64 positions; set data.max_length to at "
                         "most 64"), line


def test_a_pretrained_classifiers_learned_positions_bound_its_data(pretrained, capsys, tmp_path):
    data = tmp_path / "train.tsv"
    data.write_text("good film\t1\nbad film\t0\n" * 4, encoding="utf-8")
    line = one_line_error(capsys, "train", "--set", f"model.init_from={_q(pretrained)}", "--set",
                          "data.task=\"classification\"", "--set", f"data.path={_q(data)}", "--set",
                          "data.max_length=128", *TINY[:10], "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert line.endswith("data.max_length 128 is longer than the model's 64 positions; set data.max_length to at "
                         "most 64"), line


def test_a_pretrained_bert_with_rotary_positions_takes_longer_pairs(capsys, tmp_path):
    # Rotary positions hold no table: the max_len of the first run (16, from its data.max_length) bounds nothing,
    # and continued pre-training on longer pairs was refused ("set data.max_length to at most 16"; stop-39 audit).
    first = tmp_path / "first"
    code, _, err = run_cli(capsys, "train", "configs/bert-mlm.toml", *SMALL, *TINY, "--set",
                           "model.position=\"rotary\"", "--set", "data.max_length=16", "--set",
                           f"train.out_dir={_q(first)}")
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", "--set", f"model.init_from={_q(first)}", "--set", "data.task=\"mlm\"",
                           "--set", "data.max_length=32", *TINY, "--set", f"train.out_dir={_q(tmp_path / 'more')}")
    assert code == 0, err


def test_a_bert_too_short_for_its_pairs_is_refused_before_they_are_built(capsys, tmp_path, monkeypatch):
    # Since the length is checked on the built model, the pairs were built first (the corpus tokenised, with
    # warnings advising to raise data.max_length) and the refusal came after (stop-39 review).
    import attnlab.training.recipe as recipe

    monkeypatch.setattr(recipe, "sentence_pair_source", lambda *a, **k: pytest.fail("the pairs were built"))
    line = one_line_error(capsys, "train", "configs/bert-mlm.toml", *SMALL, *TINY, "--set", "model.max_len=16",
                          "--set", f"train.out_dir={_q(tmp_path / 'short')}")
    assert line.endswith("data.max_length 64 is longer than the model's 16 positions; lower data.max_length or raise "
                         "model.max_len"), line
