"""Every tensor a model makes follows its input's device: each family, attention variant, position scheme and
decoding path runs on the `meta` device (no data: a tensor made on the CPU and combined with a meta one
raises, which is what a CUDA run would do), and on a GPU where there is one.

On meta a value read back to the host (`.item()`, `int(t.max())`, `bool(t.all())`) has no data; the mode below
answers 0 / False for it, and counts the reads, each of which is a wait for the device on a GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.inference.fast_decode import FastGPTDecoder
from attnlab.models.registry import build_model, get_preset
from attnlab.modules.positions import compatible_pairs

DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])
_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)


class _HostReads(TorchDispatchMode):
    """Counts values read back to the host; on meta, answers them with 0 / False."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _READS:
            self.count += 1
            if args[0].device.type == "meta":
                return 0 if func is _READS[0] else False
        return func(*args, **(kwargs or {}))


def _run(fn, device: str) -> int:
    torch.manual_seed(0)
    with _HostReads() as reads:
        fn(device)
    return reads.count


def _mask(batch: int, length: int, padded: slice, device: str) -> torch.Tensor:
    keep = torch.ones(batch, length, dtype=torch.long)
    keep[0, padded] = 0
    return keep.to(device)


MODES = ["plain", "mask", "cache", "cache+mask", "weights", "packed"]
PACKED = [[0, 0, 0, 1, 1, 1, 1, -1], [2, 2, 2, 2, 2, 2, 2, 2]]  # document_ids: two documents and a pad, one


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant,position", compatible_pairs())
def test_gpt_stays_on_the_device(device, mode, variant, position):
    def case(dev):
        _, config = get_preset("gpt-char-tiny")
        model = build_model(config.replace(attention=variant, position=position)).to(dev)
        ids = torch.randint(0, 65, (2, 8)).to(dev)
        keep = _mask(2, 8, slice(0, 3), dev) if "mask" in mode else None  # left padding
        if "cache" in mode:
            cache = model.new_cache(capacity=16)
            model(ids[:, :5], attention_mask=None if keep is None else keep[:, :5], cache=cache)
            model(ids[:, 5:6], attention_mask=None if keep is None else keep[:, :6], cache=cache)
        else:
            documents = torch.tensor(PACKED).to(dev) if mode == "packed" else None
            out = model(ids, labels=ids, attention_mask=keep, need_weights=mode == "weights", document_ids=documents)
            out.loss.backward()

    _run(case, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rotary", "relative", "t5-bias", "alibi", "none"])
def test_encoder_and_seq2seq_stay_on_the_device(device, position):
    def encoder(dev, head):
        _, config = get_preset("encoder-tiny")
        model = build_model(config.replace(head=head, position=position)).to(dev)
        ids = torch.randint(0, 64, (2, 8)).to(dev)
        labels = ids if head == "lm" else torch.tensor([0, 1]).to(dev)
        model(ids, attention_mask=_mask(2, 8, slice(5, None), dev), labels=labels).loss.backward()
        if head == "lm":
            cache = model.new_cache()
            model(ids[:, :4], cache=cache)
            model(ids[:, 4:5], cache=cache)

    def seq2seq(dev):
        _, config = get_preset("seq2seq-tiny")
        model = build_model(config.replace(position=position)).to(dev)
        src, tgt = torch.randint(0, 64, (2, 7)).to(dev), torch.randint(0, 64, (2, 5)).to(dev)
        keep = _mask(2, 7, slice(5, None), dev)
        model(src, tgt, keep, labels=tgt).loss.backward()
        memory, _, _ = model.encode(src, keep)
        cache = model.new_cache()
        model.decode(tgt[:, :1], memory, keep, cache=cache)
        model.decode(tgt[:, 1:2], memory, keep, cache=cache)

    _run(lambda dev: encoder(dev, "lm"), device)
    _run(lambda dev: encoder(dev, "classification"), device)
    _run(seq2seq, device)


@pytest.mark.parametrize("device", DEVICES)
def test_bert_stays_on_the_device(device):
    def case(dev):
        _, config = get_preset("bert-tiny")
        model = build_model(config).to(dev)
        ids = torch.randint(0, 99, (2, 8)).to(dev)
        out = model(ids, attention_mask=_mask(2, 8, slice(6, None), dev), labels=ids,
                    next_sentence_label=torch.tensor([0, 1]).to(dev))
        out.loss.backward()

    _run(case, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rotary", "t5-bias", "alibi", "none"])
def test_fast_decoder_stays_on_the_device(device, padded, position):
    def case(dev):
        _, config = get_preset("gpt-char-tiny")
        model = build_model(config.replace(position=position)).to(dev).eval()
        decoder = FastGPTDecoder.for_model(model, 2, 12, _mask(2, 12, slice(0, 2), dev) if padded else None)
        ids = torch.randint(0, 65, (2, 6)).to(dev)
        decoder.step(ids)
        decoder.step(ids[:, :1])

    _run(case, device)


def test_a_forward_reads_back_at_most_once():
    """A causal forward of a 2-layer GPT waits for the device at most once: never with learned positions, once
    with rotary or the Synthesizer (the range of their positions, read once per forward, not per layer)."""
    counts = {}
    for variant, position in [("dot", "learned"), ("dot", "rotary"), ("synthesizer-dense", "learned")]:
        for packed in (False, True):
            def case(dev, variant=variant, position=position, packed=packed):
                _, config = get_preset("gpt-char-tiny")
                model = build_model(config.replace(attention=variant, position=position)).to(dev)
                ids = torch.randint(0, 65, (2, 8)).to(dev)
                model(ids, labels=ids, document_ids=torch.tensor(PACKED).to(dev) if packed else None)

            counts[variant, position, packed] = _run(case, "meta")
    for packed in (False, True):  # packed rows (per-row positions and a document mask) wait no more
        assert counts[("dot", "learned", packed)] == 0, counts
        assert counts[("dot", "rotary", packed)] == 1 and counts[("synthesizer-dense", "learned", packed)] == 1, counts
