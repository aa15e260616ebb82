"""Text generation: greedy, temperature, top-k and top-p sampling for decoder-only models, with a
KV cache; greedy and beam search for the encoder-decoder Transformer.

Batched prompts of different lengths are left-padded; the attention mask hides the padding and
positions count real tokens only, so every row produces what it would produce alone.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigError


def sample_next(
    logits: Tensor,
    *,
    greedy: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """(B, V) logits of the last position -> (B,) next token ids."""
    if greedy or temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass.
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _check_options(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    # Each message names the argument and its command-line flag.
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens (-n) must be >= 0, got {max_new_tokens}")
    if not 0 <= temperature < math.inf:  # also refuses NaN
        raise ConfigError(f"temperature (--temperature) must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k (--top-k) must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"top_p (--top-p) must be in (0, 1], got {top_p}")


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: Tensor | list[list[int]],
    max_new_tokens: int,
    *,
    greedy: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    pad_id: int = 0,
    seed: int | None = None,
    use_cache: bool = True,
    fast: bool = True,
) -> list[list[int]]:
    """Continue each prompt by up to `max_new_tokens` tokens.

    Args:
        model: a decoder-only model with `forward(input_ids, attention_mask=..., cache=...)`,
            `new_cache(capacity)` and `max_len` (None when unbounded), e.g. `GPT`.
        prompt: (B, T) ids, or a list of id lists of any lengths (left-padded internally).
        greedy: take the argmax; otherwise sample with `temperature`, `top_k`, `top_p`.
        eos_id: stop a row when it produces this id (the id is kept in its output).
        seed: seed of the sampling generator (deterministic sampling).
        use_cache: reuse keys/values (the default); False recomputes the whole prefix each step.
            A model with a bounded context (`max_len`: learned positions, a block size) sees at most its
            last `max_len` tokens: once the sequence is longer, each step recomputes that window, whose
            positions start again at 0, with or without the cache (which serves until then).
        fast: with the cache, use `FastGPTDecoder` where the model supports it (the
            same tokens in far fewer framework calls); False forces the general forward.

    Returns:
        The new tokens of each row (prompts excluded).
    """
    _check_options(max_new_tokens, temperature, top_k, top_p)
    device = next(model.parameters()).device
    rows = prompt.tolist() if isinstance(prompt, Tensor) else [list(p) for p in prompt]
    if not rows or any(len(r) == 0 for r in rows):
        raise ConfigError("every prompt needs at least one token")
    b, longest = len(rows), max(len(r) for r in rows)
    total = longest + max_new_tokens
    ids = torch.full((b, total), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((b, total), dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        ids[i, longest - len(r) : longest] = torch.tensor(r, device=device)
        mask[i, longest - len(r) :] = 1
    padded = any(len(r) != longest for r in rows)
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    limit = getattr(model, "max_len", None)
    cached = use_cache and (limit is None or longest <= limit)  # the cache serves while the sequence fits

    was_training = model.training
    model.eval()
    try:
        step = _decoder(model, ids, mask, total, padded=padded, cached=cached, fast=fast, limit=limit)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        cur = longest
        for _ in range(max_new_tokens):
            logits = step(cur)
            nxt = sample_next(logits, greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p,
                              generator=generator)
            if eos_id is not None:  # rows already finished get padding (without eos, none ever finishes)
                nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            ids[:, cur] = nxt
            cur += 1
            if eos_id is not None:
                done |= nxt == eos_id
                if bool(done.all()):
                    break
    finally:
        model.train(was_training)
    out = []
    for i in range(b):
        new = ids[i, longest:cur].tolist()
        if eos_id is not None and eos_id in new:
            new = new[: new.index(eos_id) + 1]
        out.append(new)
    return out


def _decoder(model: nn.Module, ids: Tensor, mask: Tensor, total: int, *, padded: bool, cached: bool,
             fast: bool, limit: int | None):
    """A function cur -> (B, V) logits of the token after ids[:, :cur], called for cur = longest, longest+1...:
    the low-overhead decoder where it applies, else the model's forward with a KV cache; past a bounded model's
    `limit` positions (and without a cache), the forward over the last `limit` tokens, recomputed each step."""
    from attnlab.inference.fast_decode import FastGPTDecoder

    capacity = total if limit is None else min(total, limit)
    decoder = FastGPTDecoder.for_model(model, ids.shape[0], capacity, mask[:, :capacity] if padded else None) \
        if cached and fast else None
    cache = model.new_cache(capacity=capacity) if cached and decoder is None else None
    fed = 0  # tokens already in the cache

    def step(cur: int) -> Tensor:
        nonlocal fed
        if decoder is not None and cur <= capacity:
            return decoder.step(ids[:, decoder.pos : cur])
        if cache is not None and cur <= capacity:
            start, fed = fed, cur
            return model(ids[:, start:cur], attention_mask=mask[:, :cur] if padded else None,
                         cache=cache).logits[:, -1]
        start = 0 if limit is None else max(0, cur - limit)  # the window slides: positions restart at its start
        return model(ids[:, start:cur], attention_mask=mask[:, start:cur] if padded else None).logits[:, -1]

    return step


# --------------------------------------------------------------------------------------------------
# Encoder-decoder
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_translate(model: nn.Module, src_ids: Tensor, src_mask: Tensor | None = None, *,
                     max_len: int = 64) -> list[list[int]]:
    """Greedy decoding for a batch of sources with a KV cache; returns target ids without bos, up to eos."""
    c = model.config
    model.eval()
    memory, _, _ = model.encode(src_ids, src_mask)
    b = src_ids.shape[0]
    cache = model.new_cache()
    tok = torch.full((b, 1), c.bos_id, dtype=torch.long, device=src_ids.device)
    out = torch.zeros((b, max_len), dtype=torch.long, device=src_ids.device)
    done = torch.zeros(b, dtype=torch.bool, device=src_ids.device)
    n = 0
    for n in range(1, max_len + 1):
        logits, _, _, _ = model.decode(tok, memory, src_mask, cache=cache)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        out[:, n - 1] = tok[:, 0]
        done |= tok[:, 0] == c.eos_id
        if bool(done.all()):
            break
    return [_until_eos(row[:n].tolist(), c.eos_id) for row in out]


def _until_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


@torch.no_grad()
def beam_search(model: nn.Module, src_ids: Tensor, src_mask: Tensor | None = None, *, beam_size: int = 4,
                max_len: int = 64, length_penalty: float = 0.6) -> list[list[int]]:
    """Beam search per source sentence, with the GNMT length penalty ((5 + |y|) / 6)^α.

    Returns the best target ids of each source (without bos and eos).
    """
    if beam_size < 1:
        raise ConfigError(f"beam_size must be >= 1, got {beam_size}")
    if length_penalty < 0:  # the early stop bounds a live beam's best score assuming α ≥ 0
        raise ConfigError(f"length_penalty must be >= 0, got {length_penalty}")
    model.eval()
    return [_beam_one(model, src_ids[i : i + 1], None if src_mask is None else src_mask[i : i + 1],
                      beam_size, max_len, length_penalty) for i in range(src_ids.shape[0])]


def _beam_one(model, src, src_mask, k, max_len, alpha) -> list[int]:
    c = model.config
    memory, _, _ = model.encode(src, src_mask)
    cache = model.new_cache()
    tokens = torch.full((1, 1), c.bos_id, dtype=torch.long, device=src.device)
    scores = torch.zeros(1, device=src.device)  # log-probabilities of the live beams
    history: list[list[int]] = [[]]
    finished: list[tuple[float, list[int]]] = []

    def penalty(n: int) -> float:
        return ((5 + n) / 6) ** alpha

    for step in range(1, max_len + 1):
        n_live = tokens.shape[0]
        mem = memory.expand(n_live, -1, -1)
        mask = None if src_mask is None else src_mask.expand(n_live, -1)
        logits, _, _, _ = model.decode(tokens, mem, mask, cache=cache)
        logp = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (live, V)
        cand = (scores[:, None] + logp).flatten()
        top, idx = torch.topk(cand, min(2 * k, cand.numel()))
        vocab = logp.shape[-1]
        beam_idx, tok_idx = idx // vocab, idx % vocab
        keep_beams, keep_tokens, keep_scores = [], [], []
        for s, bi, ti in zip(top.tolist(), beam_idx.tolist(), tok_idx.tolist()):
            if ti == c.eos_id:
                finished.append((s / penalty(step), history[bi]))
            else:
                keep_beams.append(bi)
                keep_tokens.append(ti)
                keep_scores.append(s)
            if len(keep_beams) == k:
                break
        best_finished = max((f[0] for f in finished), default=-math.inf)
        # Stop when no live beam can still beat the best finished hypothesis.
        if not keep_beams or (finished and max(keep_scores) / penalty(max_len) < best_finished):
            break
        index = torch.tensor(keep_beams, device=src.device)
        for self_cache, cross_cache in cache:
            self_cache.reorder(index)
            cross_cache.reorder(index)
        history = [history[bi] + [ti] for bi, ti in zip(keep_beams, keep_tokens)]
        tokens = torch.tensor(keep_tokens, device=src.device)[:, None]
        scores = torch.tensor(keep_scores, device=src.device)
    else:
        for s, h in zip(scores.tolist(), history):
            finished.append((s / penalty(len(h)), h))
    if not finished:
        finished = [(s / penalty(len(h)), h) for s, h in zip(scores.tolist(), history)]
    return max(finished, key=lambda f: f[0])[1]
