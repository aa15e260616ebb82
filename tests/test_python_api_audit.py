"""Python API as a notebook user meets it (stop-41 audit): pickling, a config reused after building a model,
Trainer.evaluate's mode, a second fit on one Trainer, labels given to a BERT without heads."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from training_helpers import ToySource, tiny_model

from attnlab.errors import ConfigError
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.encoder import EncoderConfig, EncoderModel
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig
from attnlab.training import Trainer, TrainerConfig, TrainingInterrupted


def small_gpt(**changes) -> GPTConfig:
    return GPTConfig(**{**dict(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=1), **changes})


def test_a_model_with_gelu_tanh_pickles():
    # The activation was a lambda: torch.save(model) and pickle failed for gpt2-small and every converted GPT-2.
    torch.manual_seed(0)
    model = GPT(small_gpt(activation="gelu-tanh")).eval()
    again = pickle.loads(pickle.dumps(model))
    ids = torch.randint(0, 11, (2, 5))
    assert torch.equal(model(ids).logits, again(ids).logits)


@pytest.mark.parametrize("family", ["gpt", "encoder", "bert", "seq2seq"])
def test_a_config_changed_after_building_a_model_does_not_change_that_model(family):
    # Models kept the caller's object: cfg.activation = "relu" to build a twin made the first model's config say
    # relu while it ran gelu (and a checkpoint of it reloaded as another function); an encoder read config.causal
    # at every forward, so changing it changed the first model's logits.
    sizes = dict(d_model=16, n_heads=2, activation="gelu")
    config = {"gpt": lambda: GPTConfig(vocab_size=11, block_size=8, n_layers=1, **sizes),
              "encoder": lambda: EncoderConfig(vocab_size=11, max_len=8, n_layers=1, **sizes),
              "bert": lambda: BertConfig(vocab_size=11, max_len=8, n_layers=1, heads="none", **sizes),
              "seq2seq": lambda: TransformerConfig(src_vocab_size=11, tgt_vocab_size=11, max_len=8,
                                                   n_encoder_layers=1, n_decoder_layers=1, **sizes)}[family]()
    model = {"gpt": GPT, "encoder": EncoderModel, "bert": BertModel, "seq2seq": Seq2SeqTransformer}[family](config)
    before = model.config.to_dict()
    config.activation = "relu"
    if family == "encoder":
        config.causal = not config.causal
    assert model.config.to_dict() == before and model.config is not config


def test_evaluate_gives_the_model_back_in_the_mode_it_found(tmp_path):
    # It left the model in train mode whatever it found: a model put in eval() then evaluated ran with dropout on.
    model = tiny_model()
    trainer = Trainer(model, TrainerConfig(steps=1, batch_size=8, device="cpu", precision="fp32", progress=False),
                      ToySource(), eval_source=ToySource(seed=3), out_dir=tmp_path / "run")
    model.eval()
    assert "loss" in trainer.evaluate() and not model.training
    model.train()
    trainer.evaluate()
    assert model.training


def test_a_second_fit_on_one_trainer_is_refused_unless_it_resumes(tmp_path):
    # A second fit() took the trainer's own run for one to replace: it set the run's metrics.jsonl aside, restarted
    # it and deleted loss.png, while training on from the step and weights the first call left.
    run = tmp_path / "run"

    class Interrupting(ToySource):
        hit = False

        def batch(self, step):
            if step == 3 and not Interrupting.hit:
                Interrupting.hit = True
                raise KeyboardInterrupt
            return super().batch(step)

    settings = dict(steps=6, batch_size=8, device="cpu", precision="fp32", progress=False, log_every=1)
    trainer = Trainer(tiny_model(), TrainerConfig(**settings), Interrupting(), out_dir=run)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    with pytest.raises(ConfigError, match=r"this Trainer has trained already \(to step 3 of 6\); call "
                                          r"fit\(resume=True\) to go on from its checkpoint in .*or build a new"):
        trainer.fit()
    assert trainer.fit(resume=True)["steps"] == 6
    logged = [json.loads(line).get("step") for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [step for step in logged if step is not None] == [1, 2, 3, 4, 5, 6]
    assert (run / "loss.png").is_file()
    with pytest.raises(ConfigError, match="this Trainer has trained already"):  # a finished one too
        trainer.fit()
    assert (run / "loss.png").is_file() and (run / "metrics.jsonl").read_text().count("\n") == len(logged)


def test_labels_given_to_a_bert_without_heads_are_refused():
    # heads="none" returned loss None for labels, which a training loop could take for nothing to learn.
    model = BertModel(BertConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, max_len=8, heads="none"))
    ids = torch.randint(0, 11, (2, 5))
    assert model(ids).loss is None
    with pytest.raises(ConfigError, match="labels were given to a BertModel without heads"):
        model(ids, labels=ids)
