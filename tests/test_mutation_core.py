"""Tests written from a mutation audit of the model core: each pins a behaviour that a plausible one-line
bug would break while every other test still passed (the mutant each one kills is named in its docstring).

Covered: attention dropout on every path of `attention` (explicit, half-precision, blocked causal), rows whose
keys are all masked under a kernel that returns NaN for them (as torch 2.4's did), the initial scale of
bilinear scores, the cross-attention variant of a decoder layer, `attention_dropout` reaching attention in
every family, the scaled target embedding of the Transformer, the order of LayerNorm and dropout in BERT's
embeddings, the encoder's classification-head dropout, beam search keeping k live beams when beams end and
masking a padded source, and the fast decoder honouring the configured LayerNorm eps.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from attnlab.inference.fast_decode import FastGPTDecoder
from attnlab.inference.generate import beam_search, generate, greedy_translate
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.encoder import EncoderConfig, EncoderModel
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig
from attnlab.modules import attention as attention_module
from attnlab.modules.attention import EXPLICIT_MAX_KEYS, attention
from attnlab.modules.blocks import DecoderLayer, LayerSpec
from attnlab.modules.variants import BilinearScores, DotScores

# --------------------------------------------------------------------------------------------------
# attention(): dropout and fully masked rows on every implementation path
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["fused", "explicit-weights", "explicit-half", "blocked-half"])
def test_attention_dropout_is_applied_on_every_path(path):
    """Mutants: `_explicit_attention` skipping its dropout (attention.py `dropped = ...`), and the blocked causal
    path called with dropout=0. Both would silently turn attention dropout off when weights are requested or
    when training in bf16 on a CPU."""
    dtype = torch.bfloat16 if path.endswith("half") else torch.float32
    t = EXPLICIT_MAX_KEYS + 88 if path == "blocked-half" else 6  # > 512 keys: the blocked causal path
    q, k, v = (torch.randn(1, 2, t, 8).to(dtype) for _ in range(3))
    need_weights = path == "explicit-weights"
    plain, plain_w = attention(q, k, v, causal=True, need_weights=need_weights)
    torch.manual_seed(1)
    dropped, dropped_w = attention(q, k, v, causal=True, dropout=0.5, need_weights=need_weights)
    assert torch.isfinite(dropped.float()).all()
    # With p = 0.5 about half the weights of every row are zeroed: the outputs cannot all agree.
    close = torch.isclose(dropped.float(), plain.float(), atol=1e-2, rtol=1e-2)
    assert close.float().mean() < 0.5, f"{path}: dropout=0.5 left the output unchanged"
    if need_weights:  # the weights returned are the softmax itself, rows summing to 1
        torch.testing.assert_close(dropped_w, plain_w)


def test_fully_masked_rows_are_zero_even_where_the_fused_kernel_returns_nan(monkeypatch):
    """Mutant: removing `out = out.masked_fill(~visible, 0.0)` on the fused path. The torch installed here
    already returns 0 for such rows, but torch 2.4 (allowed by pyproject) returns NaN: simulate that kernel."""
    real = F.scaled_dot_product_attention

    def old_kernel(q, k, v, attn_mask=None, **kwargs):
        out = real(q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is None:
            return out
        visible = attn_mask if attn_mask.dtype == torch.bool else attn_mask > float("-inf")
        return out.masked_fill(~visible.any(-1, keepdim=True), float("nan"))

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", old_kernel)
    q, k, v = (torch.randn(2, 2, 4, 8) for _ in range(3))
    mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    mask[1] = False  # batch row 1 sees no key at all
    out, _ = attention(q, k, v, mask=mask)
    assert torch.isfinite(out).all()
    assert (out[1] == 0).all()
    torch.testing.assert_close(out[0], attention(q[:1], k[:1], v[:1])[0][0])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_a_float_mask_and_a_bias_are_both_added(causal, need_weights):
    """Mutant: `_add_bias` returning a float mask without the bias (the fused path then drops a position
    bias whenever the user's mask is additive). Reference: softmax(q·kᵀ/sqrt(d) + mask + bias [+ causal])·v."""
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    float_mask = torch.randn(2, 1, 1, 5)
    float_mask[0, ..., 3] = float("-inf")
    bias = torch.randn(1, 2, 5, 5)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8) + float_mask + bias
    if causal:
        scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    expected = torch.softmax(scores, -1) @ v
    out, _ = attention(q, k, v, mask=float_mask, bias=bias, causal=causal, need_weights=need_weights)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# Variants and layers
# --------------------------------------------------------------------------------------------------


