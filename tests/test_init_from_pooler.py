"""A BERT saved without a pooler (HF's BertForMaskedLM or a BertModel without its pooling layer, converted; or
a run with model.pooler = false) fine-tuned with a head that reads the pooled [CLS] state: the new head brings a
new pooler, as a new head starts fresh. It was refused, told to leave model.pooler unset, which it was."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import toml_str as _q
from test_init_from import TINY, _classify, files  # noqa: F401  (a fixture)

from attnlab.data.tokenizers import load_tokenizer
from attnlab.training.checkpoint import find_checkpoint, load_model, save_checkpoint
from attnlab.training.recipe import load_run_config, prepare, train_run


@pytest.mark.parametrize("heads", ["pretraining", "none"])
def test_a_head_that_reads_the_pooler_brings_a_new_one(files, heads):  # noqa: F811
    name = f"bert-no-pooler-{heads}"
    source = files / name
    train_run(load_run_config(None, [
        "model.family=bert", "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.d_ff=32",
        "model.nsp=false", "model.pooler=false", "data.task=mlm", "data.tokenizer=word", "data.max_length=24",
        "data.val_fraction=0", f"data.path={_q(files / 'docs.txt')}", f"train.out_dir={_q(source)}", *TINY]))
    if heads == "none":  # a body alone without its pooler, as HF's BertModel(add_pooling_layer=False) converts
        body = load_model(source)
        bare = type(body)(body.config.replace(heads="none", pooler=False))
        bare.load_state_dict({k: v for k, v in body.state_dict().items() if k in bare.state_dict()})
        tokenizer = load_tokenizer(find_checkpoint(source) / "tokenizer.json")
        source = files / f"{name}-body"
        save_checkpoint(source, bare, tokenizer=tokenizer)
    pretrained = load_model(source)
    assert pretrained.pooler is None
    model = prepare(_classify(files, source)).model
    assert model.config.heads == "classification" and model.pooler is not None
    saved = pretrained.state_dict()
    for key, value in model.state_dict().items():
        if key.startswith(("embeddings.", "encoder.")):
            torch.testing.assert_close(value, saved[key], rtol=0, atol=0)
    # Continued pre-training with NSP: the same.
    more = load_run_config(None, [f"model.init_from={_q(source)}", "data.task=mlm", "model.nsp=true",
                                  f"data.path={_q(files / 'docs.txt')}", "data.max_length=24", "data.val_fraction=0",
                                  "train.device=cpu", f"train.out_dir={_q(files / (name + '-nsp'))}"])
    assert prepare(more).model.pooler is not None
