"""Position schemes against their definitions: the sinusoidal table and its rotation property (and the
course notes' worked example), rotary relativity, ALiBi slopes, T5 buckets, Shaw relative keys
against a naive loop, learned positions, and the registry's errors."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.modules.positions import (
    POSITIONS,
    alibi_slopes,
    build_position,
    sinusoidal_rotation,
    sinusoidal_table,
    t5_bucket,
)

ATOL = 1e-5


# --------------------------------------------------------------------------------------------------
# Sinusoidal
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", [100.0, 10000.0])
@pytest.mark.parametrize("d_model", [4, 16])
def test_sinusoidal_rotation_property(d_model, base):
    """PE(i + k) = A(k)·PE(i) for EVERY i, k with i + k < 64; A(k) is orthogonal, A(0) = I and
    A(a)·A(b) = A(a + b): the offset k is a fixed linear map, whatever the position i."""
    n = 64
    table = sinusoidal_table(torch.arange(n), d_model, base)  # (n, d)
    rotations = torch.stack([sinusoidal_rotation(k, d_model, base) for k in range(n)])  # (n, d, d)
    eye = torch.eye(d_model)
    for k in range(n):
        moved = table[: n - k] @ rotations[k].T  # row i: A(k)·PE(i)
        torch.testing.assert_close(moved, table[k:], atol=ATOL, rtol=0)
        torch.testing.assert_close(rotations[k] @ rotations[k].T, eye, atol=ATOL, rtol=0)
    torch.testing.assert_close(rotations[0], eye, atol=0, rtol=0)
    for a in range(n):
        for b in range(n - a):
            torch.testing.assert_close(rotations[a] @ rotations[b], rotations[a + b], atol=ATOL, rtol=0)


def test_sinusoidal_table_matches_the_formula():
    d, base = 16, 10000.0
    positions = torch.arange(40)
    expected = torch.empty(40, d, dtype=torch.float64)
    for p in range(40):
        for m in range(d // 2):
            angle = p / base ** (2 * m / d)
            expected[p, 2 * m], expected[p, 2 * m + 1] = math.sin(angle), math.cos(angle)
    torch.testing.assert_close(sinusoidal_table(positions, d, base), expected.float(), atol=1e-6, rtol=0)


def test_course_notes_table_i_am_a_robot():
    """d_model 4, base 100, "I am a robot" at positions 0..3 (the notes print 2 decimals)."""
    table = sinusoidal_table(torch.arange(4), 4, base=100.0)
    assert torch.equal(table[0], torch.tensor([0.0, 1.0, 0.0, 1.0]))
    assert [round(float(x), 2) for x in table[1]] == [0.84, 0.54, 0.10, 1.00]
    assert [round(float(x), 2) for x in table[3]] == [0.14, -0.99, 0.30, 0.96]


def test_sinusoidal_scheme_beyond_its_table_equals_the_formula():
    scheme = build_position("sinusoidal", d_model=8, n_heads=2, max_len=10, causal=False)
    positions = torch.arange(30)[None, :]  # 20 positions past the precomputed table
    x = torch.randn(1, 30, 8)
    expected = x + sinusoidal_table(torch.arange(30), 8)
    torch.testing.assert_close(scheme.embed(x, positions), expected, atol=ATOL, rtol=0)
    assert not list(scheme.parameters())


def test_sinusoidal_base_option_is_used():
    scheme = build_position("sinusoidal", d_model=4, n_heads=1, max_len=8, causal=False, base=100.0)
    out = scheme.embed(torch.zeros(1, 4, 4), torch.arange(4)[None, :])
    torch.testing.assert_close(out[0], sinusoidal_table(torch.arange(4), 4, base=100.0), atol=0, rtol=0)


# --------------------------------------------------------------------------------------------------
# Learned
# --------------------------------------------------------------------------------------------------


def test_learned_positions_add_a_trainable_vector_per_position():
    scheme = build_position("learned", d_model=8, n_heads=2, max_len=12, causal=False)
    assert scheme.max_len == 12 and scheme.embedding.weight.shape == (12, 8)
    x = torch.randn(2, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])  # per-row positions
    out = scheme.embed(x, positions)
    torch.testing.assert_close(out, x + scheme.embedding.weight[positions], atol=0, rtol=0)
    out.sum().backward()
    grad = scheme.embedding.weight.grad
    used = positions.unique()
    assert (grad[used] != 0).all() and (grad[[5, 6]] == 0).all()


# --------------------------------------------------------------------------------------------------
# Rotary
# --------------------------------------------------------------------------------------------------


def _rotary(max_len: int = 64):
    return build_position("rotary", d_model=32, n_heads=4, max_len=max_len, causal=True)


def test_rotary_scores_depend_only_on_the_offset():
    rope = _rotary()
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    pos = torch.tensor([[0, 3, 4, 9, 10, 20]])
    for shift in (1, 7, 30):
        a = rope.rotate_q(q, pos) @ rope.rotate_k(k, pos).transpose(-1, -2)
        b = rope.rotate_q(q, pos + shift) @ rope.rotate_k(k, pos + shift).transpose(-1, -2)
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    # One query vector and one key vector placed at every position: the score matrix is Toeplitz.
    t = 12
    qq = torch.randn(1, 4, 1, 8).expand(1, 4, t, 8)
    kk = torch.randn(1, 4, 1, 8).expand(1, 4, t, 8)
    pos = torch.arange(t)[None, :]
    scores = rope.rotate_q(qq, pos) @ rope.rotate_k(kk, pos).transpose(-1, -2)  # (1, H, T, T)
    torch.testing.assert_close(scores[..., 1:, 1:], scores[..., :-1, :-1], atol=1e-5, rtol=0)
    assert not torch.allclose(scores[..., 0, 0], scores[..., 0, 5])  # but it does depend on the offset


def test_rotary_equals_the_pairwise_rotation_formula():
    """Channel m is paired with m + Dh/2 and turned by the angle p·base^(-2m/Dh) (GPT-NeoX / HF layout)."""
    rope, dh, half = _rotary(), 8, 4
    x = torch.randn(1, 1, 3, dh)
    pos = torch.tensor([[0, 5, 70]])  # 70 is past the precomputed table
    expected = torch.empty_like(x)
    for i, p in enumerate(pos[0].tolist()):
        for m in range(half):
            angle = p * 10000.0 ** (-2 * m / dh)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[0, 0, i, m], x[0, 0, i, m + half]
            expected[0, 0, i, m], expected[0, 0, i, m + half] = a * c - b * s, b * c + a * s
    torch.testing.assert_close(rope.rotate_q(x, pos), expected, atol=ATOL, rtol=0)


def test_rotary_preserves_norm_and_is_identity_at_zero():
    rope = _rotary()
    q = torch.randn(2, 4, 5, 8)
    pos = torch.tensor([[0, 1, 2, 33, 63]])
    rotated = rope.rotate_q(q, pos)
    torch.testing.assert_close(rotated.norm(dim=-1), q.norm(dim=-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(rotated[:, :, 0], q[:, :, 0], atol=0, rtol=0)


def test_rotary_beyond_its_table_equals_a_larger_table():
    short, long = _rotary(max_len=8), _rotary(max_len=64)
    q = torch.randn(1, 4, 40, 8)
    pos = torch.arange(40)[None, :]
    torch.testing.assert_close(short.rotate_k(q, pos), long.rotate_k(q, pos), atol=1e-6, rtol=0)


def test_rotary_reads_the_angles_of_one_positions_tensor_once(monkeypatch):
    """Every layer rotates q and k by the model's one positions tensor: the largest position is read back from
    the device (a GPU sync) once per forward, and a positions tensor changed in place gets its new angles."""
    from attnlab.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=11, block_size=16, d_model=16, n_heads=2, n_layers=3, position="rotary"))
    reads = []
    real_max = torch.Tensor.max
    monkeypatch.setattr(torch.Tensor, "max", lambda self, *a, **k: reads.append(1) or real_max(self, *a, **k))
    model(torch.randint(0, 11, (2, 7)))
    assert len(reads) == 1  # not 2 per layer (6)

    rope = _rotary(max_len=8)
    pos = torch.arange(5)[None, :]
    first = rope.angles_at(pos)
    assert rope.angles_at(pos)[0] is first[0]
    pos += 6  # now partly beyond the table: computed, not stale
    torch.testing.assert_close(rope.angles_at(pos)[0], _rotary(max_len=64).angles_at(pos.clone())[0])
    # Angles kept from an inference_mode forward are not handed to a training one (autograd refuses them).
    x, fresh = torch.randn(1, 2, 5, 8, requires_grad=True), torch.arange(5)[None, :]
    with torch.inference_mode():
        rope.rotate_q(torch.randn(1, 2, 5, 8), fresh)
    rope.rotate_q(x, fresh).sum().backward()
    assert x.grad is not None
    with torch.inference_mode():  # positions made in inference mode (no version counter) work, twice
        made_there = torch.arange(5)[None, :]
        for _ in range(2):
            torch.testing.assert_close(rope.angles_at(made_there)[1], rope.sin[:5][None])


def test_rotary_rejects_an_odd_head_width():
    with pytest.raises(ConfigError, match="even head width"):
        build_position("rotary", d_model=12, n_heads=4, max_len=8, causal=True)


# --------------------------------------------------------------------------------------------------
# ALiBi
# --------------------------------------------------------------------------------------------------


def test_alibi_slopes_for_eight_heads_are_powers_of_one_half():
    expected = torch.tensor([2.0 ** -i for i in range(1, 9)])
    torch.testing.assert_close(alibi_slopes(8), expected, atol=0, rtol=0)


def test_alibi_slopes_for_other_head_counts():
    assert alibi_slopes(4).tolist() == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]
    # Press et al.'s rule for 12 heads: the 8-head slopes, then every other 16-head slope (2^-0.5, ...).
    expected_12 = [2.0 ** -i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected_12), atol=1e-7, rtol=0)
    for n in (1, 2, 3, 5, 6, 7, 12, 24):
        slopes = alibi_slopes(n)
        assert slopes.shape == (n,)
        assert ((slopes > 0) & (slopes <= 1)).all()
        assert len(set(slopes.tolist())) == n


def test_alibi_bias_is_zero_on_the_diagonal_and_falls_with_distance():
    scheme = build_position("alibi", d_model=16, n_heads=4, max_len=32, causal=True)
    assert not list(scheme.parameters())
    pos = torch.arange(9)[None, :]
    bias = scheme.score_bias(torch.randn(1, 4, 9, 4), pos, pos, 4)  # (1, H, T, S)
    assert bias.shape == (1, 4, 9, 9)
    assert (bias.diagonal(dim1=-2, dim2=-1) == 0).all()
    i, j = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
    expected = -alibi_slopes(4)[:, None, None] * (i - j).abs()
    torch.testing.assert_close(bias[0], expected, atol=0, rtol=0)
    row = bias[0, :, 8]  # the last query: the further back the key, the lower the bias
    assert (row[:, 1:] > row[:, :-1]).all()


# --------------------------------------------------------------------------------------------------
# T5 buckets
# --------------------------------------------------------------------------------------------------


def _t5_reference(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Mesh TensorFlow's `_relative_position_bucket`, one scalar at a time."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if rel > 0:
            bucket += num_buckets
        n = abs(rel)
    else:
        n = max(-rel, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    log_ratio = math.log(n / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + int(log_ratio * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 16)])
def test_t5_buckets(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-300, 301)  # j - i
    buckets = t5_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    expected = [_t5_reference(int(r), bidirectional, num_buckets, max_distance) for r in rel]
    assert buckets.tolist() == expected
    past = buckets[rel <= 0].flip(0)  # distance 0, 1, 2 ... into the past
    future = buckets[rel >= 0]  # distance 0, 1, 2 ... into the future
    assert (past[1:] >= past[:-1]).all()  # monotone in distance
    half = num_buckets // 2 if bidirectional else num_buckets
    exact = half // 2
    assert past[:exact].tolist() == list(range(exact))  # exact for small distances
    assert (past[max_distance:] == half - 1).all()  # clipped at max_distance
    if bidirectional:  # the future uses the upper half, the past the lower one
        assert (future[1:] >= future[:-1]).all()
        assert future[1:exact].tolist() == [half + d for d in range(1, exact)]
        assert (future[1:] >= half).all() and (past < half).all()
        assert (future[max_distance:] == num_buckets - 1).all()
        # Distance 0 counts as the past, so bucket `half` (future distance 0) is never used, as in T5.
        assert set(buckets.tolist()) == set(range(num_buckets)) - {half}
    else:  # the future is bucket 0, like distance 0
        assert (future == 0).all()
        assert set(buckets.tolist()) == set(range(num_buckets))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_t5_bias_scheme_reads_its_table_per_head(causal):
    scheme = build_position("t5-bias", d_model=16, n_heads=4, max_len=32, causal=causal, num_buckets=8,
                            max_distance=16)
    q_pos, k_pos = torch.arange(3, 8)[None, :], torch.arange(10)[None, :]
    bias = scheme.score_bias(torch.randn(1, 4, 5, 4), q_pos, k_pos, 4)
    rel = k_pos[:, None, :] - q_pos[:, :, None]
    buckets = t5_bucket(rel, bidirectional=not causal, num_buckets=8, max_distance=16)
    torch.testing.assert_close(bias, scheme.embedding.weight[buckets].permute(0, 3, 1, 2), atol=0, rtol=0)


# --------------------------------------------------------------------------------------------------
# Shaw relative
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_distance", [2, 16])
def test_shaw_relative_equals_naive(max_distance):
    scheme = build_position("relative", d_model=16, n_heads=2, max_len=32, causal=False,
                            max_distance=max_distance)
    with torch.no_grad():
        scheme.embedding.weight.normal_()
    b, h, t, s, dh = 2, 2, 5, 7, 8
    q = torch.randn(b, h, t, dh)
    q_pos = torch.tensor([[2, 3, 4, 5, 6], [0, 1, 2, 3, 4]])  # per-row positions (after a cache)
    k_pos = torch.arange(s)[None, :]
    bias = scheme.score_bias(q, q_pos, k_pos, h)
    a = scheme.embedding.weight
    expected = torch.empty(b, h, t, s)
    for bi in range(b):
        for i in range(t):
            for j in range(s):
                d = int(k_pos[0, j] - q_pos[bi, i])
                d = max(-max_distance, min(max_distance, d))
                for hi in range(h):
                    expected[bi, hi, i, j] = q[bi, hi, i] @ a[d + max_distance] / math.sqrt(dh)
    torch.testing.assert_close(bias, expected, atol=ATOL, rtol=0)


# --------------------------------------------------------------------------------------------------
# Registry errors
# --------------------------------------------------------------------------------------------------


def test_unknown_scheme_names_the_allowed_ones():
    with pytest.raises(ConfigError) as info:
        build_position("rotery", d_model=16, n_heads=4, max_len=8, causal=True)
    message = str(info.value)
    assert "rotery" in message and "rotary" in message
    for name in POSITIONS.names():
        assert name in message


@pytest.mark.parametrize("name,bad,known", [("sinusoidal", "bsae", "base"),
                                             ("relative", "max_distanse", "max_distance"),
                                             ("t5-bias", "buckets", "num_buckets"),
                                             ("alibi", "slope", "none")])
def test_unknown_option_names_the_known_ones(name, bad, known):
    with pytest.raises(ConfigError) as info:
        build_position(name, d_model=16, n_heads=4, max_len=8, causal=True, **{bad: 1})
    assert bad in str(info.value) and known in str(info.value)


def test_every_registered_scheme_builds():
    expected = {"none", "sinusoidal", "learned", "rotary", "relative", "t5-bias", "alibi"}
    assert set(POSITIONS.names()) == expected
    x = torch.randn(1, 4, 16)
    for name in expected:
        scheme = build_position(name, d_model=16, n_heads=4, max_len=8, causal=False)
        assert scheme.embed(x, torch.arange(4)[None, :]).shape == x.shape


@pytest.mark.parametrize("name", sorted(POSITIONS.names()))
def test_no_float64_tensor_moves_with_the_model(name):
    """MPS has no float64: a scheme holding a float64 parameter or buffer could not be moved there. The
    float64 frequencies of the sinusoidal and rotary schemes stay on the CPU, and what they compute beyond
    their tables comes back as float32 on the positions' device."""
    scheme = build_position(name, d_model=16, n_heads=4, max_len=8, causal=True)
    tensors = list(scheme.parameters()) + list(scheme.buffers())
    assert all(t.dtype != torch.float64 for t in tensors), [t.dtype for t in tensors]
    beyond = torch.arange(6, 12)[None]
    if name == "rotary":
        cos, sin = scheme.angles_at(beyond[0])
        assert cos.dtype == sin.dtype == torch.float32
        torch.testing.assert_close(cos, build_position(name, d_model=16, n_heads=4, max_len=16, causal=True).cos[6:12])
    if name == "sinusoidal":
        pe = scheme.embed(torch.zeros(1, 6, 16), beyond)
        assert pe.dtype == torch.float32
        torch.testing.assert_close(pe[0], sinusoidal_table(torch.arange(6, 12), 16))


