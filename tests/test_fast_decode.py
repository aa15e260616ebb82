"""The low-overhead decoder gives what the general forward gives: same logits, same tokens."""

from __future__ import annotations

import pytest
import torch

from attnlab.inference import fast_decode
from attnlab.inference.fast_decode import FastGPTDecoder
from attnlab.inference.generate import generate
from attnlab.models.gpt import GPT, GPTConfig


def _gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    settings = dict(vocab_size=23, block_size=40, d_model=32, n_heads=4, n_layers=2)
    model = GPT(GPTConfig(**{**settings, **overrides})).eval()
    with torch.no_grad():  # non-zero biases and norm gains, so a missed term would show
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


SUPPORTED = [
    {},
    {"position": "sinusoidal", "activation": "gelu-tanh"},
    {"position": "none", "activation": "relu", "bias": False},
    {"tie_embeddings": False, "d_ff": 48},
    {"position": "rotary"},
    {"position": "alibi"},
    {"position": "t5-bias", "activation": "relu"},
]


@pytest.mark.parametrize("overrides", SUPPORTED)
def test_step_logits_equal_the_full_forward(overrides):
    model = _gpt(**overrides)
    assert FastGPTDecoder.supports(model)
    ids = torch.randint(0, 23, (3, 12), generator=torch.Generator().manual_seed(1))
    full = model(ids).logits  # (B, T, V)
    decoder = FastGPTDecoder(model, batch=3, capacity=12)
    logits = [decoder.step(ids[:, :5])]  # the prompt at once, then one token at a time
    logits += [decoder.step(ids[:, t : t + 1]) for t in range(5, 12)]
    torch.testing.assert_close(torch.stack(logits, 1), full[:, 4:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", SUPPORTED)
def test_generate_gives_the_same_tokens_fast_or_not(overrides):
    model = _gpt(**overrides)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]  # equal lengths: the fast path applies
    for options in ({"greedy": True}, {"temperature": 0.8, "top_k": 5, "seed": 3}):
        fast = generate(model, prompts, 20, **options)
        general = generate(model, prompts, 20, fast=False, **options)
        assert fast == general


@pytest.mark.parametrize("overrides", SUPPORTED)
def test_padded_rows_give_the_logits_of_the_general_forward(overrides):
    """Left-padded rows of different lengths: each row counts positions over its real tokens and never
    attends to padding, exactly as the general forward with an attention mask."""
    model = _gpt(**overrides)
    ids = torch.randint(1, 23, (3, 12), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :3] = 0  # 3 pads, then 2 prompt tokens
    mask[2, :1] = 0
    ids = ids.masked_fill(mask == 0, 0)
    full = model(ids, attention_mask=mask).logits  # (B, T, V)
    decoder = FastGPTDecoder(model, batch=3, capacity=12, mask=mask)
    logits = [decoder.step(ids[:, :5])] + [decoder.step(ids[:, t : t + 1]) for t in range(5, 12)]
    torch.testing.assert_close(torch.stack(logits, 1), full[:, 4:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", SUPPORTED)
def test_prompts_of_different_lengths_give_the_same_tokens_fast_or_not(overrides):
    model = _gpt(**overrides)
    prompts = [[1, 2, 3, 4, 5, 6], [7], [8, 9, 10]]
    for options in ({"greedy": True}, {"temperature": 0.8, "top_k": 5, "seed": 3}, {"greedy": True, "eos_id": 4}):
        fast = generate(model, prompts, 15, **options)
        assert fast == generate(model, prompts, 15, fast=False, **options)
        if options.get("greedy"):  # and each row as it would be alone
            assert fast == [generate(model, [p], 15, **options)[0] for p in prompts]


@pytest.mark.parametrize("overrides", [{"position": "relative"}, {"attention": "bilinear"},
                                       {"attention": "bilinear", "position": "alibi"},
                                       {"attention": "synthesizer-dense"}, {"norm": "post"}])
def test_other_configurations_take_the_general_path(overrides):
    model = _gpt(**overrides)
    assert not FastGPTDecoder.supports(model)
    assert len(generate(model, [[1, 2, 3]], 5, greedy=True)[0]) == 5


@pytest.mark.parametrize("batch", [1, 2, 6])
@pytest.mark.parametrize("slices", [2, 3, 5])
def test_sliced_products_give_the_same_logits(monkeypatch, slices, batch):
    """On a multi-core CPU, fp32 weights too large for the cache are multiplied in slices (one per thread):
    blocks of weight rows times the inputs for a few rows, the inputs times column slices for more (6 rows,
    and the prompt); the logits stay those of the full forward. 5 divides no width here (32, 96, 128, 23):
    the products fall back to the largest slice count that divides theirs."""
    monkeypatch.setattr(fast_decode, "_slices", lambda *args: slices)
    model = _gpt()
    ids = torch.randint(0, 23, (batch, 10), generator=torch.Generator().manual_seed(2))
    decoder = FastGPTDecoder(model, batch=batch, capacity=10)
    assert decoder.slices == slices
    logits = [decoder.step(ids[:, :4])] + [decoder.step(ids[:, t : t + 1]) for t in range(4, 10)]
    torch.testing.assert_close(torch.stack(logits, 1), model(ids).logits[:, 3:], atol=1e-5, rtol=1e-5)


def test_slicing_is_chosen_for_fp32_weights_beyond_the_cache(monkeypatch):
    model = _gpt()
    monkeypatch.setattr(fast_decode, "cpu_is_amd", lambda: True)
    assert FastGPTDecoder(model, batch=1, capacity=4).slices == 1  # a tiny model sits in any cache
    monkeypatch.setattr(fast_decode, "cpu_last_level_cache_bytes", lambda: 0)
    expected = min(torch.get_num_threads(), 16) if torch.get_num_threads() > 1 else 1
    assert FastGPTDecoder(model, batch=1, capacity=4).slices == expected
    assert FastGPTDecoder(model.bfloat16(), batch=1, capacity=4).slices == 1  # half precision: threaded already
    # (stop 42) not on Intel CPUs, whose MKL ran the sliced products slower than whole ones
    monkeypatch.setattr(fast_decode, "cpu_is_amd", lambda: False)
    assert FastGPTDecoder(model, batch=1, capacity=4).slices == 1


def test_decoder_refuses_misuse():
    model = _gpt()
    decoder = FastGPTDecoder(model, batch=1, capacity=6)
    decoder.step(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="one token at a time"):
        decoder.step(torch.tensor([[1, 2]]))
    decoder.step(torch.tensor([[4]]))
    decoder.step(torch.tensor([[5]]))
    decoder.step(torch.tensor([[6]]))
    with pytest.raises(ValueError, match="capacity"):
        decoder.step(torch.tensor([[7]]))
    with pytest.raises(ValueError, match="pre-norm GPT"):
        FastGPTDecoder(_gpt(position="relative"), batch=1, capacity=4)
    with pytest.raises(ValueError, match="beyond the model's 40 positions"):  # learned positions end at 40
        FastGPTDecoder(model, batch=1, capacity=41)
    with pytest.raises(ValueError, match="mask must be"):
        FastGPTDecoder(model, batch=2, capacity=6, mask=torch.ones(2, 5))


@pytest.mark.parametrize(("dtype", "tol"), [(torch.bfloat16, 6e-3), (torch.float16, 1e-3)])
def test_half_precision_weights_decode_close_to_fp32(dtype, tol):
    """`attnlab generate --dtype bf16|fp16` converts the weights; the fast decoder then runs in that dtype and
    its logits stay within half-precision rounding of the fp32 model's, and of the general forward in that
    dtype."""
    model = _gpt()
    ids = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(1))
    reference = model(ids).logits[:, 4:]
    half = _gpt().to(dtype)
    general = half(ids).logits[:, 4:].float()
    decoder = FastGPTDecoder(half, batch=2, capacity=12)
    logits = [decoder.step(ids[:, :5])] + [decoder.step(ids[:, t : t + 1]) for t in range(5, 12)]
    fast = torch.stack(logits, 1)
    assert fast.dtype == dtype
    # Logits of this model are ~0.2: bf16 rounding moved them by ~2e-3 here, fp16 by ~2e-4.
    torch.testing.assert_close(fast.float(), general, atol=tol, rtol=0)
    torch.testing.assert_close(fast.float(), reference, atol=tol, rtol=0)


@pytest.mark.parametrize("n", [16, 1536, 20000])
def test_gelu_is_the_exact_gelu_at_every_size(n):
    """attnlab's GELU takes torch's own kernel for small inputs, oneDNN's for large ones: the same function
    either way, and oneDNN is left switched as it was found."""
    from attnlab.modules.feedforward import gelu as _native_gelu

    x = torch.randn(3, n, generator=torch.Generator().manual_seed(0)) * 4
    before = torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()
    torch.testing.assert_close(_native_gelu(x), torch.nn.functional.gelu(x), atol=1e-6, rtol=1e-6)
    assert (torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()) == before


def test_onednn_off_switches_off_within_the_block_and_restores_what_it_found():
    """The one oneDNN switch (GELU, the decoders): off inside, restored on the way out, an error included, to
    on or off as it was found; `on=False` changes nothing (mutant: a switch left off after the block)."""
    from attnlab.training.device import onednn_off

    found = torch._C._get_mkldnn_enabled()
    try:
        for start in (True, False):
            torch._C._set_mkldnn_enabled(start)
            with onednn_off():
                assert not torch._C._get_mkldnn_enabled()
            assert torch._C._get_mkldnn_enabled() == start
            with pytest.raises(RuntimeError, match="inside"), onednn_off():
                raise RuntimeError("inside")
            assert torch._C._get_mkldnn_enabled() == start
            with onednn_off(False):
                assert torch._C._get_mkldnn_enabled() == start
    finally:
        torch._C._set_mkldnn_enabled(found)


def _overlapping_in_two_threads(block) -> None:
    """Enter `block()` in one thread, then in a second, and leave the first one first: the order in which a
    save-and-restore switch writes back the value it found inside the other block."""
    import threading

    entered, first_left = threading.Event(), threading.Event()

    def second():
        with block():
            entered.set()
            first_left.wait(10)

    with block():
        thread = threading.Thread(target=second)
        thread.start()
        entered.wait(10)
    first_left.set()
    thread.join(10)


def test_onednn_off_in_overlapping_threads_gives_the_switch_back():
    # Each block saved and restored the switch: the second thread found it off and, leaving last, left oneDNN off
    # for the process (bf16 products 16x slower from then on; stop-33 bf16 audit).
    from attnlab.training.device import onednn_off

    found = torch._C._get_mkldnn_enabled()
    try:
        torch._C._set_mkldnn_enabled(True)
        _overlapping_in_two_threads(onednn_off)
        assert torch._C._get_mkldnn_enabled()
    finally:
        torch._C._set_mkldnn_enabled(found)


def test_fp32_matmuls_on_onednn_in_overlapping_threads_give_the_switch_back():
    # Two fp32 runs of wide models in two threads left fp32 matmuls on oneDNN after both had returned.
    from attnlab.training import device

    if not device.onednn_fp32_is_exact():
        pytest.skip("fp32 matmuls do not go to oneDNN on this CPU")
    backend = device._onednn_matmul_backend()
    found = backend.fp32_precision
    _overlapping_in_two_threads(lambda: device.fast_fp32_matmul("cpu"))
    assert backend.fp32_precision == found


def test_the_onednn_fp32_check_tests_onednn_when_asked_inside_onednn_off(tmp_path):
    # Asked first inside `onednn_off`, the probe's product took MKL, passed, and the cached answer stood: on a CPU
    # where oneDNN computes fp32 in bf16 (AMX), wide fp32 runs would have trained in bf16.
    import os
    import subprocess
    import sys

    from attnlab.training import device

    if device._onednn_matmul_backend() is None or not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN fp32 switch in this torch")
    code = ("from attnlab.training.device import onednn_off, onednn_fp32_is_exact\n"
            "probe = onednn_fp32_is_exact.__wrapped__\n"
            "probe()\nprint('inside onednn_off', flush=True)\n"
            "with onednn_off():\n    probe()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ONEDNN_VERBOSE": "1"})
    assert done.returncode == 0, done.stderr
    outside, inside = done.stdout.split("inside onednn_off")
    products = [sum(",exec," in line and "matmul" in line for line in part.splitlines()) for part in (outside, inside)]
    if not products[0]:
        pytest.skip("this torch does not send the probe's fp32 product to oneDNN here")
    assert products[1] == products[0], done.stdout[-2000:]


ONEDNN_BF16 = pytest.mark.skipif(not fast_decode._onednn_linear_works(),
                                 reason="this torch build or CPU has no oneDNN bf16 linear")


def _force_packing(monkeypatch, on: bool = True) -> None:
    """Packed bf16 products on (for bf16 weights, one row too) or off, whether or not this CPU has bf16
    instructions (without them oneDNN computes the same numbers, only slower)."""
    monkeypatch.setattr(fast_decode, "_packs", lambda weight: on and weight.dtype == torch.bfloat16)
    monkeypatch.setattr(fast_decode, "_own_gemv", lambda weight: False)


def _packed_decoder(monkeypatch, model, **kwargs):
    """The decoder with oneDNN's packed bf16 products (see `_force_packing`)."""
    _force_packing(monkeypatch)
    decoder = FastGPTDecoder(model, **kwargs)
    assert decoder.packed and decoder.k.dtype == torch.float32  # an fp32 cache of the bf16 keys and values
    return decoder


@ONEDNN_BF16
@pytest.mark.parametrize("overrides", SUPPORTED)
def test_packed_bf16_products_give_the_unpacked_logits(monkeypatch, overrides):
    """bf16 weights on a CPU with bf16 instructions are multiplied by oneDNN's packed copies, with GELU or
    ReLU applied inside the fc1 product, attention over an fp32 cache: within bf16 rounding of the plain
    bf16 decoder and of the general forward, with the same tokens."""
    model = _gpt(**overrides).bfloat16()
    ids = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(1))
    _force_packing(monkeypatch, on=False)
    plain = FastGPTDecoder(model, batch=2, capacity=12)
    assert not plain.packed
    packed = _packed_decoder(monkeypatch, model, batch=2, capacity=12)
    fused = {"gelu": "gelu", "relu": "relu"}.get(model.config.activation, "none")
    assert all(layer.fc1_act == fused and (layer.act is None) == (fused != "none") for layer in packed.layers)
    steps = [ids[:, :5]] + [ids[:, t : t + 1] for t in range(5, 12)]
    a = torch.stack([packed.step(s) for s in steps], 1)
    b = torch.stack([plain.step(s) for s in steps], 1)
    assert a.dtype == torch.bfloat16
    general = model(ids).logits[:, 4:]
    torch.testing.assert_close(a.float(), b.float(), atol=6e-3, rtol=0)
    torch.testing.assert_close(a.float(), general.float(), atol=6e-3, rtol=0)


