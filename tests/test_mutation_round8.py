"""Round-8 mutation tests (stop 43): changes to stop 42's code that the suite did not catch. Each test names the
mutant it kills: knowledge's Ctrl-C and resume warnings, the short training text beside an evaluation file, the
classification tables' renaming and quoting hints, and the precision names. (Evaluate's column hint with the flags
given is tested in test_table_files_audit5.py, beside the run it trains.)"""

from __future__ import annotations

import json
import types
import unicodedata
import warnings

import pytest
import torch
from cli_helpers import run_cli

import attnlab.experiments.knowledge as knowledge
from attnlab.data.knowledge import qa_prompt
from attnlab.data.text_files import _split_alike, read_classification_file
from attnlab.errors import DataError
from attnlab.training import device
from attnlab.training.recipe import load_run_config, prepare


def test_precision_names():  # D05: fp16 (CUDA only) was named fp32 and no CPU test saw it
    assert [device.precision_name(d) for d in (torch.bfloat16, torch.float16, None)] == ["bf16", "fp16", "fp32"]


def test_a_short_training_text_beside_an_eval_file_is_the_training_texts_fault(tmp_path):
    text, dev = tmp_path / "short.txt", tmp_path / "dev.txt"
    text.write_text("a" * 20 + "\n", encoding="utf-8")  # 21 characters: gpt-char-tiny's window is 33
    dev.write_text("abcdefghij" * 10 + "\n", encoding="utf-8")
    run = load_run_config(None, ["model.preset=gpt-char-tiny", f"data.path={json.dumps(str(text))}",
                                 f"data.eval_path={json.dumps(str(dev))}", "train.device=cpu",
                                 f"train.out_dir={json.dumps(str(tmp_path / 'run'))}"])
    with pytest.raises(DataError, match=r"^the training text has 21 tokens, fewer than one window of 33; give a "
                                        r"longer text or a smaller data.block_size$"):
        prepare(run)


def test_ctrl_c_with_only_an_empty_phase_folder_says_nothing_was_kept(capsys, tmp_path, monkeypatch):
    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(knowledge, "make_world", pressed)
    out = tmp_path / "k"
    (out / "finetune-none").mkdir(parents=True)  # a phase folder that never got a checkpoint
    code, _, err = run_cli(capsys, "run", "knowledge", "--out", str(out), "--device", "cpu", "--quiet", "--resume")
    assert code == 130
    assert err.strip().splitlines()[-1] == "attnlab: interrupted before any phase was trained; nothing was kept", err


NFC, NFD = "Zoë Ünal", unicodedata.normalize("NFD", "Zoë Ünal")


def _said(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args)
    return [str(w.message) for w in caught]


def test_a_decomposed_corpus_beside_composed_pairs_is_warned_of():  # K01
    said = _said(knowledge._warn_other_normal_form, [f"{NFD} is a poet ."], [("Where was Ada born?", "Lyon")])
    assert len(said) == 1 and said[0].startswith("the corpus is written in decomposed Unicode"), said


def test_files_all_decomposed_say_nothing():  # K02
    assert _said(knowledge._warn_other_normal_form, [f"{NFD} is a poet ."], [(f"Where was {NFD} born?", "Oslo")]) == []


def test_a_composed_question_beside_a_decomposed_corpus_gets_the_nfd_hint():  # K03
    vocab = types.SimpleNamespace(stoi={c: i for i, c in enumerate(set(qa_prompt(f"Where was {NFD} born?")))})
    said = _said(knowledge._unreadable, vocab, [f"Where was {NFC} born?"], "evaluation questions")
    assert len(said) == 1 and said[0].endswith("in Unicode form NFD it is readable: save every file in one form "
                                               "(e.g. all NFC)"), said


def test_a_phase_whose_state_names_no_precision_is_not_warned_of(tmp_path):  # K05
    folder = tmp_path / "finetune-none"
    assert _said(knowledge._warn_other_precision, folder, None, {"precision": "auto", "device": "cpu"}) == []


def test_the_resume_check_does_not_repeat_the_slow_precision_warning(tmp_path, monkeypatch):  # K08
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: False)
    folder = tmp_path / "finetune-none"
    assert _said(knowledge._warn_other_precision, folder, "bf16", {"precision": "bf16", "device": "cpu"}) == []


def test_split_alike_reads_only_the_first_five_rows():  # T02
    text = "".join(f"a,{i}\n" for i in range(5)) + "one, two, three\n"
    assert _split_alike(text, ",")


def test_split_alike_reads_commas_as_csv():  # T03: a quoted comma keeps the row at two cells
    assert _split_alike('"great, really",1\ndull,0\n', ",")


def test_split_alike_is_false_where_csv_refuses_a_row():  # T04: a field past csv's limit
    assert not _split_alike("x" * 200_000 + "\n", ",")


def test_triple_quotes_inside_a_glue_text_are_not_warned_of(tmp_path, recwarn):  # T05
    path = tmp_path / "glue.tsv"
    path.write_text('sentence\tlabel\nx """y""" z\t1\ndull\t0\n')
    read_classification_file(path)
    assert not [w for w in recwarn if "looks quoted" in str(w.message)]


def test_a_quoted_cell_with_spaces_around_it_is_warned_of(tmp_path):  # T06
    path = tmp_path / "q.tsv"
    path.write_text('label\tsentence\n1\t "a ""b"" c" \n0\tdull\n')
    with pytest.warns(UserWarning, match="looks quoted"):
        read_classification_file(path)


def test_a_short_row_with_a_bare_quote_inside_keeps_the_plain_fix(tmp_path):  # T07
    path = tmp_path / "a.tsv"
    path.write_text('sentence\tlabel\ngreat\t1\nhe said "no to it\n')
    with pytest.raises(DataError, match=r"found 1; fix the line$"):
        read_classification_file(path)


def test_a_short_row_with_a_closed_quote_keeps_the_plain_fix(tmp_path):  # T08
    path = tmp_path / "a.tsv"
    path.write_text('sentence\tlabel\ngreat\t1\n"no" he said\n')
    with pytest.raises(DataError, match=r"found 1; fix the line$"):
        read_classification_file(path)


def test_a_label_column_past_a_headerless_pair_is_named(tmp_path):  # T09
    path = tmp_path / "pair.tsv"
    path.write_text("great movie\t1\ndull film\t0\n")
    with pytest.raises(DataError, match=r"label column 5 does not exist"):
        read_classification_file(path, None, 5)


def test_a_header_text_column_naming_the_label_column_gets_the_text_fix(tmp_path):  # T10
    path = tmp_path / "h.tsv"
    path.write_text("sentence\tlabel\ngreat\t1\ndull\t0\n")
    with pytest.raises(DataError, match=r"are the same \('label'\).*set data.text_column"):
        read_classification_file(path, "label")


def test_a_two_column_tsv_with_commas_is_not_told_to_be_renamed(tmp_path):  # T11
    path = tmp_path / "pair.tsv"
    path.write_text("great, movie\t1\ndull, film\t0\n")
    with pytest.raises(DataError, match=r"label column 3 does not exist, the row has 2 tab-separated"):
        read_classification_file(path, 0, 3)


def test_a_short_csv_row_is_not_given_the_tsv_quoting_hint(tmp_path):  # T13
    path = tmp_path / "a.csv"
    path.write_text('sentence,label\ngreat,1\n"""no",1\n"""x"\n')
    with pytest.raises(DataError) as info:
        read_classification_file(path)
    assert ".tsv file is read without quoting" not in str(info.value), info.value
