"""The trainer's invariants on the real model families (test_trainer.py proves them on a tiny stand-in):
gradients accumulated over micro-batches equal the large-batch gradient on padded batches, and a run
interrupted by Ctrl-C and resumed ends bit for bit where the uninterrupted run does, dropout included."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.encoder import EncoderConfig, EncoderModel
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig
from attnlab.training import Trainer, TrainerConfig, TrainingInterrupted

B, T, V = 8, 7, 20


def _batches() -> dict[str, dict[str, torch.Tensor]]:
    """Right-padded rows of different lengths; LM labels -100 on padding (and the first two positions),
    MLM labels on ~40 % of the real tokens."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(3, V, (B, T), generator=g).masked_fill(mask == 0, 0)
    lm = ids.masked_fill(mask == 0, -100)
    lm[:, :2] = -100
    mlm = torch.full((B, T), -100)
    picked = (torch.rand(B, T, generator=g) < 0.4) & (mask == 1)
    mlm[picked] = ids[picked]
    classes = torch.randint(0, 2, (B,), generator=g)
    return {
        "gpt": dict(input_ids=ids, attention_mask=mask, labels=lm),
        "encoder-lm": dict(input_ids=ids, attention_mask=mask, labels=lm),
        "encoder-classification": dict(input_ids=ids, attention_mask=mask, labels=classes),
        "bert-mlm": dict(input_ids=ids, attention_mask=mask, labels=mlm),
        # Masked LM + next sentence: two means over different targets (masked tokens, sentence pairs).
        "bert-nsp": dict(input_ids=ids, attention_mask=mask, labels=mlm,
                         next_sentence_label=torch.randint(0, 2, (B,), generator=g)),
        "seq2seq": dict(src_ids=ids, src_mask=mask, tgt_ids=ids, labels=lm),
    }


def _model(name: str, dropout: float = 0.0):
    if name == "gpt":
        return GPT(GPTConfig(vocab_size=V, block_size=T, d_model=16, n_heads=2, n_layers=2, dropout=dropout,
                             attention_dropout=dropout))
    if name.startswith("encoder"):
        head = name.split("-", 1)[1]
        return EncoderModel(EncoderConfig(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=dropout,
                                          head=head))
    if name.startswith("bert"):
        return BertModel(BertConfig(vocab_size=V, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16,
                                    dropout=dropout, attention_dropout=dropout, nsp=name == "bert-nsp"))
    return Seq2SeqTransformer(TransformerConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=16, n_heads=2, d_ff=32,
                                                n_encoder_layers=1, n_decoder_layers=1, dropout=dropout, max_len=16))


class OneBatch:
    """The same global batch at every step (and as the evaluation split); Ctrl-C once at `interrupt_at`."""

    steps_per_epoch = None

    def __init__(self, batch, interrupt_at: int | None = None):
        self.data, self.interrupt_at = batch, interrupt_at

    def batch(self, step):
        if step == self.interrupt_at:
            self.interrupt_at = None
            raise KeyboardInterrupt
        return self.data

    def iter_batches(self, batch_size):
        yield self.data


def _config(**changes) -> TrainerConfig:
    settings = dict(steps=2, batch_size=B, micro_batch_size=2, lr=1e-2, warmup_steps=1, precision="fp32",
                    device="cpu", progress=False, log_every=1)
    return TrainerConfig(**{**settings, **changes})


@pytest.mark.parametrize("name", list(_batches()))
def test_accumulated_gradient_equals_the_large_batch_gradient(tmp_path, name):
    batch = _batches()[name]
    torch.manual_seed(0)
    model = _model(name)
    reference = copy.deepcopy(model)
    trainer = Trainer(model, _config(), OneBatch(batch), out_dir=tmp_path)
    trainer.optimizer.zero_grad()
    trainer.backward(batch)  # four micro-batches of two rows, each with its own number of targets
    reference(**batch).loss.backward()
    scale = max(float(p.grad.abs().max()) for p in reference.parameters() if p.grad is not None)
    for (key, got), want in zip(model.named_parameters(), reference.parameters()):
        if want.grad is None:
            assert got.grad is None, key
            continue
        torch.testing.assert_close(got.grad / scale, want.grad / scale, atol=1e-5, rtol=0, msg=key)


@pytest.mark.parametrize("name", list(_batches()))
def test_evaluation_loss_does_not_depend_on_the_batch_size(tmp_path, name):
    """The evaluation loss is the split's, whatever its batches: BERT's next-sentence term is a mean over
    sentence pairs, not over masked tokens."""
    from attnlab.training.recipe import evaluate_batches

    batch = _batches()[name]
    torch.manual_seed(0)
    model = _model(name).eval()
    rows = [{k: v[i:i + 1] for k, v in batch.items()} for i in range(B)]
    one = evaluate_batches(model, [batch])[0]["loss"]
    torch.testing.assert_close(evaluate_batches(model, rows)[0]["loss"], one, atol=1e-6, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).loss.item(), one, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["gpt", "seq2seq"])
def test_interrupted_and_resumed_equals_uninterrupted_with_dropout(tmp_path, name):
    batch = _batches()[name]
    config = _config(steps=4, micro_batch_size=4, seed=3)

    def fresh():
        torch.manual_seed(0)
        return _model(name, dropout=0.2)

    whole = Trainer(fresh(), config, OneBatch(batch), out_dir=tmp_path / "whole")
    whole.fit()
    with pytest.raises(TrainingInterrupted):
        Trainer(fresh(), config, OneBatch(batch, interrupt_at=2), out_dir=tmp_path / "parts").fit()
    torch.manual_seed(999)  # the resumed run restores its own random state
    resumed = Trainer(fresh(), config, OneBatch(batch), out_dir=tmp_path / "parts", resume=True)
    assert resumed.fit()["start_step"] == 2
    for key, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key


@pytest.mark.filterwarnings("ignore:.*without bf16")
def test_interrupted_and_resumed_equals_uninterrupted_in_bf16(tmp_path):
    """bf16 autocast without dropout: attention takes the blocked half-precision path (`_BlockedAttention`,
    scratch buffers kept between calls); a run stopped and resumed still ends bit for bit where the
    uninterrupted one does."""
    import attnlab.modules.attention as core

    batch = {k: v for k, v in _batches()["gpt"].items() if k != "attention_mask"}  # no mask: the blocked path
    config = _config(steps=4, micro_batch_size=4, seed=3, precision="bf16")
    taken = []
    real_apply = core._BlockedAttention.apply

    def fresh():
        torch.manual_seed(0)
        return _model("gpt", dropout=0.0)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core._BlockedAttention, "apply", lambda *a: taken.append(1) or real_apply(*a))
        whole = Trainer(fresh(), config, OneBatch(batch), out_dir=tmp_path / "whole")
        whole.fit()
    assert taken
    with pytest.raises(TrainingInterrupted):
        Trainer(fresh(), config, OneBatch(batch, interrupt_at=2), out_dir=tmp_path / "parts").fit()
    resumed = Trainer(fresh(), config, OneBatch(batch), out_dir=tmp_path / "parts", resume=True)
    assert resumed.fit()["start_step"] == 2
    for key, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key
