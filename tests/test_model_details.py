"""Model details the parity and invariance tests leave open: label smoothing in every family, the first
position past a table, a bidirectional bias for encoder classifiers, a float mask with causal on the
fused path, where each dropout sits, BERT's default segment and pad row, GPT's initialisation and
length checks with a cache, the uncached window past the block, eos stripped from translations."""


from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.inference.generate import generate, greedy_translate
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.common import SequenceTooLong, token_loss
from attnlab.models.encoder import EncoderConfig, EncoderModel
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig
from attnlab.modules.attention import attention, causal_mask
from attnlab.modules.blocks import EncoderLayer, LayerSpec
from attnlab.modules.feedforward import FeedForward
from attnlab.modules.positions import build_position, sinusoidal_table


def test_token_loss_applies_label_smoothing_over_real_targets():
    logits = torch.randn(2, 5, 7)
    labels = torch.randint(0, 7, (2, 5))
    labels[1, 3:] = -100
    loss, n = token_loss(logits, labels, label_smoothing=0.1)
    expected = F.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1), ignore_index=-100, label_smoothing=0.1)
    assert int(n) == 8
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("family", ["encoder", "seq2seq"])
def test_models_use_their_configured_label_smoothing_in_training_only(family):
    """Training minimises the smoothed loss; evaluation (eval mode) reports the true cross-entropy, so its
    perplexity is a perplexity."""
    torch.manual_seed(0)
    labels = torch.randint(3, 20, (2, 6))
    labels[0, 4:] = -100
    if family == "encoder":
        model = EncoderModel(EncoderConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0,
                                           label_smoothing=0.2))
        inputs = (torch.randint(3, 20, (2, 6)),)
    else:
        model = Seq2SeqTransformer(TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2,
                                                     d_ff=32, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
                                                     max_len=16, label_smoothing=0.2))
        inputs = (torch.randint(3, 20, (2, 5)), torch.randint(3, 20, (2, 6)))
    for training, smoothing in ((True, 0.2), (False, 0.0)):
        out = model.train(training)(*inputs, labels=labels)
        expected = F.cross_entropy(out.logits.reshape(-1, 20), labels.reshape(-1), ignore_index=-100,
                                   label_smoothing=smoothing)
        torch.testing.assert_close(out.loss, expected)


def test_the_first_position_past_the_tables_is_computed_not_indexed():
    sin = build_position("sinusoidal", d_model=8, n_heads=2, max_len=8, causal=True)
    pos = torch.tensor([[8]])  # == max_len: the first position the table lacks
    torch.testing.assert_close(sin.embed(torch.zeros(1, 1, 8), pos)[0], sinusoidal_table(pos[0], 8))
    short = build_position("rotary", d_model=8, n_heads=2, max_len=8, causal=True)
    long = build_position("rotary", d_model=8, n_heads=2, max_len=16, causal=True)
    for a, b in zip(short.angles_at(torch.tensor([8])), long.angles_at(torch.tensor([8]))):
        torch.testing.assert_close(a, b)


def test_a_classification_encoder_has_a_bidirectional_bias():
    def model(head):
        return EncoderModel(EncoderConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                                          position="t5-bias", head=head))
    assert model("classification").position.bidirectional
    assert not model("lm").position.bidirectional


def test_a_float_mask_with_causal_on_the_fused_path():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    float_mask = torch.randn(1, 1, 5, 5)
    fused, _ = attention(q, k, v, mask=float_mask, causal=True)
    explicit, _ = attention(q, k, v, mask=float_mask, causal=True, need_weights=True)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(8) + float_mask
    ref = torch.softmax(scores.masked_fill(~causal_mask(5), float("-inf")), -1) @ v
    torch.testing.assert_close(explicit, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=0)


def test_feedforward_dropout_is_on_the_hidden_activations():
    ff = FeedForward(8, 16, activation="relu", dropout=1.0).train()
    out = ff(torch.randn(3, 8))
    torch.testing.assert_close(out, ff.fc2.bias.expand(3, 8))  # every hidden unit dropped: only fc2's bias


def test_residual_dropout_drops_the_sublayer_output():
    spec = LayerSpec(d_model=8, n_heads=2, d_ff=16, dropout=1.0, norm="pre")
    layer = EncoderLayer(spec).train()
    x = torch.randn(2, 4, 8)
    out, _ = layer(x)
    torch.testing.assert_close(out, x)  # pre-norm: x + dropout(sublayer) = x


def test_bert_has_no_dropout_inside_the_feed_forward():
    model = BertModel(BertConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16, dropout=0.3))
    assert model.encoder.layers[0].ff.dropout.p == 0.0
    assert LayerSpec(d_model=8, n_heads=2, d_ff=16, dropout=0.3, ff_dropout=0.0).feedforward().dropout.p == 0.0