@ONEDNN_BF16
def test_packed_bf16_decoding_gives_the_same_tokens_padded_rows_too(monkeypatch):
    model = _gpt(position="rotary").bfloat16()
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8]]  # different lengths: left padding, a mask
    _force_packing(monkeypatch, on=False)
    plain = generate(model, prompts, 16, greedy=True)
    _force_packing(monkeypatch)
    assert generate(model, prompts, 16, greedy=True) == plain
    assert generate(model, prompts, 16, greedy=True, fast=False) == plain


def test_packing_is_chosen_only_for_bf16_weights_on_a_cpu_with_bf16_and_several_rows(monkeypatch):
    """oneDNN's packed products for bf16 weights and several rows on a CPU with bf16 instructions; torch's own
    kernel for one row of bf16 on any CPU; an fp32 cache for half-precision weights where the CPU has bf16
    instructions only."""
    for has_bf16 in (False, True):
        monkeypatch.setattr(fast_decode, "cpu_has_bf16", lambda has_bf16=has_bf16: has_bf16)
        for batch in (1, 2):
            decoder = FastGPTDecoder(_gpt(), batch=batch, capacity=4)  # fp32: the plain products
            assert not decoder.packed and not decoder.own_gemv and decoder.k.dtype == torch.float32
            decoder = FastGPTDecoder(_gpt().half(), batch=batch, capacity=4)
            assert not decoder.packed and not decoder.own_gemv
            assert decoder.k.dtype == (torch.float32 if has_bf16 else torch.float16)
        # One row of bf16: torch's own matrix-vector kernel, whatever the CPU; several: packed where it can.
        decoder = FastGPTDecoder(_gpt().bfloat16(), batch=1, capacity=4)
        assert decoder.own_gemv and not decoder.packed
        assert decoder.k.dtype == (torch.float32 if has_bf16 else torch.bfloat16)
        decoder = FastGPTDecoder(_gpt().bfloat16(), batch=2, capacity=4)
        assert not decoder.own_gemv and bool(decoder.packed) == (has_bf16 and fast_decode._onednn_linear_works())
        assert decoder.k.dtype == (torch.float32 if has_bf16 else torch.bfloat16)