def test_fresh_bilinear_scores_have_the_spread_of_fresh_dot_scores():
    """Mutant: dropping `/ math.sqrt(head_dim)` from BilinearScores' initialisation, which makes a fresh
    bilinear layer's scores sqrt(Dh) = 4x wider than a fresh `dot` layer's (softmax far more peaked)."""
    d, h = 64, 4
    x = torch.randn(4, 32, d)
    pos = torch.arange(32)[None]
    ratios = []
    for seed in range(3):
        torch.manual_seed(seed)
        dot = DotScores(d_model=d, n_heads=h, bias=False)
        bil = BilinearScores(d_model=d, n_heads=h, bias=False)
        with torch.no_grad():
            s_dot = dot.queries(x, pos) @ dot.keys(x, pos).transpose(-1, -2) / math.sqrt(d // h)
            s_bil = bil.queries(x, pos) @ bil.keys(x, pos).transpose(-1, -2) * bil.scale
        ratios.append(float(s_bil.std() / s_dot.std()))
    assert all(0.6 < r < 1.6 for r in ratios), ratios


@pytest.mark.parametrize("family", ["gpt", "bert"])
def test_a_fresh_bilinear_model_scores_with_the_spread_of_a_fresh_dot_model(family):
    """GPT and BERT draw their linear layers from N(0, init_std) but left the merged bilinear weight as the product
    of torch's default projections: its first scores spread 6x wider than the dot model's (stop-33 audit)."""
    from attnlab.models.bert import BertConfig, BertModel
    from attnlab.models.gpt import GPT, GPTConfig

    d, h = 128, 4
    build = {"gpt": lambda v: GPT(GPTConfig(vocab_size=65, block_size=64, d_model=d, n_heads=h, n_layers=2,
                                            attention=v)),
             "bert": lambda v: BertModel(BertConfig(vocab_size=65, max_len=64, d_model=d, n_heads=h, n_layers=2,
                                                    d_ff=4 * d, attention=v))}[family]
    x, pos = torch.randn(4, 32, d), torch.arange(32)[None]

    def spread(model) -> float:
        scores = next(m for m in model.modules() if isinstance(m, (DotScores, BilinearScores)))
        scale = scores.scale if scores.scale is not None else 1 / math.sqrt(d // h)
        with torch.no_grad():
            return float((scores.queries(x, pos) @ scores.keys(x, pos).transpose(-1, -2) * scale).std())

    ratios = []
    for seed in range(3):
        torch.manual_seed(seed)
        dot = spread(build("dot"))
        torch.manual_seed(seed)
        ratios.append(spread(build("bilinear")) / dot)
    assert all(0.6 < r < 1.6 for r in ratios), ratios


def test_decoder_cross_attention_uses_the_configured_variant_when_it_can():
    """Mutant: DecoderLayer always building `dot` cross-attention. `bilinear` supports cross-attention and
    must be used there; the Synthesizers cannot (their scores are over positions) and fall back to `dot`."""
    for variant, expected in [("bilinear", BilinearScores), ("synthesizer-dense", DotScores),
                              ("synthesizer-random", DotScores), ("dot", DotScores)]:
        spec = LayerSpec(d_model=16, n_heads=2, d_ff=32, attention=variant, block_size=8)
        layer = DecoderLayer(spec)
        assert type(layer.cross_attn.scores) is expected, variant


def _train_passes_differ(model, *inputs) -> bool:
    model.train()
    torch.manual_seed(0)
    a = model(*inputs).logits
    torch.manual_seed(1)
    b = model(*inputs).logits
    return not torch.equal(a, b)


@pytest.mark.parametrize("family", ["gpt", "seq2seq", "bert", "encoder"])
def test_attention_dropout_is_the_configured_one_in_every_family(family):
    """Mutants: LayerSpec.attention_module taking `dropout` instead of `attention_dropout`, and EncoderConfig
    ignoring an explicit `attention_dropout`. With every other dropout at 0, attention dropout alone must make
    two training passes differ, and with it at 0 too they must agree."""
    ids = torch.randint(3, 30, (2, 7))

    def build(p):
        torch.manual_seed(0)
        if family == "gpt":
            return GPT(GPTConfig(vocab_size=30, block_size=8, d_model=16, n_heads=2, n_layers=1,
                                 dropout=0.0, attention_dropout=p)), (ids,)
        if family == "seq2seq":
            return Seq2SeqTransformer(TransformerConfig(
                src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                n_decoder_layers=1, dropout=0.0, attention_dropout=p, max_len=8)), (ids, ids)
        if family == "bert":
            return BertModel(BertConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=8,
                                        dropout=0.0, attention_dropout=p, heads="none")), (ids,)
        return EncoderModel(EncoderConfig(vocab_size=30, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                                          dropout=0.0, attention_dropout=p, max_len=8)), (ids,)

    model, inputs = build(0.5)
    assert _train_passes_differ(model, *inputs)
    model, inputs = build(0.0)
    assert not _train_passes_differ(model, *inputs)


# --------------------------------------------------------------------------------------------------
# Embeddings and heads
# --------------------------------------------------------------------------------------------------


def _sinusoids(positions: torch.Tensor, d: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)), written out."""
    pe = torch.zeros(len(positions), d, dtype=torch.float64)
    for r, p in enumerate(positions.tolist()):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            pe[r, 2 * i], pe[r, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return pe.float()


def test_transformer_scales_both_embeddings_by_sqrt_d_model():
    """Mutant: the target Embedder built with scale=False (the source one still scaled). The first hidden
    state of each stack is E[id]·sqrt(D) + PE[position]."""
    d = 16
    model = Seq2SeqTransformer(TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=d, n_heads=2, d_ff=32, n_encoder_layers=1,
        n_decoder_layers=1, dropout=0.0, max_len=16)).eval()
    src, tgt = torch.randint(3, 30, (2, 5)), torch.randint(3, 30, (2, 4))
    out = model(src, tgt, output_hidden_states=True)
    table = model.src_embed.token.weight
    for ids, first in [(src, out.extra["encoder_hidden_states"][0]), (tgt, out.hidden_states[0])]:
        expected = table[ids] * math.sqrt(d) + _sinusoids(torch.arange(ids.shape[1]), d)
        torch.testing.assert_close(first, expected, atol=1e-5, rtol=1e-5)


def test_bert_embeddings_apply_dropout_after_the_layer_norm():
    """Mutant: BertEmbeddings computing norm(dropout(x)) instead of HF's dropout(LayerNorm(x)). With no
    layer the model's output is the embeddings' output: in training it is the normalised sum with a
    dropout mask (exact zeros, survivors scaled by 1/(1-p))."""
    p = 0.5
    model = BertModel(BertConfig(vocab_size=30, d_model=16, n_layers=0, n_heads=2, d_ff=32, max_len=8,
                                 dropout=p, attention_dropout=0.0, heads="none")).train()
    ids, segments = torch.randint(1, 30, (3, 6)), torch.randint(0, 2, (3, 6))
    e = model.embeddings
    summed = e.token.weight[ids] + e.position.embedding.weight[torch.arange(6)] + e.segment.weight[segments]
    normed = F.layer_norm(summed, (16,), e.norm.weight, e.norm.bias, e.norm.eps)
    torch.manual_seed(3)
    out = model(ids, token_type_ids=segments).logits
    torch.manual_seed(3)
    expected = F.dropout(normed, p, training=True)
    torch.testing.assert_close(out, expected)


def test_encoder_classification_head_applies_dropout_to_the_pooled_vector():
    """Mutant: ClassificationHead skipping its dropout. Reference: Linear(dropout(mean over real tokens))."""
    model = EncoderModel(EncoderConfig(vocab_size=30, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.5,
                                       head="classification", n_classes=3, max_len=8)).train()
    h = torch.randn(2, 5, 16)
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    pooled = (h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
    torch.manual_seed(5)
    out = model.head(h, keep)
    torch.manual_seed(5)
    expected = F.linear(F.dropout(pooled, 0.5, training=True), model.head.proj.weight, model.head.proj.bias)
    torch.testing.assert_close(out, expected)


# --------------------------------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------------------------------


class _PrefixCache:
    """Stands in for a KV cache: the target prefix of each live row, reordered with the beams."""

    def __init__(self):
        self.rows: list[tuple[int, ...]] | None = None  # one empty prefix per row at the first step

    def reorder(self, index: torch.Tensor) -> None:
        if self.rows is not None:
            self.rows = [self.rows[i] for i in index.tolist()]


class _TableLM:
    """A stand-in encoder-decoder whose next-token distribution is a fixed table keyed by the target prefix
    (bos excluded)."""

    PAD, BOS, EOS, A, B, C = range(6)

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], default: dict[int, float]):
        self.config = SimpleNamespace(pad_id=self.PAD, bos_id=self.BOS, eos_id=self.EOS)
        self.table, self.default = table, default

    training = False

    def train(self, mode: bool = True):
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    def encode(self, src, src_mask=None):
        return torch.zeros(src.shape[0], src.shape[1], 1), [], []

    def new_cache(self):
        return [(_PrefixCache(), _PrefixCache())]

    def decode(self, tokens, memory, src_mask=None, *, cache):
        prefixes = cache[0][0]
        if prefixes.rows is None:  # the first step's tokens are bos
            prefixes.rows = [()] * tokens.shape[0]
        else:
            prefixes.rows = [row + (t,) for row, t in zip(prefixes.rows, tokens[:, 0].tolist())]
        logits = torch.full((tokens.shape[0], 6), -1e9)
        for r, prefix in enumerate(prefixes.rows):
            for tok, p in self.table.get(prefix, self.default).items():
                logits[r, tok] = math.log(p)
        return logits[:, None], [], [], []


def test_beams_that_end_never_take_the_place_of_live_ones():
    """Mutant: ranking k + 1 candidates per step instead of 2k. At step 2 the two live beams (a, b) both rank
    eos first; those two candidates finish, and beam search must still keep k = 2 live beams (a a and b c):
    the best target goes on from b c, the fourth-ranked candidate."""
    A, B, C, EOS = _TableLM.A, _TableLM.B, _TableLM.C, _TableLM.EOS
    table = {
        (): {A: 0.32, B: 0.30, C: 0.2, EOS: 0.18},
        (A,): {EOS: 0.34, A: 0.33, B: 0.17, C: 0.16},
        (B,): {EOS: 0.34, C: 0.33, A: 0.17, B: 0.16},
        (B, C): {EOS: 0.97, A: 0.01, B: 0.01, C: 0.01},
    }
    lm = _TableLM(table, default={A: 0.3, B: 0.3, C: 0.3, EOS: 0.1})
    # α = 2 rewards length: "b c eos" (0.30·0.33·0.97, over (8/6)²) beats "a eos" (0.32·0.34, over (7/6)²),
    # the best of every target (checked by enumeration), but it is reachable only through the live beam "b c".
    best = beam_search(lm, torch.zeros(1, 3, dtype=torch.long), beam_size=2, max_len=4, length_penalty=2.0)
    assert best == [[B, C]]


def test_beam_search_masks_the_padding_of_each_source():
    """Mutant: beam search decoding with src_mask dropped (the encoder still masks it). A right-padded source
    must give the translation it gives alone, for several models."""
    from test_seq2seq_decoding import _model

    for seed in range(4):
        model = _model(seed)
        pad = model.config.pad_id
        long, short = [3, 4, 4, 3, 4, 3, 3, 4], [4, 3]
        src = torch.tensor([long, short + [pad] * 6])
        mask = (src != pad).long()
        alone = beam_search(model, torch.tensor([long]), beam_size=2, max_len=5) + \
            beam_search(model, torch.tensor([short]), beam_size=2, max_len=5)
        assert beam_search(model, src, mask, beam_size=2, max_len=5) == alone, seed


# --------------------------------------------------------------------------------------------------
# Fast decoder
# --------------------------------------------------------------------------------------------------


def test_fast_decoder_uses_the_configured_layer_norm_eps():
    """Mutant: FastGPTDecoder hard-coding eps = 1e-5 for the block norms (the GPT default, so every other
    test passed). With a large eps the fast logits must still equal the general forward's."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=23, block_size=16, d_model=16, n_heads=2, n_layers=2,
                          layer_norm_eps=0.5)).eval()
    with torch.no_grad():  # activations of the order of eps, so eps matters
        for p in model.parameters():
            p.mul_(0.5)
    ids = torch.randint(0, 23, (2, 8))
    full = model(ids).logits
    decoder = FastGPTDecoder(model, batch=2, capacity=8)
    steps = [decoder.step(ids[:, :4])] + [decoder.step(ids[:, t : t + 1]) for t in range(4, 8)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 3:], atol=1e-5, rtol=1e-5)
    assert generate(model, [[1, 2, 3]], 6, greedy=True) == generate(model, [[1, 2, 3]], 6, greedy=True, fast=False)


# --------------------------------------------------------------------------------------------------
# REAL BUG (found by this audit, not a mutant): greedy_translate and beam_search called model.eval() and
# never restored the training mode, unlike `generate`. Decoding a validation batch in the middle of a training
# loop therefore switched off every dropout for the rest of training, silently. Fixed in generate.py.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decode", ["greedy", "beam"])
def test_seq2seq_decoding_restores_the_training_mode(decode):
    from test_seq2seq_decoding import _model, _sources

    model, src = _model(0), _sources(0)
    for mode in (True, False):
        model.train(mode)
        if decode == "greedy":
            greedy_translate(model, src, max_len=4)
        else:
            beam_search(model, src, beam_size=2, max_len=4)
        assert model.training is mode
        assert all(m.training is mode for m in model.modules())
