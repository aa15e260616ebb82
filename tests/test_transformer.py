"""The encoder-decoder Transformer against `torch.nn.Transformer` with copied weights (post- and
pre-norm, stacks alone and the full model), cached decoding against the full decode for every
variant x position pair, config validation, and the paper-size parameter count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import ConfigError
from attnlab.models.common import SequenceTooLong, length_limit, positions_from_mask, token_loss
from attnlab.models.registry import build_model, config_from_dict, config_to_dict, get_preset
from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig
from attnlab.modules.attention import MultiHeadAttention, key_mask, padding_mask_from_ids
from attnlab.modules.positions import POSITIONS, check_compatible, t5_bucket
from attnlab.modules.variants import VARIANTS

ATOL = 1e-5
# fp32 sums taken in another order (cache vs full, another CPU's BLAS kernels) differ by a few ulp of the
# value: on an AVX2 machine cached decoding differed from the full pass by 1.2e-5 on a logit of 1.4.
RTOL = 1e-5
D, H, FF, LAYERS, V = 16, 4, 32, 2, 32
POSITION_OPTIONS = {"relative": {"max_distance": 3}, "t5-bias": {"num_buckets": 8, "max_distance": 8}}


def tiny_config(variant: str = "dot", position: str = "sinusoidal", **overrides) -> TransformerConfig:
    fields = dict(
        src_vocab_size=V, tgt_vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_encoder_layers=LAYERS,
        n_decoder_layers=LAYERS, dropout=0.0, max_len=16, attention=variant, position=position,
        position_options=dict(POSITION_OPTIONS.get(position, {})),
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


# --------------------------------------------------------------------------------------------------
# Parity with torch.nn.Transformer
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def _copy_attention(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    q, k, v = ours.scores.q_proj, ours.scores.k_proj, ours.v_proj
    ref.in_proj_weight.copy_(torch.cat([q.weight, k.weight, v.weight]))  # packed (3D, D): q, k, v
    ref.in_proj_bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
    ref.out_proj.load_state_dict(ours.out_proj.state_dict())


def torch_twin(model: Seq2SeqTransformer) -> nn.Transformer:
    """nn.Transformer holding the weights of our encoder and decoder stacks."""
    c = model.config
    ref = nn.Transformer(c.d_model, c.n_heads, c.n_encoder_layers, c.n_decoder_layers, c.d_ff, dropout=0.0,
                         batch_first=True, norm_first=c.norm == "pre")
    for ours, theirs in zip(model.encoder.layers, ref.encoder.layers, strict=True):
        _copy_attention(ours.self_attn, theirs.self_attn)
        theirs.linear1.load_state_dict(ours.ff.fc1.state_dict())
        theirs.linear2.load_state_dict(ours.ff.fc2.state_dict())
        theirs.norm1.load_state_dict(ours.attn_block.norm.state_dict())
        theirs.norm2.load_state_dict(ours.ff_block.norm.state_dict())
    for ours, theirs in zip(model.decoder.layers, ref.decoder.layers, strict=True):
        _copy_attention(ours.self_attn, theirs.self_attn)
        _copy_attention(ours.cross_attn, theirs.multihead_attn)
        theirs.linear1.load_state_dict(ours.ff.fc1.state_dict())
        theirs.linear2.load_state_dict(ours.ff.fc2.state_dict())
        theirs.norm1.load_state_dict(ours.self_block.norm.state_dict())
        theirs.norm2.load_state_dict(ours.cross_block.norm.state_dict())
        theirs.norm3.load_state_dict(ours.ff_block.norm.state_dict())
    ref.encoder.norm.load_state_dict(model.encoder.norm.state_dict())
    ref.decoder.norm.load_state_dict(model.decoder.norm.state_dict())
    return ref.eval()


def _padded_ids(lengths: list[int], n: int) -> torch.Tensor:
    ids = torch.randint(3, V, (len(lengths), n))
    for b, length in enumerate(lengths):
        ids[b, length:] = 0
    return ids


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_stacks_match_torch_transformer(norm, perturb):
    model = perturb(Seq2SeqTransformer(tiny_config(norm=norm, final_norm=True, activation="relu")))
    ref = torch_twin(model)
    src, tgt = torch.randn(2, 9, D), torch.randn(2, 7, D)
    keep = torch.arange(9)[None, :] < torch.tensor([9, 6])[:, None]  # True = real source token
    memory, _, _ = model.encoder(src, mask=key_mask(keep))
    out, _, _, _ = model.decoder(tgt, memory, memory_mask=key_mask(keep))  # causal self-attention
    ref_memory = ref.encoder(src, src_key_padding_mask=~keep)  # torch: True = padding
    ref_out = ref(src, tgt, src_key_padding_mask=~keep, memory_key_padding_mask=~keep,
                  tgt_mask=nn.Transformer.generate_square_subsequent_mask(7), tgt_is_causal=True)
    torch.testing.assert_close(memory[keep], ref_memory[keep], atol=ATOL, rtol=0)
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=0)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_full_model_matches_torch_transformer_with_our_embeddings(norm, perturb):
    model = perturb(Seq2SeqTransformer(tiny_config(norm=norm, final_norm=True, activation="relu")))
    ref = torch_twin(model)
    src, tgt = _padded_ids([9, 5], 9), torch.randint(3, V, (2, 7))
    src_mask = padding_mask_from_ids(src, 0)
    logits = model(src, tgt, src_mask).logits

    x = model.src_embed(src, torch.arange(9)[None, :], model.src_position)  # scaled tokens + sinusoids
    y = model.tgt_embed(tgt, torch.arange(7)[None, :], model.tgt_position)
    hidden = ref(x, y, src_key_padding_mask=~src_mask, memory_key_padding_mask=~src_mask,
                 tgt_mask=nn.Transformer.generate_square_subsequent_mask(7), tgt_is_causal=True)
    torch.testing.assert_close(logits, model.lm_head(hidden), atol=ATOL, rtol=0)
    assert model.lm_head.weight is model.src_embed.token.weight  # shared and tied, as in the paper


# --------------------------------------------------------------------------------------------------
# Cached incremental decoding
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rotary", "t5-bias", "alibi", "relative"])
@pytest.mark.parametrize("variant", VARIANTS.names())
def test_cached_decoding_equals_full_decode(variant, position, perturb):
    try:
        check_compatible(variant, position)
    except ConfigError as e:
        pytest.skip(f"incompatible pair: {e}")
    model = perturb(Seq2SeqTransformer(tiny_config(variant, position)))
    src = _padded_ids([8, 5], 8)
    src_mask = padding_mask_from_ids(src, 0)
    tgt = torch.randint(3, V, (2, 10))
    memory, _, _ = model.encode(src, src_mask)
    full, _, _, _ = model.decode(tgt, memory, src_mask)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, i:i + 1], memory, src_mask, cache=cache)[0] for i in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=ATOL, rtol=RTOL)
    assert all(self_c.length == 10 and cross_c.ready for self_c, cross_c in cache)


@pytest.mark.parametrize("position", ["none", "sinusoidal", "learned", "rotary", "t5-bias", "alibi", "relative"])
@pytest.mark.parametrize("variant", VARIANTS.names())
def test_a_padded_source_reads_as_it_does_alone(variant, position, perturb):
    """Left or right padding of the source changes nothing for the real tokens: encoder positions count
    real tokens, as GPT's, the encoder's and BERT's do."""
    try:
        check_compatible(variant, position)
    except ConfigError as e:
        pytest.skip(f"incompatible pair: {e}")
    model = perturb(Seq2SeqTransformer(tiny_config(variant, position)))
    src, tgt = torch.randint(3, V, (1, 5)), torch.randint(3, V, (1, 6))
    alone = model(src, tgt).logits
    pad = torch.zeros(1, 3, dtype=torch.long)
    for padded, keep in ((torch.cat([pad, src], 1), [0, 0, 0, 1, 1, 1, 1, 1]),
                         (torch.cat([src, pad], 1), [1, 1, 1, 1, 1, 0, 0, 0])):
        out = model(padded, tgt, torch.tensor([keep])).logits
        torch.testing.assert_close(out, alone, atol=ATOL, rtol=RTOL)