@pytest.mark.parametrize("name", ["sinusoidal", "rotary", "alibi"])
def test_a_float64_model_has_float64_accurate_positions(name):
    """The fixed tables are computed in float64 and kept in float32; `.double()` recomputes them rather than
    widening float32 values (which left a float64 model with positions good to ~1e-7), also beyond the
    tables, and `.float()` brings back the float32 tables bit for bit."""
    scheme = build_position(name, d_model=16, n_heads=12 if name == "alibi" else 4, max_len=8, causal=True)
    before = {n: b.clone() for n, b in scheme.named_buffers()}
    scheme.double()
    if name == "sinusoidal":
        exact = sinusoidal_table(torch.arange(12), 16, dtype=torch.float64)
        torch.testing.assert_close(scheme.table, exact[:8], atol=0, rtol=0)
        beyond = scheme.embed(torch.zeros(1, 4, 16, dtype=torch.float64), torch.arange(8, 12)[None])
        torch.testing.assert_close(beyond[0], exact[8:], atol=0, rtol=0)
    if name == "rotary":
        inner = 1 / 10000 ** (torch.arange(0, 4, 2, dtype=torch.float64) / 4)
        for positions in (torch.arange(8), torch.arange(8, 12)):  # the table, then beyond it
            cos, sin = scheme.angles_at(positions)
            angles = positions.double()[:, None] * torch.cat([inner, inner])
            torch.testing.assert_close(cos, angles.cos(), atol=1e-15, rtol=0)
            torch.testing.assert_close(sin, angles.sin(), atol=1e-15, rtol=0)
    if name == "alibi":
        torch.testing.assert_close(scheme.slopes, alibi_slopes(12, torch.float64), atol=0, rtol=0)
        assert (scheme.slopes - before["slopes"].double()).abs().max() > 0  # 2^(-1/2)... are not float32 numbers
    scheme.float()
    for n, b in scheme.named_buffers():
        assert b.dtype == torch.float32 and torch.equal(b, before[n]), n