@pytest.mark.parametrize("overrides", SUPPORTED)
def test_one_row_of_bf16_takes_torchs_own_kernel_with_onednn_off_for_the_step(monkeypatch, overrides):
    """Batch-1 decoding with bf16 weights: every product of a one-token step runs with oneDNN switched off
    (torch's own matrix-vector kernel), the prompt's with it on; the switch is restored after each step, an
    error included. Logits within bf16 rounding of the general forward and of the packed path, the same
    tokens as the general path."""
    model = _gpt(**overrides).bfloat16()
    ids = torch.randint(0, 23, (1, 12), generator=torch.Generator().manual_seed(1))
    seen = []
    affine = fast_decode._affine

    def spy(*args, **kwargs):
        seen.append(torch._C._get_mkldnn_enabled())
        return affine(*args, **kwargs)

    monkeypatch.setattr(fast_decode, "_affine", spy)
    before = torch._C._get_mkldnn_enabled()
    decoder = FastGPTDecoder(model, batch=1, capacity=12)
    assert decoder.own_gemv
    logits = [decoder.step(ids[:, :5])]
    assert seen and all(on == before for on in seen)  # the prompt: several rows, oneDNN as it was
    for t in range(5, 12):
        seen.clear()
        logits.append(decoder.step(ids[:, t : t + 1]))
        assert len(seen) == 4 * model.config.n_layers + 1 and not any(seen)
        assert torch._C._get_mkldnn_enabled() == before
    own = torch.stack(logits, 1)
    assert own.dtype == torch.bfloat16
    general = model(ids).logits[:, 4:]
    torch.testing.assert_close(own.float(), general.float(), atol=6e-3, rtol=0)
    if fast_decode._onednn_linear_works():
        packed = _packed_decoder(monkeypatch, model, batch=1, capacity=12)
        steps = [ids[:, :5]] + [ids[:, t : t + 1] for t in range(5, 12)]
        torch.testing.assert_close(own.float(), torch.stack([packed.step(s) for s in steps], 1).float(),
                                   atol=6e-3, rtol=0)
    monkeypatch.undo()
    prompts = [[1, 2, 3, 4]]
    assert generate(model, prompts, 16, greedy=True) == generate(model, prompts, 16, greedy=True, fast=False)

    def broken(*args, **kwargs):
        raise RuntimeError("a product failed")

    decoder = FastGPTDecoder(model, batch=1, capacity=12)
    decoder.step(ids[:, :5])
    monkeypatch.setattr(fast_decode, "_affine", broken)
    with pytest.raises(RuntimeError, match="a product failed"):
        decoder.step(ids[:, 5:6])
    assert torch._C._get_mkldnn_enabled() == before


