"""Fifth knowledge audit: a question spelt in another Unicode normal form than the corpus (decomposed accents, as
files made on macOS have) was warned of with a question that looked exactly like the corpus's text; a Ctrl-C before
any phase trained said that what was trained is kept and to go on with --resume, where nothing was kept."""

from __future__ import annotations

import unicodedata
import warnings

from cli_helpers import run_cli

import attnlab.experiments.knowledge as knowledge
from attnlab.experiments.knowledge import run_knowledge

TINY = {"n_layers": 1, "n_heads": 2, "d_model": 32, "block_size": 64, "finetune_batch": 8,
        "finetune_epochs_scratch": 1, "precision": "fp32"}


def _files(tmp_path, name_in_dev: str):
    (tmp_path / "wiki.txt").write_text("Zoë Ünal. Zoë Ünal is a poet born in Oslo .\nAda Varn. Ada Varn is a cook born "
                                       "in Lyon .\nBo Tesk. Bo Tesk was born in Porto .\n", encoding="utf-8")
    (tmp_path / "train.tsv").write_text("Where was Ada Varn born?\tLyon\nWhere was Bo Tesk born?\tPorto\n",
                                        encoding="utf-8")
    (tmp_path / "dev.tsv").write_text(f"Where was {name_in_dev} born?\tOslo\n", encoding="utf-8")
    return dict(corpus=str(tmp_path / "wiki.txt"), train=str(tmp_path / "train.tsv"),
                eval_path=str(tmp_path / "dev.tsv"))


def _unreadable_warnings(tmp_path, name_in_dev: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_knowledge(tmp_path / "out", variants="none", **_files(tmp_path, name_in_dev), device="cpu",
                      overrides=TINY, progress=False, echo=lambda *_: None)
    return [str(w.message) for w in caught if "cannot read" in str(w.message)]


def test_a_question_in_another_normal_form_names_its_character_and_the_fix(tmp_path):
    said = _unreadable_warnings(tmp_path, unicodedata.normalize("NFD", "Zoë Ünal"))
    assert said == ["1 of 1 evaluation questions hold characters that neither the corpus nor the fine-tuning pairs "
                    "have (the first: 'Where was Zoe\u0308 U\u0308nal born?', with '\u0308' U+0308); the model cannot "
                    "read them, and their answers are left empty; in Unicode form NFC it is readable: save every file "
                    "in one form (e.g. all NFC)"], said


def test_a_character_no_form_can_read_gets_no_normal_form_hint(tmp_path):
    said = _unreadable_warnings(tmp_path, "Zoë Ünal Xu")  # 'X' is in no file the vocabulary is built from
    assert len(said) == 1 and "with 'X' U+0058); the model cannot read them, and their answers are left empty" in \
        said[0] and "Unicode form" not in said[0], said


def test_ctrl_c_before_any_phase_trained_says_nothing_was_kept(capsys, tmp_path, monkeypatch):
    def pressed(*args, **kwargs):  # while the data is read
        raise KeyboardInterrupt

    monkeypatch.setattr(knowledge, "make_world", pressed)
    out = tmp_path / "k"
    code, _, err = run_cli(capsys, "run", "knowledge", "--out", str(out), "--device", "cpu", "--quiet")
    assert code == 130
    assert err.strip().splitlines()[-1] == "attnlab: interrupted before any phase was trained; nothing was kept", err
    assert not out.exists()


def test_ctrl_c_after_a_phase_trained_says_to_resume(capsys, tmp_path, monkeypatch):
    files = _files(tmp_path, "Zoë Ünal")

    def pressed(*args, **kwargs):  # answering, after the phase trained
        raise KeyboardInterrupt

    monkeypatch.setattr(knowledge, "answer_questions", pressed)
    out = tmp_path / "k"
    args = ["--corpus", files["corpus"], "--train", files["train"], "--eval", files["eval_path"]]
    sets = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}" if key != "precision"
                                                            else 'precision="fp32"')]
    code, _, err = run_cli(capsys, "run", "knowledge", "--out", str(out), "--device", "cpu", "--quiet",
                           "--variants", "none", *args, *sets)
    assert code == 130, err
    assert err.strip().splitlines()[-1] == (f"attnlab: interrupted; what was trained is kept in {out}: to go on, run "
                                            "the same command with --resume"), err


def test_fine_tuning_pairs_in_another_normal_form_than_the_corpus_are_warned_of(tmp_path):
    # decomposed accents in the fine-tuning file, composed ones in the corpus: no question is unreadable (the combining
    # mark joins the vocabulary), but fine-tuning spells the names with characters the corpus never uses
    files = _files(tmp_path, "Ada Varn")
    nfd = unicodedata.normalize("NFD", "Zoë Ünal")
    (tmp_path / "train.tsv").write_text(f"Where was Ada Varn born?\tLyon\nWhere was {nfd} born?\tOslo\n",
                                        encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_knowledge(tmp_path / "out", variants="none", **files, device="cpu", overrides=TINY, progress=False,
                      echo=lambda *_: None)
    said = [str(w.message) for w in caught if "Unicode" in str(w.message)]
    assert said == [f"1 of 2 fine-tuning pairs are written in decomposed Unicode (the first: "
                    f"{'Where was ' + nfd + ' born?' + chr(9) + 'Oslo'!r}), the corpus composed: their accented names "
                    "are spelt with other characters, so fine-tuning cannot reach what pretraining stored of them; "
                    "save every file in one form (e.g. all NFC)"], said


def test_files_in_one_normal_form_say_nothing_of_it(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_knowledge(tmp_path / "out", variants="none", **_files(tmp_path, "Zoë Ünal"), device="cpu",
                      overrides=TINY, progress=False, echo=lambda *_: None)
    assert not [w for w in caught if "Unicode" in str(w.message)]
