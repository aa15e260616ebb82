"""GPT invariants: causality, cache == no cache, batched == one at a time, gradients, errors."""

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.inference.generate import generate
from attnlab.models.common import SequenceTooLong
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.modules.positions import compatible_pairs


def tiny(**kw) -> GPTConfig:
    base = dict(vocab_size=31, block_size=24, d_model=16, n_heads=2, n_layers=2, dropout=0.0)
    return GPTConfig(**{**base, **kw})


def perturbed(model: GPT) -> GPT:
    """The model with noise added to every weight (fresh weights make many scores nearly equal), in eval mode."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


PAIRS = compatible_pairs()
# Short T5 buckets and Shaw clipping, so sequences of ~10 tokens reach T5's logarithmic buckets and Shaw's
# clipped distances (the defaults, 32 buckets up to 128 and 16, would leave both untested here).
SHORT = {"t5-bias": {"num_buckets": 8, "max_distance": 8}, "relative": {"max_distance": 3}}


@pytest.mark.parametrize("variant,position", PAIRS)
def test_causality(variant, position):
    torch.manual_seed(0)
    model = GPT(tiny(attention=variant, position=position, position_options=SHORT.get(position, {}))).eval()
    ids = torch.randint(0, 31, (1, 12))
    base = model(ids).logits
    for t in range(11):
        changed = ids.clone()
        changed[0, t + 1 :] = torch.randint(0, 31, (11 - t,))
        out = model(changed).logits
        torch.testing.assert_close(out[0, : t + 1], base[0, : t + 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant,position", PAIRS)
def test_cache_equals_full_pass(variant, position):
    torch.manual_seed(1)
    model = GPT(tiny(attention=variant, position=position, position_options=SHORT.get(position, {}))).eval()
    ids = torch.randint(0, 31, (2, 10))
    full = model(ids).logits
    cache = model.new_cache()
    pieces = [model(ids[:, a:b], cache=cache).logits for a, b in [(0, 4), (4, 5), (5, 8), (8, 10)]]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant,position", PAIRS)
def test_explicit_positions_with_a_cache_or_a_mask(variant, position):
    """positions= (absolute positions of the new tokens) gives the same logits cached or in one pass, with
    or without an all-ones mask. Weights are perturbed and T5's buckets and Shaw's clipping are short, so
    every position scheme's bias depends on the positions within the sequence."""
    torch.manual_seed(2)
    model = perturbed(GPT(tiny(attention=variant, position=position, position_options=SHORT.get(position, {}))))
    with torch.no_grad():
        ids = torch.randint(0, 31, (2, 8))
        pos = torch.arange(4, 12)[None]
        full = model(ids, positions=pos).logits
        cache = model.new_cache()
        pieces = [model(ids[:, a:b], positions=pos[:, a:b], cache=cache).logits for a, b in [(0, 5), (5, 6), (6, 8)]]
        masked = model(ids, positions=pos, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(masked, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant,position", PAIRS)
def test_fused_path_equals_the_explicit_path(variant, position):
    """Asking for attention weights takes the explicit softmax(QKᵀ)V path; without, the fused kernel (or the
    dispatcher's choice): the same logits, on a left-padded batch with a KV cache too."""
    torch.manual_seed(3)
    model = perturbed(GPT(tiny(attention=variant, position=position)))
    with torch.no_grad():
        ids = torch.randint(0, 31, (2, 9))
        keep = torch.ones_like(ids)
        keep[0, :3] = 0  # the first row left-padded
        fused = model(ids, attention_mask=keep).logits
        explicit = model(ids, attention_mask=keep, need_weights=True)
        assert explicit.attentions is not None
        torch.testing.assert_close(explicit.logits, fused, atol=1e-5, rtol=1e-5)
        cache = model.new_cache()
        model(ids[:, :6], attention_mask=keep[:, :6], cache=cache)
        step = model(ids[:, 6:], attention_mask=keep, cache=cache, need_weights=True).logits
        torch.testing.assert_close(step, fused[:, 6:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant,position", PAIRS)
def test_every_parameter_gets_a_gradient(variant, position):
    model = GPT(tiny(attention=variant, position=position))
    ids = torch.randint(0, 31, (2, 24))
    model(ids, labels=ids).loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing


@pytest.mark.parametrize("variant,position", PAIRS)
def test_padded_rows_equal_each_row_alone(variant, position):
    """Left and right padding with an attention mask: each row's logits at its real tokens are what the row
    gives alone, in one pass and through a KV cache (positions count real tokens only)."""
    torch.manual_seed(4)
    model = perturbed(GPT(tiny(attention=variant, position=position, position_options=SHORT.get(position, {}))))
    with torch.no_grad():
        row = torch.randint(1, 31, (1, 6))
        alone = model(row).logits
        pad = torch.zeros(1, 3, dtype=torch.long)
        left, right = torch.cat([pad, row], 1), torch.cat([row, pad], 1)
        keep_left = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
        torch.testing.assert_close(model(left, attention_mask=keep_left).logits[:, 3:], alone,
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(right, attention_mask=keep_left.flip(1)).logits[:, :6], alone,
                                   atol=1e-5, rtol=1e-5)
        cache = model.new_cache()
        first = model(left[:, :5], attention_mask=keep_left[:, :5], cache=cache).logits[:, 3:]
        rest = [model(left[:, t:t + 1], attention_mask=keep_left[:, :t + 1], cache=cache).logits
                for t in range(5, 9)]
        torch.testing.assert_close(torch.cat([first, *rest], 1), alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", ["learned", "rotary", "alibi"])
def test_batched_prompts_equal_one_at_a_time(position):
    torch.manual_seed(2)
    model = GPT(tiny(position=position)).eval()
    prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    batched = generate(model, prompts, 8, greedy=True)
    alone = [generate(model, [p], 8, greedy=True)[0] for p in prompts]
    assert batched == alone
    assert generate(model, prompts, 8, greedy=True, use_cache=False) == batched


def test_right_padded_batch_matches_unpadded_rows():
    torch.manual_seed(3)
    model = GPT(tiny()).eval()
    a, b = torch.randint(0, 31, (1, 9)), torch.randint(0, 31, (1, 5))
    ids = torch.zeros(2, 9, dtype=torch.long)
    ids[0], ids[1, :5] = a[0], b[0]
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    out = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(out[0], model(a).logits[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :5], model(b).logits[0], atol=1e-5, rtol=1e-5)


def test_sampling_is_deterministic_with_a_seed_and_respects_top_k():
    model = GPT(tiny()).eval()
    a = generate(model, [[1, 2]], 12, temperature=1.0, top_k=3, seed=7)
    assert a == generate(model, [[1, 2]], 12, temperature=1.0, top_k=3, seed=7)
    b = generate(model, [[1, 2]], 12, top_p=0.5, seed=7)
    assert len(b[0]) == 12


def test_eos_stops_generation():
    model = GPT(tiny()).eval()
    first = generate(model, [[1, 2]], 1, greedy=True)[0][0]
    assert generate(model, [[1, 2]], 10, greedy=True, eos_id=first) == [[first]]


def test_too_long_input_is_a_clear_error():
    model = GPT(tiny())
    with pytest.raises(SequenceTooLong, match="longer than the model allows"):
        model(torch.zeros(1, 25, dtype=torch.long))


@pytest.mark.parametrize("fast", [True, False])
def test_generation_past_the_block_slides_the_window(fast, monkeypatch):
    # Each token past the 24 positions is the model's choice over the last 24 tokens alone; the KV cache serves
    # until the block is full (the same tokens as recomputing every step), rows of any length together.
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5]]
    out = generate(model, prompts, 30, greedy=True, fast=fast)
    with torch.no_grad():
        for prompt, new in zip(prompts, out, strict=True):
            seq = list(prompt)
            for token in new:
                window = torch.tensor([seq[-24:]])
                assert token == int(model(window).logits[0, -1].argmax())
                seq.append(token)
    assert generate(model, prompts, 30, greedy=True, use_cache=False) == out
    forward, lengths = GPT.forward, []

    def counted(self, input_ids, *args, **kwargs):
        lengths.append(input_ids.shape[1])
        return forward(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", counted)
    assert generate(model, prompts[:1], 30, greedy=True, fast=False) == out[:1]
    assert lengths == [8] + [1] * 16 + [24] * 13  # cached to the 24th position, then the window recomputed


def test_attention_weights_and_hidden_states():
    model = GPT(tiny()).eval()
    out = model(torch.randint(0, 31, (2, 7)), need_weights=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 2, 7, 7)
    assert torch.allclose(out.attentions[0].sum(-1), torch.ones(2, 2, 7))
    assert len(out.hidden_states) == 3
    fused = model(torch.randint(0, 31, (2, 7)))
    assert fused.attentions is None


def test_config_errors_name_the_allowed_values():
    with pytest.raises(ConfigError, match="choose one of"):
        tiny(position="rotory")
    with pytest.raises(ConfigError, match="divisible"):
        tiny(n_heads=3)
    with pytest.raises(ConfigError, match="rotates"):
        tiny(attention="bilinear", position="rotary")
    with pytest.raises(ConfigError, match="unknown setting model.n_layer"):
        GPTConfig.from_dict({"n_layer": 2}, where="model")
