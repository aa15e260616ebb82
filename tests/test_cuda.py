"""On a CUDA GPU, attnlab computes what it computes on the CPU.

Skipped where torch sees no GPU (CI has none). On a machine with one, run `python -m pytest tests/test_cuda.py`:
the fused attention kernels against the explicit path and a float64 reference, every family's fp32 logits, loss
and gradients against the same weights on the CPU, the model's KV cache, the fast decoder, batching and beam
search giving the CPU's tokens, bf16 autocast training, exact resume, and the command line end to end. fp32
stays fp32 on the GPU (TF32 matrix products are off, torch's default), so fp32 results agree with the CPU's to
rounding.

`ATTNLAB_TEST_DEVICE=cpu python -m pytest tests/test_cuda.py` runs the same comparisons with the CPU in the
GPU's place: a check of the tests themselves on a machine without a GPU (every comparison then holds trivially
or to rounding; only a GPU tests the GPU).
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from cli_helpers import run_cli
from training_helpers import stopped_and_resumed

from attnlab.inference.fast_decode import FastGPTDecoder
from attnlab.inference.generate import beam_search, generate, greedy_translate
from attnlab.models.registry import build_model, get_preset
from attnlab.modules.attention import attention
from attnlab.modules.positions import compatible_pairs
from attnlab.training import Trainer
from attnlab.training.device import resolve_precision

CUDA = torch.device(os.environ.get("ATTNLAB_TEST_DEVICE", "cuda"))  # "cpu": check the tests without a GPU
pytestmark = pytest.mark.skipif(CUDA.type == "cuda" and not torch.cuda.is_available(), reason="no CUDA GPU")


def _perturbed(model, std=0.1):
    """Non-trivial norms, biases and tables, so that a term computed wrongly on one device shows."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(std * torch.randn_like(p))
    return model


def _both(config):
    torch.manual_seed(0)
    cpu = _perturbed(build_model(config)).eval()
    return cpu, copy.deepcopy(cpu).to(CUDA)


def _close_tensors(a, b, tol):
    torch.testing.assert_close(a.detach().cpu().double(), b.detach().cpu().double(), atol=tol, rtol=tol)


def _same_forward_and_backward(cpu, gpu, *args, **kwargs):
    """The two models on the same inputs (tensors moved to the GPU for `gpu`): logits and loss agree to rounding,
    and so do the gradients of the loss."""
    def moved(x):
        return x.to(CUDA) if isinstance(x, torch.Tensor) else x

    a = cpu(*args, **kwargs)
    b = gpu(*map(moved, args), **{k: moved(v) for k, v in kwargs.items()})
    _close_tensors(b.logits, a.logits, 1e-4)
    _close_tensors(b.loss, a.loss, 1e-5)
    a.loss.backward()
    b.loss.backward()
    _same_gradients(cpu, gpu)


def _same_gradients(cpu, gpu, tol=1e-4):
    """Every parameter that has a gradient on one device has it, equal to rounding, on the other."""
    grads = [(name, a.grad, b.grad) for (name, a), b in zip(cpu.named_parameters(), gpu.parameters(), strict=True)]
    assert any(a is not None for _, a, _ in grads)
    for name, a, b in grads:
        assert (a is None) == (b is None), name
        if a is not None:
            _close_tensors(b, a, tol)


# ---------------------------------------------------------------------------------------------------------------
# Attention: fused kernels == explicit path == float64


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 5e-3)])
@pytest.mark.parametrize("case", ["causal", "mask", "bias", "cross-causal", "plain-long"])
def test_fused_attention_equals_the_explicit_path_and_float64(dtype, tol, case):
    g = torch.Generator().manual_seed(1)
    t, s = (96, 96) if case != "cross-causal" else (40, 96)
    if case == "plain-long":
        t = s = 1024
    q, k, v = (torch.randn(2, 4, n, 64, generator=g) for n in (t, s, s))
    grad = torch.randn(2, 4, t, 64, generator=g)
    options = {"causal": case in ("causal", "cross-causal")}
    if case == "mask":
        keep = torch.rand(2, 1, t, s, generator=g) > 0.3
        keep[0, 0, 5] = False  # a row that sees nothing: zero output, never NaN
        options["mask"] = keep
    if case == "bias":
        options["bias"] = torch.randn(1, 4, t, s, generator=g)

    def run(device, dt, need_weights):
        leaves = [x.detach().clone().to(device, dt).requires_grad_() for x in (q, k, v)]  # fresh leaves each run
        moved = {n: (o.to(device) if isinstance(o, torch.Tensor) else o) for n, o in options.items()}
        out, _ = attention(*leaves, need_weights=need_weights, **moved)
        out.backward(grad.to(device, dt))
        return [out] + [x.grad for x in leaves]

    reference = run("cpu", torch.float64, True)
    for need_weights in (False, True):  # the fused kernel, then the explicit path
        got = run(CUDA, dtype, need_weights)
        assert all(torch.isfinite(x).all() for x in got)
        for a, b in zip(got, reference):
            err = (a.double().cpu() - b).norm() / b.norm().clamp(min=1e-12)
            assert err < tol, (need_weights, float(err))
    if case == "mask":
        assert got[0][0, :, 5].abs().max() == 0