@ONEDNN_BF16
def test_packed_weights_are_kept_between_calls_and_rebuilt_when_a_weight_changes(monkeypatch):
    """A second decoder of the same model reuses the packed copies (no reordering); a changed weight (an
    optimizer step in place, one value written through `.data`, `load_state_dict`, `.data` replaced), or
    another batch size, packs anew, and the logits follow the change (mutant: a cache that misses a change
    would decode with stale weights)."""
    model = _gpt().bfloat16()
    ids = torch.randint(0, 23, (1, 6), generator=torch.Generator().manual_seed(2))
    calls = []
    namespace = torch.ops.mkldnn

    class Ops:  # torch.ops.mkldnn with its reorder counted
        def __getattr__(self, name):
            return getattr(namespace, name)

        def _reorder_linear_weight(self, w, rows):
            calls.append(rows)
            return namespace._reorder_linear_weight(w, rows)

    monkeypatch.setattr(fast_decode.torch.ops, "mkldnn", Ops(), raising=False)
    first = _packed_decoder(monkeypatch, model, batch=1, capacity=6).step(ids)
    n = len(calls)
    assert n == 4 * model.config.n_layers + 1
    again = _packed_decoder(monkeypatch, model, batch=1, capacity=6).step(ids)
    assert len(calls) == n and torch.equal(first, again)
    _packed_decoder(monkeypatch, model, batch=2, capacity=6)  # products of 2 rows: packed for them
    assert len(calls) == 2 * n
    _packed_decoder(monkeypatch, model, batch=1, capacity=6)
    assert len(calls) == 3 * n
    changes = [
        lambda: model.blocks.layers[0].ff.fc2.weight.mul_(2.0),  # in place, as an optimizer step
        lambda: model.blocks.layers[1].self_attn.out_proj.weight.data[0, :1].add_(1.0),  # unseen by versions
        lambda: model.load_state_dict({k: v * 0.5 for k, v in model.state_dict().items()}),
        lambda: setattr(model.lm_head.weight, "data", model.lm_head.weight.data.clone().neg()),
    ]
    for change in changes:
        with torch.no_grad():
            change()
        before = len(calls)
        got = _packed_decoder(monkeypatch, model, batch=1, capacity=6).step(ids)
        assert len(calls) == before + n
        _force_packing(monkeypatch, on=False)
        torch.testing.assert_close(got.float(), FastGPTDecoder(model, batch=1, capacity=6).step(ids).float(),
                                   atol=6e-3, rtol=0)
    monkeypatch.setattr(fast_decode, "PACK_CACHE_BYTES", 0)  # too large to keep: packed for every call
    model.lm_head.weight.data.neg_()
    before = len(calls)
    _packed_decoder(monkeypatch, model, batch=1, capacity=6)
    _packed_decoder(monkeypatch, model, batch=1, capacity=6)
    assert len(calls) == before + 2 * n and model not in fast_decode._PACKED


