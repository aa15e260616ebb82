"""A BERT with a segment table of one row (HF `type_vocab_size: 1`, converted exactly) cannot read the sentence
pairs of pre-training: `evaluate` said "token_type_ids must lie in 0 to 0 ... give each token its segment's
number" for a text file, and continued pre-training advised to set type_vocab_size to 2, which init_from then
refused."""

from __future__ import annotations

import torch
from cli_helpers import run_cli
from cli_helpers import toml_str as _q

from attnlab.data.tokenizers import WordTokenizer
from attnlab.models.bert import BertConfig, BertModel
from attnlab.training.checkpoint import save_checkpoint

DOCS = "\n\n".join(f"the cat {i} sat .\nthe dog {i} ran ." for i in range(6)) + "\n"


def test_a_single_segment_bert_is_refused_for_sentence_pairs_in_one_line(tmp_path, capsys):
    docs = tmp_path / "docs.txt"
    docs.write_text(DOCS, encoding="utf-8")
    tokenizer = WordTokenizer.train([DOCS])
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                                 max_len=32, type_vocab_size=1, nsp=False, pad_id=tokenizer.pad_id))
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoint", model, tokenizer=tokenizer)
    code, _, err = run_cli(capsys, "evaluate", str(run), "--data", str(docs), "--device", "cpu")
    assert code == 2 and "a BERT of one segment (type_vocab_size 1" in err and "token_type_ids" not in err, err
    code, _, err = run_cli(capsys, "train", "--set", "data.task=mlm", "--set", f"model.init_from={_q(run)}",
                           "--set", f"data.path={_q(docs)}", "--set", "data.max_length=16",
                           "--set", "train.device=cpu", "--set", f"train.out_dir={_q(tmp_path / 'more')}")
    assert code == 2 and "model.init_from holds a BERT of one segment" in err, err
    assert 'fine-tune it on a task of one text (data.task = "classification")' in err