# ---------------------------------------------------------------------------------------------------------------
# Models: fp32 on the GPU == fp32 on the CPU


@pytest.mark.parametrize("variant,position", compatible_pairs())
def test_gpt_logits_loss_and_gradients_match_the_cpu(variant, position):
    _, config = get_preset("gpt-char-tiny")
    cpu, gpu = _both(config.replace(attention=variant, position=position, dropout=0.0))
    ids = torch.randint(0, 65, (3, 24), generator=torch.Generator().manual_seed(2))
    keep = torch.ones(3, 24, dtype=torch.long)
    keep[1, :5] = 0  # left padding
    _same_forward_and_backward(cpu, gpu, ids, labels=ids, attention_mask=keep)


@pytest.mark.parametrize("head", ["lm", "classification"])
def test_encoder_matches_the_cpu(head):
    _, config = get_preset("encoder-tiny")
    cpu, gpu = _both(config.replace(head=head, dropout=0.0))
    ids = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(3))
    keep = torch.ones(3, 16, dtype=torch.long)
    keep[2, 11:] = 0
    labels = ids if head == "lm" else torch.tensor([0, 1, 1])
    _same_forward_and_backward(cpu, gpu, ids, attention_mask=keep, labels=labels)


def test_bert_matches_the_cpu():
    _, config = get_preset("bert-tiny")
    cpu, gpu = _both(config.replace(dropout=0.0, attention_dropout=0.0))
    ids = torch.randint(5, 99, (3, 16), generator=torch.Generator().manual_seed(4))
    keep = torch.ones(3, 16, dtype=torch.long)
    keep[0, 12:] = 0
    nsp = torch.tensor([0, 1, 0])
    _same_forward_and_backward(cpu, gpu, ids, attention_mask=keep, labels=ids, next_sentence_label=nsp)


def test_seq2seq_matches_the_cpu_and_beam_search_gives_its_tokens():
    _, config = get_preset("seq2seq-tiny")
    cpu, gpu = _both(config.replace(dropout=0.0))
    g = torch.Generator().manual_seed(5)
    src, tgt = torch.randint(4, 64, (3, 9), generator=g), torch.randint(4, 64, (3, 7), generator=g)
    keep = torch.ones(3, 9, dtype=torch.long)
    keep[1, 6:] = 0
    _same_forward_and_backward(cpu, gpu, src, tgt, keep, labels=tgt)
    for decode in (lambda m, d: greedy_translate(m, src.to(d), keep.to(d), max_len=12),
                   lambda m, d: beam_search(m, src.to(d), keep.to(d), beam_size=3, max_len=12)):
        assert decode(gpu, CUDA) == decode(cpu, "cpu")


# ---------------------------------------------------------------------------------------------------------------
# Generation on the GPU


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rotary", "alibi", "t5-bias"])
def test_cache_fast_decoder_and_batching_give_the_cpu_tokens(position):
    _, config = get_preset("gpt-char-tiny")
    cpu, gpu = _both(config.replace(position=position))
    ids = torch.randint(0, 65, (2, 20), generator=torch.Generator().manual_seed(6))
    decoder = FastGPTDecoder(gpu, batch=2, capacity=20)
    steps = [decoder.step(ids[:, :6].to(CUDA))] + [decoder.step(ids[:, t:t + 1].to(CUDA)) for t in range(6, 20)]
    _close_tensors(torch.stack(steps, 1), cpu(ids).logits[:, 5:], 1e-4)

    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
    expected = generate(cpu, prompts, 24, greedy=True)
    assert generate(gpu, prompts, 24, greedy=True) == expected  # batched, left-padded, the fast decoder
    assert generate(gpu, prompts, 24, greedy=True, fast=False) == expected  # the model's own KV cache
    assert generate(gpu, prompts, 24, greedy=True, use_cache=False) == expected
    assert [generate(gpu, [p], 24, greedy=True)[0] for p in prompts] == expected  # one at a time
    # Sampling's filters on the GPU: top-k 1 and a tiny top-p leave the best token alone (the devices' random
    # streams differ, so sampled tokens are compared through filters that leave one token).
    for fast in (True, False):
        assert generate(gpu, prompts, 24, temperature=0.9, top_k=1, seed=3, fast=fast) == expected
        assert generate(gpu, prompts, 24, temperature=0.9, top_p=1e-6, seed=3, fast=fast) == expected
    sampled = generate(gpu, prompts[:1], 24, temperature=0.9, top_k=10, top_p=0.9, seed=3)
    assert sampled == generate(gpu, prompts[:1], 24, temperature=0.9, top_k=10, top_p=0.9, seed=3)  # a seed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_decoding_stays_close(dtype):
    _, config = get_preset("gpt-char-tiny")
    cpu, gpu = _both(config)
    ids = torch.randint(0, 65, (1, 16), generator=torch.Generator().manual_seed(7))
    decoder = FastGPTDecoder(gpu.to(dtype), batch=1, capacity=16)
    got = decoder.step(ids.to(CUDA))
    want = cpu(ids).logits[:, -1]
    assert ((got.float().cpu() - want).norm() / want.norm()) < 3e-2