def test_rotary_scores_depend_only_on_the_offset_to_float64_precision_in_a_float64_model():
    scheme = build_position("rotary", d_model=64, n_heads=4, max_len=512, causal=True).double()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1, 16, generator=g, dtype=torch.float64)
    k = torch.randn(1, 4, 1, 16, generator=g, dtype=torch.float64)

    def score(i: int, j: int) -> torch.Tensor:
        return (scheme.rotate_q(q, torch.tensor([[i]])) * scheme.rotate_k(k, torch.tensor([[j]]))).sum(-1)

    for i, j in ((300, 100), (511, 311), (700, 500)):  # the last beyond the table
        torch.testing.assert_close(score(i, j), score(200, 0), atol=1e-12, rtol=0)


def test_rotary_angles_kept_for_a_positions_tensor_follow_a_conversion():
    scheme = build_position("rotary", d_model=16, n_heads=4, max_len=8, causal=True)
    positions = torch.arange(4)
    assert scheme.angles_at(positions)[0].dtype == torch.float32
    scheme.double()
    assert scheme.angles_at(positions)[0].dtype == torch.float64


@pytest.mark.parametrize("name", ["sinusoidal", "rotary", "alibi"])
def test_a_model_built_for_float64_has_float64_tables(name):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        built = build_position(name, d_model=16, n_heads=12 if name == "alibi" else 4, max_len=8, causal=True)
    finally:
        torch.set_default_dtype(previous)
    converted = build_position(name, d_model=16, n_heads=12 if name == "alibi" else 4, max_len=8,
                               causal=True).double()
    for (n, b), (_, c) in zip(built.named_buffers(), converted.named_buffers()):
        assert b.dtype == torch.float64 and torch.equal(b, c), n


@pytest.mark.parametrize("family", ["gpt", "bert"])
@pytest.mark.parametrize("bad", [8, -1])
def test_explicit_positions_outside_a_learned_table_are_refused_in_words(family, bad):
    # A learned table's lookup raised "IndexError: index out of range in self" from inside the embedding, where the
    # Synthesizer already refused such positions in one line (stop-33 audit).
    from attnlab.models.bert import BertConfig, BertModel
    from attnlab.models.common import SequenceTooLong
    from attnlab.models.gpt import GPT, GPTConfig

    ids, given = torch.tensor([[1, 2, 3]]), torch.tensor([[bad, 2, 3]])
    if family == "gpt":
        model, call = GPT(GPTConfig(vocab_size=65, block_size=8, d_model=16, n_heads=2, n_layers=1)), "positions"
    else:
        model = BertModel(BertConfig(vocab_size=65, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32))
        call = "position_ids"
    with pytest.raises(SequenceTooLong, match=f"{call} must lie in 0 to 7 \\(the model's positions\\), got {bad}"):
        model(ids, **{call: given})
    assert model(ids, **{call: torch.tensor([[5, 6, 7]])}).logits.shape[:2] == (1, 3)