def test_bert_classifier_dropout_applies_to_the_pooled_state():
    """With every other dropout at 0, only the classifier's dropout can make two training passes differ."""
    model = BertModel(BertConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16,
                                 dropout=0.0, attention_dropout=0.0, heads="classification",
                                 classifier_dropout=0.5)).train()
    ids = torch.randint(1, 50, (3, 6))
    assert not torch.equal(model(ids).logits, model(ids).logits)
    model.eval()
    assert torch.equal(model(ids).logits, model(ids).logits)


def test_bert_without_token_type_ids_reads_segment_zero():
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16,
                                 heads="none")).eval()
    ids = torch.randint(1, 50, (2, 6))
    torch.testing.assert_close(model(ids).logits, model(ids, token_type_ids=torch.zeros_like(ids)).logits)


def test_bert_pad_row_starts_at_zero():
    model = BertModel(BertConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16, pad_id=3))
    assert (model.embeddings.token.weight[3] == 0).all()
    assert (model.embeddings.token.weight[4] != 0).any()


def test_gpt_init_uses_init_std_and_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, d_model=256, n_heads=4, n_layers=2, init_std=0.05))
    layer = model.blocks.layers[0]
    assert abs(float(layer.ff.fc1.weight.detach().std()) - 0.05) < 0.002
    for w in (layer.self_attn.out_proj.weight, layer.ff.fc2.weight):
        assert abs(float(w.detach().std()) - 0.05 / 2) < 0.002  # 1/sqrt(2 · n_layers)


@pytest.mark.parametrize("position, attention, table", [
    ("learned", "dot", lambda m: m.position.embedding.weight),
    ("relative", "dot", lambda m: m.position.embedding.weight),
    ("t5-bias", "dot", lambda m: m.position.embedding.weight),
    ("none", "synthesizer-random", lambda m: m.blocks.layers[0].self_attn.scores.table)])
def test_gpt_init_std_reaches_position_tables_and_random_scores(position, attention, table):
    """HF's initializer_range draws GPT-2's position table too; attnlab's tables stayed at 0.02 whatever init_std
    said. They are rescaled from the same draw, so the default init keeps every value it had."""
    def built(init_std):
        torch.manual_seed(0)
        return GPT(GPTConfig(vocab_size=50, block_size=64, d_model=64, n_heads=4, n_layers=1, position=position,
                             attention=attention, init_std=init_std))

    default, wide = table(built(0.02)).detach(), table(built(0.1)).detach()
    assert abs(float(default.std()) - 0.02) < 0.004 and abs(float(wide.std()) - 0.1) < 0.02
    torch.testing.assert_close(wide, default * 5)


def test_gpt_cache_past_a_bounded_model_is_a_clear_error():
    model = GPT(GPTConfig(vocab_size=31, block_size=24, d_model=16, n_heads=2, n_layers=2)).eval()
    cache = model.new_cache()
    model(torch.zeros(1, 20, dtype=torch.long), cache=cache)
    with pytest.raises(SequenceTooLong):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)


@torch.no_grad()
def test_uncached_generation_past_the_block_sees_exactly_the_last_block():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=31, block_size=8, d_model=16, n_heads=2, n_layers=2)).eval()
    for p in model.parameters():
        p.add_(0.3 * torch.randn_like(p))
    ids = torch.randint(0, 31, (1, 12))
    got = generate(model, ids, 6, greedy=True)
    for _ in range(6):
        ids = torch.cat([ids, model(ids[:, -8:]).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert got == [ids[0, 12:].tolist()]


def test_greedy_translate_drops_the_eos():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=16, n_heads=2, d_ff=32,
                                                 n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=16,
                                                 tie_output=False, output_bias=True)).eval()
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.bias.copy_(torch.tensor([0, 0, 1, 0, 0.5, 0, 0, 0.0]))  # eos (2) always wins
    assert greedy_translate(model, torch.randint(3, 8, (2, 4)), max_len=5) == [[], []]


@pytest.mark.parametrize("name, reference", [
    ("relu", F.relu), ("gelu", F.gelu), ("gelu-tanh", lambda x: F.gelu(x, approximate="tanh")), ("silu", F.silu)])
def test_each_activation_is_its_function(name, reference):
    # HF checkpoints name theirs (hidden_act "silu", "swish", "gelu_new"), and the converters map them onto these.
    from attnlab.modules.feedforward import ACTIVATIONS

    assert sorted(ACTIVATIONS.names()) == ["gelu", "gelu-tanh", "relu", "silu"]
    x = torch.linspace(-4, 4, 101, dtype=torch.float64)
    torch.testing.assert_close(ACTIVATIONS.get(name)(x), reference(x), rtol=0, atol=1e-12)