# ---------------------------------------------------------------------------------------------------------------
# Training on the GPU


def _config(**changes):
    from attnlab.training import TrainerConfig

    settings = dict(steps=6, batch_size=8, micro_batch_size=4, lr=1e-2, warmup_steps=2, schedule="noam",
                    precision="fp32", device=str(CUDA), progress=False, log_every=1, eval_every=2)
    settings.update(changes)
    return TrainerConfig(**settings)


@pytest.mark.skipif(CUDA.type != "cuda", reason="a question for a GPU")
def test_auto_precision_is_bf16_on_a_gpu_that_has_it():
    # Native bf16: Ampere (compute capability 8.0) on, or ROCm. torch.cuda.is_bf16_supported() also says yes on a
    # T4 or V100, where bf16 is emulated and auto stays in fp32 (this test failed there).
    native = bool(torch.version.hip) or torch.cuda.get_device_capability()[0] >= 8
    expected = torch.bfloat16 if native else None
    assert resolve_precision("auto", "cuda") is expected


@pytest.mark.parametrize("precision", ["fp32", "auto"])
def test_resume_on_the_gpu_is_exact(tmp_path, precision):
    full, second = stopped_and_resumed(_config(precision=precision), tmp_path)
    for k, v in full.model.state_dict().items():
        assert v.device.type == CUDA.type
        assert torch.equal(second.model.state_dict()[k], v), k


def test_gpt_training_on_the_gpu_follows_the_cpu_in_fp32(tmp_path):
    """Six fp32 steps of a GPT with attention on each device end with the same weights, up to rounding."""
    from training_helpers import packed_run

    ends = {}
    for device in ("cpu", str(CUDA)):
        model, source = packed_run(pack=True)
        trainer = Trainer(model, _config(device=device, steps=6, eval_every=0, lr=3e-3), source,
                          out_dir=tmp_path / device)
        trainer.fit()
        ends[device] = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    for k, v in ends["cpu"].items():
        _close_tensors(ends[str(CUDA)][k], v, 1e-4)


def test_the_command_line_trains_generates_and_evaluates_on_the_gpu(tmp_path, capsys):
    run = tmp_path / "run"
    code, out, err = run_cli(capsys, "train", "--set", f"train.out_dir={json.dumps(str(run))}",
                             "--set", "train.steps=30", "--set", "train.eval_every=15",
                             "--set", f"train.device={json.dumps(str(CUDA))}", "--set", "train.progress=false")
    assert code == 0, err
    state = json.loads((run / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 30
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records if "loss" in r)
    for dtype in ("fp32", "bf16", "fp16"):
        code, out, err = run_cli(capsys, "generate", str(run), "--prompt", "The ", "-n", "40", "--greedy",
                                 "--device", str(CUDA), "--dtype", dtype)
        assert code == 0 and out.startswith("The "), err
    outs = {}
    for device in (str(CUDA), "cpu"):
        code, outs[device, "generate"], err = run_cli(capsys, "generate", str(run), "--prompt", "The ", "-n", "40",
                                                      "--greedy", "--device", device)
        assert code == 0, err
        # evaluate streams the text through a temporary token file, then scores it on the device
        text = tmp_path / "held_out.txt"
        text.write_text("The Python language reference describes the syntax of the language.\n" * 20,
                        encoding="utf-8")
        code, scored, err = run_cli(capsys, "evaluate", str(run), "--data", str(text), "--json", "--device", device)
        assert code == 0, err
        outs[device, "evaluate"] = json.loads(scored)
    assert outs[str(CUDA), "generate"] == outs["cpu", "generate"]
    assert outs[str(CUDA), "evaluate"]["tokens"] == outs["cpu", "evaluate"]["tokens"]
    assert abs(outs[str(CUDA), "evaluate"]["loss"] - outs["cpu", "evaluate"]["loss"]) < 1e-4