# --------------------------------------------------------------------------------------------------
# Config validation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field,value,registry",
                         [("attention", "linear", VARIANTS), ("position", "rope", POSITIONS)])
def test_unknown_choice_names_the_allowed_values(field, value, registry):
    with pytest.raises(ConfigError) as info:
        tiny_config(**{field: value})
    message = str(info.value)
    assert field in message and value in message
    for name in registry.names():
        assert name in message


def test_invalid_configs_raise_config_error():
    with pytest.raises(ConfigError, match="divisible"):
        tiny_config(d_model=30, n_heads=4)
    with pytest.raises(ConfigError, match="share_embeddings"):
        tiny_config(src_vocab_size=32, tgt_vocab_size=40)
    tiny_config(src_vocab_size=32, tgt_vocab_size=40, share_embeddings=False)  # fine when not shared
    with pytest.raises(ConfigError, match="use it with attention 'dot'"):
        tiny_config("bilinear", "rotary")
    with pytest.raises(ConfigError, match="norm"):
        tiny_config(norm="middle")
    with pytest.raises(ConfigError, match="no option 'max_distance'"):  # options are checked at build
        Seq2SeqTransformer(tiny_config(position="sinusoidal", position_options={"max_distance": 3}))


def test_from_dict_rejects_unknown_keys_and_bad_types():
    with pytest.raises(ConfigError) as info:
        TransformerConfig.from_dict({"d_model": 32, "n_head": 4})
    assert "n_head" in str(info.value) and "n_heads" in str(info.value)
    with pytest.raises(ConfigError, match="d_model"):
        TransformerConfig.from_dict({"d_model": "wide"})
    with pytest.raises(ConfigError, match="family"):
        config_from_dict({"d_model": 32})


