"""The encoder model: parity with the nn.Transformer word-LM tutorial model, heads, pooling, padding."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.errors import ConfigError
from attnlab.models.encoder import EncoderConfig, EncoderModel
from attnlab.models.registry import build_model, config_to_dict, get_preset

# --------------------------------------------------------------------------------------------------
# The reference: the tutorial's TransformerModel, written from torch.nn building blocks (batch first).
# --------------------------------------------------------------------------------------------------


class TutorialPositionalEncoding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 5000):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):  # (B, T, D)
        return x + self.pe[: x.shape[1]]


class TutorialLM(nn.Module):
    def __init__(self, ntoken: int, d_model: int, nhead: int, d_hid: int, nlayers: int, dropout: float):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(ntoken, d_model)
        self.pos_encoder = TutorialPositionalEncoding(d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, d_hid, dropout, batch_first=True)
        self.transformer_encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.linear = nn.Linear(d_model, ntoken)

    def forward(self, src, src_mask):
        x = self.pos_encoder(self.embedding(src) * math.sqrt(self.d_model))
        return self.linear(self.transformer_encoder(x, mask=src_mask))


@torch.no_grad()
def copy_from_reference(ref: TutorialLM, ours: EncoderModel) -> None:
    ours.embed.token.weight.copy_(ref.embedding.weight)
    for src, dst in zip(ref.transformer_encoder.layers, ours.encoder.layers):
        wq, wk, wv = src.self_attn.in_proj_weight.chunk(3)
        bq, bk, bv = src.self_attn.in_proj_bias.chunk(3)
        attn = dst.self_attn
        for lin, w, b in ((attn.scores.q_proj, wq, bq), (attn.scores.k_proj, wk, bk), (attn.v_proj, wv, bv)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        attn.out_proj.load_state_dict(src.self_attn.out_proj.state_dict())
        dst.ff.fc1.load_state_dict(src.linear1.state_dict())
        dst.ff.fc2.load_state_dict(src.linear2.state_dict())
        dst.attn_block.norm.load_state_dict(src.norm1.state_dict())
        dst.ff_block.norm.load_state_dict(src.norm2.state_dict())
    ours.head.proj.load_state_dict(ref.linear.state_dict())


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def tiny(**changes) -> EncoderModel:
    torch.manual_seed(0)
    return EncoderModel(get_preset("encoder-tiny")[1].replace(**changes))


# --------------------------------------------------------------------------------------------------


def test_tutorial_parameter_counts_match_reference():
    lm = build_model(get_preset("tutorial-lm")[1])
    cls = build_model(get_preset("tutorial-cls")[1])
    assert n_params(lm) == 1_008_100
    assert n_params(cls) == 988_402
    ref = TutorialLM(100, 200, 2, 200, 4, 0.2)
    assert n_params(ref) == n_params(lm)


def test_tutorial_lm_matches_nn_transformer_reference():
    torch.manual_seed(0)
    ref = TutorialLM(100, 200, 2, 200, 4, 0.2).eval()
    ours = build_model(get_preset("tutorial-lm")[1]).eval()
    copy_from_reference(ref, ours)
    ids = torch.randint(0, 100, (3, 17))
    causal = nn.Transformer.generate_square_subsequent_mask(17)  # float, -inf above the diagonal
    with torch.no_grad():
        expected = ref(ids, causal)
        got = ours(ids).logits
    assert got.shape == (3, 17, 100)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_lm_loss_contract_and_outputs():
    model = tiny().eval()
    ids = torch.randint(0, 64, (2, 9))
    labels = torch.randint(0, 64, (2, 9))
    labels[0, :4] = -100
    out = model(input_ids=ids, labels=labels, need_weights=True, output_hidden_states=True,
                token_type_ids=torch.zeros_like(ids))  # an unknown batch key is ignored
    flat = out.logits.reshape(-1, 64)
    keep = labels.reshape(-1) != -100
    expected = nn.functional.cross_entropy(flat[keep], labels.reshape(-1)[keep])
    torch.testing.assert_close(out.loss, expected)
    assert int(out.n_targets) == 14
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 9, 9)
    assert torch.all(out.attentions[0].triu(1) == 0)  # causal by default for the LM head
    assert len(out.hidden_states) == 3 and out.hidden_states[-1].shape == (2, 9, 32)


def test_lm_is_causal_a_prefix_does_not_see_the_future():
    model = tiny().eval()
    ids = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        full = model(ids).logits
        prefix = model(ids[:, :6]).logits
    torch.testing.assert_close(full[:, :6], prefix, atol=1e-5, rtol=0)


def test_with_head_keeps_encoder_weights_and_makes_a_fresh_head():
    lm = tiny()
    cls = lm.with_head("classification", n_classes=3)
    assert cls.config.head == "classification" and cls.config.n_classes == 3
    assert cls.config.is_causal is True  # kept from the pretrained encoder unless asked otherwise
    body = {k: v for k, v in lm.state_dict().items() if not k.startswith("head.")}
    new_body = {k: v for k, v in cls.state_dict().items() if not k.startswith("head.")}
    assert body.keys() == new_body.keys()
    for k in body:
        assert torch.equal(body[k], new_body[k]), k
    assert cls.head.proj.weight.shape == (3, 32)
    # A copy, not shared storage: fine-tuning the classifier leaves the LM untouched.
    assert cls.embed.token.weight.data_ptr() != lm.embed.token.weight.data_ptr()
    out = cls(torch.randint(0, 64, (4, 7)), labels=torch.tensor([0, 1, 2, 1]))
    assert out.logits.shape == (4, 3) and int(out.n_targets) == 4
    back = cls.with_head("lm", causal=False)
    assert back.config.is_causal is False and back.head.proj.weight.shape == (64, 32)


@pytest.mark.parametrize("pooling", ["mean", "first", "last"])
def test_classification_ignores_padding(pooling):
    model = tiny(head="classification", causal=False, pooling=pooling).eval()
    a = torch.randint(3, 64, (1, 5))
    b = torch.randint(3, 64, (1, 8))
    pad = torch.zeros(1, 3, dtype=torch.long)
    ids = torch.cat([torch.cat([a, pad], 1), b])  # right-padded batch
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    with torch.no_grad():
        batch = model(ids, attention_mask=mask).logits
        alone_a, alone_b = model(a).logits, model(b).logits
        left_mask = torch.cat([torch.zeros_like(pad), mask[:1, :5]], 1)
        left = model(torch.cat([pad, a], 1), attention_mask=left_mask)
    torch.testing.assert_close(batch[0], alone_a[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(batch[1], alone_b[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(left.logits, alone_a, atol=1e-5, rtol=0)


def test_pad_id_stands_in_for_a_missing_attention_mask():
    model = tiny(head="classification", pad_id=0).eval()
    ids = torch.tensor([[5, 6, 7, 0, 0]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, model(ids[:, :3]).logits, atol=1e-5, rtol=0)


def test_config_validation_and_round_trip():
    with pytest.raises(ConfigError, match="pooling"):
        EncoderConfig(head="classification", pooling="max")
    with pytest.raises(ConfigError, match="n_classes"):
        EncoderConfig(head="classification", n_classes=1)
    with pytest.raises(ConfigError, match="head"):
        EncoderConfig(head="seq2seq")
    cfg = get_preset("tutorial-cls")[1]
    assert cfg.is_causal is False and cfg.layer_spec().attention_dropout == 0.2
    assert cfg.replace(head="lm").is_causal is True  # "automatic" survives replace
    rebuilt = build_model(config_to_dict(cfg))
    assert rebuilt.config == cfg


# ---- decoding with a KV cache ---------------------------------------------------------------------------------

def _decoding_lm(**kw) -> EncoderModel:
    """A causal encoder LM with weights far from their initialisation (fresh ones make many scores nearly equal)."""
    torch.manual_seed(0)
    base = dict(vocab_size=20, d_model=16, n_heads=2, d_ff=16, n_layers=2, dropout=0.0, max_len=12)
    model = EncoderModel(EncoderConfig(**{**base, **kw}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 1.0)
    return model.eval()


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("position,attention", [("sinusoidal", "dot"), ("learned", "dot"), ("rotary", "dot"),
                                                ("t5-bias", "dot"), ("relative", "dot"), ("alibi", "dot"),
                                                ("learned", "synthesizer-dense")])
def test_a_causal_encoder_lm_gives_the_same_logits_with_a_cache(norm, position, attention):
    """The tutorial's model under its causal mask is a decoder-only LM: fed piece by piece through a KV cache,
    with or without a mask over padded keys, it gives the logits of one full pass (post-norm layers too). The
    weights are large (logits in the tens), hence the float32 tolerance of 1e-4."""
    model = _decoding_lm(norm=norm, position=position, attention=attention)
    ids = torch.randint(0, 20, (2, 10))
    full = model(ids).logits
    cache = model.new_cache()
    pieces = [model(ids[:, a:b], cache=cache).logits for a, b in [(0, 4), (4, 5), (5, 8), (8, 10)]]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-4, rtol=1e-4)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :2] = 0  # row 0 is left-padded by two: its tokens sit at positions 0..9
    padded = torch.cat([torch.zeros(2, 2, dtype=torch.long), ids], dim=1)
    padded[1] = torch.cat([ids[1], torch.zeros(2, dtype=torch.long)])
    mask[1, 10:] = 0  # row 1 is right-padded
    cache = model.new_cache()
    steps = [model(padded[:, a:b], attention_mask=mask[:, :b], cache=cache).logits for a, b in [(0, 6), (6, 12)]]
    cached = torch.cat(steps, dim=1)
    torch.testing.assert_close(cached[0, 2:], full[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(cached[1, :10], full[1], atol=1e-4, rtol=1e-4)


def test_an_encoder_lm_generates_with_a_cache_what_it_generates_without():
    """`generate` keeps a KV cache for the causal encoder LM (it had none and failed with the default
    use_cache=True): the same tokens as recomputing every step, prompts of any length batched, one forward per new
    token once the prompt is in; past max_len the window slides as for GPT (it failed as too long)."""
    from attnlab.inference.generate import generate

    model = _decoding_lm(position="learned")
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    out = generate(model, prompts, 15, greedy=True)
    assert out == generate(model, prompts, 15, greedy=True, use_cache=False)
    assert out == [generate(model, [p], 15, greedy=True, use_cache=False)[0] for p in prompts]
    assert len(set(map(tuple, out))) == 3
    with torch.no_grad():  # each token is the model's choice over the last 12 tokens alone
        seq = list(prompts[2])
        for token in out[2]:
            assert token == int(model(torch.tensor([seq[-12:]])).logits[0, -1].argmax())
            seq.append(token)
    forward, lengths = EncoderModel.forward, []

    def counted(self, input_ids, *args, **kwargs):
        lengths.append(input_ids.shape[1])
        return forward(self, input_ids, *args, **kwargs)

    EncoderModel.forward = counted
    try:
        assert generate(model, prompts[2:], 15, greedy=True) == out[2:]
    finally:
        EncoderModel.forward = forward
    assert lengths == [5] + [1] * 7 + [12] * 7  # cached to the 12th position, then the window recomputed


def test_a_bidirectional_lm_or_a_classifier_decodes_without_a_cache():
    """A bidirectional LM's earlier states change with every token added: it keeps no cache, and `generate`
    recomputes it each step (what it gives with use_cache=False)."""
    from attnlab.inference.generate import generate

    model = _decoding_lm(causal=False)
    assert not model.supports_cache and not _decoding_lm(head="classification", causal=True).supports_cache
    with pytest.raises(ConfigError, match="causal LM head"):
        model.new_cache()
    with pytest.raises(ConfigError, match="causal LM head"):
        model(torch.tensor([[1, 2]]), cache=[])
    out = generate(model, [[1, 2, 3]], 6, greedy=True)
    with torch.no_grad():
        seq = [1, 2, 3]
        for token in out[0]:
            assert token == int(model(torch.tensor([seq])).logits[0, -1].argmax())
            seq.append(token)


def test_an_encoder_lm_with_a_pad_id_generates_the_same_with_a_cache_without_it_and_batched():
    """An encoder LM with config.pad_id reads that id as padding where no mask is given, which a cache cannot do
    for its earlier keys: `generate` gives it the mask of real tokens, so a prompt (or generated) token equal to
    pad_id is real in every path (it was masked without the cache and alone, real with the cache or batched)."""
    from attnlab.inference.generate import generate

    model = _decoding_lm(pad_id=0)
    prompt = [5, 0]
    out = generate(model, [prompt], 6, greedy=True)
    assert out == generate(model, [prompt], 6, greedy=True, use_cache=False)
    assert out[0] == generate(model, [prompt, [7]], 6, greedy=True, use_cache=False)[0]


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_a_zero_layer_lm_decodes_without_a_cache(position):
    # An empty list of caches put every new token at position 0 (found by the stop-32 invariants audit).
    from attnlab.inference.generate import generate

    torch.manual_seed(0)
    model = EncoderModel(EncoderConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=16, n_layers=0, max_len=32,
                                       position=position)).eval()
    assert not model.supports_cache
    with pytest.raises(ConfigError, match="without layers has no keys or values to cache"):
        model.new_cache()
    with pytest.raises(ConfigError, match="without layers"):
        model(torch.tensor([[1, 2]]), cache=[])
    new = generate(model, [[3, 4, 5]], 8, greedy=True)
    assert new == generate(model, [[3, 4, 5]], 8, greedy=True, use_cache=False)
    full = model(torch.tensor([[3, 4, 5, *new[0]]])).logits  # each new token: the full pass's argmax before it
    assert full[0, 2:-1].argmax(-1).tolist() == new[0]