def _onednn_states(module: torch.nn.Module) -> list[bool]:
    """The oneDNN switch at every call of `module` (a forward pre-hook), kept in the returned list."""
    states: list[bool] = []
    module.register_forward_pre_hook(lambda *_: states.append(torch._C._get_mkldnn_enabled()))
    return states


@pytest.mark.parametrize("position", ["learned", "relative"])
def test_general_forward_decodes_one_row_of_bf16_with_onednn_off(monkeypatch, position):
    """Through the general forward with a KV cache (here forced; Shaw relative positions always take it),
    each one-token step of one row of bf16 weights runs with oneDNN switched off (torch's own matrix-vector
    kernel), the prompt and batches of several rows with it as it was; the same tokens as with oneDNN on
    throughout, and the switch as it was afterwards (mutant: a step left on oneDNN, or the switch left off)."""
    model = _gpt(position=position).bfloat16()
    states = _onednn_states(model)
    before = torch._C._get_mkldnn_enabled()
    tokens = generate(model, [[1, 2, 3, 4]], 12, greedy=True, fast=False)
    assert states[0] == before and not any(states[1:]) and len(states) == 12
    assert torch._C._get_mkldnn_enabled() == before
    states.clear()
    generate(model, [[1, 2, 3, 4], [5, 6, 7, 8]], 6, greedy=True, fast=False)
    assert states and all(on == before for on in states)
    states.clear()
    generate(_gpt(position=position), [[1, 2, 3, 4]], 6, greedy=True, fast=False)  # fp32: untouched
    monkeypatch.setattr(fast_decode, "_own_gemv", lambda weight: False)
    states.clear()
    assert generate(model, [[1, 2, 3, 4]], 12, greedy=True, fast=False) == tokens
    assert all(on == before for on in states)