def test_config_round_trip():
    config = tiny_config("synthesizer-random", "alibi", attention_options={"freeze": True}, norm="pre")
    data = config.to_dict()
    assert TransformerConfig.from_dict(data) == config
    family, again = config_from_dict(config_to_dict(config))
    assert family == "seq2seq" and again == config
    assert isinstance(build_model(config_to_dict(config)), Seq2SeqTransformer)


def test_encoder_bias_is_bidirectional_and_decoder_bias_causal():
    """One T5 table per side: the encoder's buckets tell past from future, the decoder's spend every
    bucket on the past (its future is masked anyway)."""
    model = Seq2SeqTransformer(tiny_config(position="t5-bias"))
    pos = torch.arange(6)[None, :]
    rel = pos[:, None, :] - pos[:, :, None]
    q = torch.randn(1, H, 6, D // H)
    for scheme, bidirectional in [(model.src_position, True), (model.tgt_position, False)]:
        buckets = t5_bucket(rel, bidirectional=bidirectional, num_buckets=8, max_distance=8)
        expected = scheme.embedding.weight[buckets].permute(0, 3, 1, 2)
        torch.testing.assert_close(scheme.score_bias(q, pos, pos, H), expected, atol=0, rtol=0)


def test_sequences_longer_than_the_model_allows_are_refused():
    model = Seq2SeqTransformer(tiny_config("synthesizer-dense", max_len=8))
    with pytest.raises(SequenceTooLong, match="source"):
        model(torch.randint(3, V, (1, 9)), torch.randint(3, V, (1, 4)))
    with pytest.raises(SequenceTooLong, match="target"):
        model(torch.randint(3, V, (1, 4)), torch.randint(3, V, (1, 9)))


def test_token_loss_averages_over_real_targets_and_is_zero_without_any():
    logits = torch.randn(2, 5, 7, requires_grad=True)
    labels = torch.randint(0, 7, (2, 5))
    labels[0, :2] = -100
    loss, n = token_loss(logits, labels)
    real = labels != -100
    assert int(n) == int(real.sum())
    torch.testing.assert_close(loss, F.cross_entropy(logits[real], labels[real]), atol=1e-6, rtol=0)
    empty, n = token_loss(logits, torch.full_like(labels, -100))
    assert int(n) == 0 and float(empty.detach()) == 0.0
    empty.backward()  # still part of the graph (every distributed process takes part in backward)
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    # Half precision is summed in fp32; a float64 model keeps its precision.
    assert token_loss(logits.double(), labels)[0].dtype == torch.float64
    assert token_loss(logits.bfloat16(), labels)[0].dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("share, smoothing", [(0.15, 0.0), (0.4, 0.1), (0.7, 0.1), (1.0, 0.0)])
def test_token_loss_scores_only_the_labelled_rows_on_a_cpu(monkeypatch, dtype, share, smoothing):
    """With half of the labels or more ignored (BERT's masked LM: 85 %), the rows with a label are picked out
    before the cross-entropy: the loss and gradient of torch's cross-entropy over every row."""
    import attnlab.models.common as common

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, 30, generator=g).to(dtype).requires_grad_()
    labels = torch.randint(0, 30, (4, 50), generator=g)
    labels[torch.rand(4, 50, generator=g) >= share] = -100
    labels[0, 0] = 5  # at least one label
    scored = []
    real_ce = F.cross_entropy
    monkeypatch.setattr(common.F, "cross_entropy", lambda x, *a, **k: scored.append(x.shape[0]) or real_ce(x, *a, **k))
    loss, n = token_loss(logits, labels, label_smoothing=smoothing)
    loss.backward()
    n_real = int((labels != -100).sum())
    assert int(n) == n_real and scored == [n_real if n_real <= 0.5 * 200 else 200]
    reference = logits.detach().clone().requires_grad_()
    expected = real_ce(reference.reshape(-1, 30).float(), labels.reshape(-1), ignore_index=-100,
                       label_smoothing=smoothing)
    expected.backward()
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits.grad, reference.grad, atol=1e-6 if dtype == torch.float32 else 1e-3, rtol=0)
    assert (logits.grad[labels == -100] == 0).all()


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_lm_logits_at_the_labelled_positions_only_give_the_same_loss_and_gradients(smoothing):
    """lm_logits = "labelled" runs the LM head at the labelled target positions in training (padding skipped):
    the same loss and gradients as the head over every position; evaluation still scores every position."""
    torch.manual_seed(0)
    src, tgt = torch.randint(3, 40, (3, 7)), torch.randint(3, 40, (3, 6))
    src_mask = torch.ones_like(src)
    src_mask[1, 5:] = 0
    labels = tgt.clone()
    labels[0, 4:] = -100  # padded target rows
    labels[2, 2:] = -100
    config = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=16, n_heads=2, d_ff=24, n_encoder_layers=1,
                  n_decoder_layers=2, dropout=0.0, max_len=16, label_smoothing=smoothing)
    dense = Seq2SeqTransformer(TransformerConfig(**config)).train()
    sparse = Seq2SeqTransformer(TransformerConfig(**config, lm_logits="labelled")).train()
    sparse.load_state_dict(dense.state_dict())
    outs = [model(src, tgt, src_mask, labels) for model in (dense, sparse)]
    for out in outs:
        out.loss.backward()
    n = int((labels != -100).sum())
    assert n == 12 and outs[0].logits.shape == (3, 6, 40) and outs[1].logits.shape == (n, 40)
    assert int(outs[1].n_targets) == int(outs[0].n_targets) == n
    torch.testing.assert_close(outs[1].loss, outs[0].loss)
    torch.testing.assert_close(outs[1].logits, outs[0].logits[labels != -100])
    grads = dict(dense.named_parameters())
    for name, param in sparse.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, atol=1e-6, rtol=1e-5, msg=name)
    with torch.no_grad():
        assert sparse.eval()(src, tgt, src_mask, labels).logits.shape == (3, 6, 40)
        assert sparse.train()(src, tgt, src_mask).logits.shape == (3, 6, 40)  # no labels: every position
    with pytest.raises(ConfigError, match="lm_logits"):
        TransformerConfig(**config, lm_logits="some")


def test_positions_from_mask_and_length_limit():
    keep = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])  # left- and right-padded rows
    assert positions_from_mask(keep).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]
    model = Seq2SeqTransformer(tiny_config("dot", "sinusoidal"))
    assert length_limit("dot", model.src_position, 16) is None  # nothing bounds sinusoids + dot
    assert length_limit("synthesizer-dense", model.src_position, 16) == 16
    learned = Seq2SeqTransformer(tiny_config("dot", "learned"))
    assert length_limit("dot", learned.src_position, 16) == 16


# --------------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------------


def test_transformer_base_parameter_count():
    """63,082,496: shared 37000x512 embedding (tied to the output), 6 encoder + 6 decoder post-norm layers.

    The formula below regenerates the number; the paper's ~65M used a different vocabulary."""
    vocab, d, ff, n = 37000, 512, 2048, 6
    attention = 4 * (d * d + d)
    feed_forward = d * ff + ff + ff * d + d
    norm = 2 * d
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    expected = vocab * d + n * encoder_layer + n * decoder_layer
    assert expected == 63_082_496
    family, config = get_preset("transformer-base")
    assert family == "seq2seq" and config.norm == "post" and not config.final_norm
    model = Seq2SeqTransformer(config)
    assert sum(p.numel() for p in model.parameters()) == expected


def test_tiny_preset_runs():
    _, config = get_preset("seq2seq-tiny")
    model = Seq2SeqTransformer(config).eval()
    src, tgt = torch.randint(3, 64, (2, 6)), torch.randint(3, 64, (2, 5))
    out = model(src, tgt, labels=tgt)
    assert out.logits.shape == (2, 5, 64) and torch.isfinite(out.loss)