def test_translating_one_source_with_bf16_weights_runs_onednn_off():
    """Greedy translation and beam search of one source with one beam: each decoder step with oneDNN off;
    two sources, or two beams, with it as it was; beam width 1 gives greedy's target."""
    from attnlab.inference.generate import beam_search, greedy_translate
    from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(src_vocab_size=7, tgt_vocab_size=7, d_model=16, n_heads=2, d_ff=32,
                               n_encoder_layers=1, n_decoder_layers=2, dropout=0.0, max_len=12, norm="pre")
    model = Seq2SeqTransformer(config).eval().bfloat16()
    states = _onednn_states(model.lm_head)
    before = torch._C._get_mkldnn_enabled()
    src = torch.tensor([[3, 4, 5, 6], [6, 5, 4, 3]])
    one = greedy_translate(model, src[:1], max_len=6)
    assert states and not any(states) and torch._C._get_mkldnn_enabled() == before
    states.clear()
    assert beam_search(model, src[:1], beam_size=1, max_len=6) == one
    assert states and not any(states)
    for run in (lambda: greedy_translate(model, src, max_len=6), lambda: beam_search(model, src[:1], beam_size=2,
                                                                                     max_len=6)):
        states.clear()
        run()
        assert states and all(on == before for on in states)
    assert torch._C._get_mkldnn_enabled() == before
