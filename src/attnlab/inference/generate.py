"""Text generation: greedy, temperature, top-k and top-p sampling for decoder-only models, with a
KV cache; greedy and beam search for the encoder-decoder Transformer.

Batched prompts of different lengths are left-padded; the attention mask hides the padding and
positions count real tokens only, so every row decoded greedily (in fp32) produces what it would produce alone;
sampled rows share one random generator (see `generate`'s `seed`), so their draws depend on the batch.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.inference.fast_decode import FastGPTDecoder, one_row_of_own_gemv
from attnlab.models.common import check_ids
from attnlab.training.device import onednn_off


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
    if greedy or temperature < torch.finfo(torch.float32).tiny:
        # Below float32's smallest normal number the temperature is greedy in effect (each logit under the
        # largest goes to -inf), and from ~1e-46 it rounds to 0 in float32, which would divide 0 by 0.
        return logits.argmax(dim=-1)
    # Shifted so that the largest is 0 before dividing: a tiny temperature then sends the others to -inf
    # (greedy in the limit) instead of overflowing every logit to ±inf (NaN probabilities). Softmax, top-k and
    # top-p do not see the shift. The tokens are ranked on the logits before the division, which never changes
    # their order: a huge temperature rounds every scaled logit to 0 and would leave top-k and top-p no order.
    logits = logits.float()
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    logits = shifted / temperature
    use_k = top_k is not None and top_k < logits.shape[-1]
    use_p = top_p is not None and top_p < 1.0
    if use_k or use_p:
        order = torch.sort(shifted, descending=True, dim=-1, stable=True).indices  # ties: vocabulary order
        drop_sorted = torch.zeros(order.shape, dtype=torch.bool, device=order.device)
        if use_k:
            drop_sorted[:, top_k:] = True  # exactly k tokens, also where logits tie (bf16 weights)
        if use_p:
            # Drop a token when the tokens ranked above it already hold top_p of the mass (of the top k). In
            # float64, with a margin far below float32's resolution, so that a mass of exactly top_p (tied
            # probabilities) counts as reached instead of falling an ulp short of it and keeping one more token.
            sorted_logits = logits.gather(-1, order).masked_fill(drop_sorted, float("-inf"))
            wide = torch.float32 if order.device.type == "mps" else torch.float64  # MPS has no float64
            probs_sorted = torch.softmax(sorted_logits.to(wide), dim=-1)
            above = F.pad(probs_sorted.cumsum(dim=-1), (1, 0))[:, :-1]
            reached = above >= top_p - 1e-12
            reached[:, 0] = False  # the most likely token stays, however small top_p
            drop_sorted |= reached
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# The most tokens one call generates: the ids of every row are held for the whole sequence (8 bytes a token),
# and 10 million tokens take hours on a CPU; a larger -n is a typing mistake, not a request.
MAX_NEW_TOKENS = 10_000_000


# The widest beam: each source's beams are rows of the decoder's batch and cache; beyond a few dozen a wider
# beam rarely finds a better translation, and a larger width is a typing mistake, not a request.
MAX_BEAM_SIZE = 1000


def check_beam_size(beam_size: object) -> None:
    """ConfigError unless `beam_size` is a whole number in [1, MAX_BEAM_SIZE]."""
    if not _whole(beam_size) or not 1 <= beam_size <= MAX_BEAM_SIZE:
        raise ConfigError(f"beam_size (--beam-size) must be a whole number from 1 to {MAX_BEAM_SIZE:,}, "
                          f"got {beam_size!r}")


def _check_options(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    # Each message names the argument and its command-line flag.
    for name, flag, value in (("max_new_tokens", "-n", max_new_tokens), ("top_k", "--top-k", top_k)):
        if value is not None and not _whole(value):
            raise ConfigError(f"{name} ({flag}) must be a whole number, got {value!r}")
    if not 0 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ConfigError(f"max_new_tokens (-n) must be in [0, {MAX_NEW_TOKENS:,}], got {max_new_tokens}")
    if not 0 <= temperature < math.inf:  # also refuses NaN
        raise ConfigError(f"temperature (--temperature) must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k (--top-k) must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"top_p (--top-p) must be in (0, 1], got {top_p}")


def _prompt_rows(prompt: Tensor | Iterable[Iterable[int]]) -> list[list[int]]:
    """The prompts as lists of ids, or one line naming what is wrong with them."""
    shape = "a (B, T) tensor of token ids or a list of id lists, e.g. [[5, 9, 2]] (one prompt: one inner list)"
    if isinstance(prompt, Tensor):
        if prompt.dim() != 2 or prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise ConfigError(f"prompt must be {shape}; got a tensor of shape {tuple(prompt.shape)} and {prompt.dtype}")
        rows = prompt.tolist()
    else:
        if isinstance(prompt, str):
            raise ConfigError(f"prompt must be {shape}; encode text with the run's tokenizer first")
        prompt = list(prompt)  # read once: a generator of prompts would be spent by the check below
        if any(isinstance(p, str | int) or not isinstance(p, Iterable) for p in prompt):
            raise ConfigError(f"prompt must be {shape}; encode text with the run's tokenizer first")
        try:
            rows = [[operator.index(i) for i in p] for p in prompt]  # ints, NumPy or 0-d tensor integers
        except TypeError:
            raise ConfigError(f"prompt must be {shape}: every id a whole number") from None
    if not rows or any(len(r) == 0 for r in rows):
        raise ConfigError("every prompt needs at least one token")
    return rows


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Run a block with `model` in eval mode (no dropout), then give it back the mode it had: decoding in the
    middle of training must not leave dropout off."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


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
    context: int | None = None,
) -> list[list[int]]:
    """Continue each prompt by up to `max_new_tokens` tokens.

    Args:
        model: a causal LM with `forward(input_ids, attention_mask=..., cache=...)`, `new_cache(capacity)`
            and `max_len` (None when unbounded), e.g. `GPT` or an `EncoderModel` with the LM head; a model
            whose `supports_cache` is False (a bidirectional LM) is decoded without the cache. Its forward
            returns the (B, T, V) logits, as a tensor or as an output's `.logits`; a model of the user's
            needs only `forward(input_ids, attention_mask=...)` (without `new_cache`, each step recomputes the
            prefix).
        prompt: (B, T) ids, or a list of id lists of any lengths (left-padded internally).
        greedy: take the argmax; otherwise sample with `temperature`, `top_k`, `top_p`.
        eos_id: stop a row when it produces this id (the id is kept in its output).
        seed: seed of the sampling generator (deterministic sampling). The rows of a batch draw from one
            generator, so a sampled row differs from the same prompt sampled alone (greedy rows do not, in
            fp32; in bf16 one row and a batch are multiplied by different kernels, whose rounding can flip a
            near-tie).
        use_cache: reuse keys/values (the default, where the model supports it); False recomputes the whole
            prefix each step.
            A model with a bounded context (`max_len`: learned positions, a block size) sees at most its
            last `max_len` tokens: once the sequence is longer, each step recomputes that window, whose
            positions start again at 0, with or without the cache (which serves until then).
        fast: with the cache, use `FastGPTDecoder` where the model supports it (the
            same tokens in far fewer framework calls); False forces the general forward.
        context: a shorter bound than the model's own (`max_len`) on the tokens it reads, which then slides the
            same way: the window a run was trained on, so that decoding never reads positions that training
            did not (`attnlab generate` passes a run's data.block_size for a bounded model). None: `max_len`.

    Returns:
        The new tokens of each row (prompts excluded).
    """
    _check_options(max_new_tokens, temperature, top_k, top_p)
    if seed is not None and (not _whole(seed) or not -2**63 <= seed < 2**64):  # what torch.Generator takes
        raise ConfigError(f"seed (--seed) must be a whole number from -2**63 to 2**64 - 1, got {seed!r}")
    if isinstance(model, nn.parallel.DistributedDataParallel):  # it passes no attributes through (config, max_len,
        model = model.module  # new_cache): the model inside decodes (a compiled one keeps its wrapper, which does)
    _check_next_token_model(model)
    device = next(model.parameters()).device
    rows = _prompt_rows(prompt)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    outside = [] if vocab is None else [t for r in rows for t in r if not 0 <= t < vocab]
    if outside:  # an embedding lookup would fail with an IndexError from deep inside the model
        raise ConfigError(f"prompt token id {outside[0]} is outside the model's vocabulary (0 to {vocab - 1}); "
                          "encode the prompt with the model's tokenizer")
    if not _whole(pad_id) or (vocab is not None and not 0 <= pad_id < vocab):  # fed to the model as padding
        raise ConfigError(f"pad_id {pad_id!r} is not a token id of the model's vocabulary (0 to "
                          f"{'...' if vocab is None else vocab - 1}); give the tokenizer's pad id, or 0")
    b, longest = len(rows), max(len(r) for r in rows)
    total = longest + max_new_tokens
    ids = torch.full((b, total), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((b, total), dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        ids[i, longest - len(r) : longest] = torch.tensor(r, device=device)
        mask[i, longest - len(r) :] = 1
    # The mask goes to the model when rows are padded, and always to a model that reads a config pad_id as padding
    # where no mask is given (an encoder LM): generate decides which tokens are real, so a prompt or generated token
    # equal to pad_id is real with the cache, without it, alone or padded in a batch.
    reads_pad_id = getattr(getattr(model, "config", None), "pad_id", None) is not None
    masked = reads_pad_id or any(len(r) != longest for r in rows)
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    limit = getattr(model, "max_len", None)
    if context is not None:
        if not _whole(context) or context < 1:
            raise ConfigError(f"context must be a whole number of tokens, at least 1; got {context!r}")
        limit = context if limit is None else min(limit, context)
    # The cache serves while the sequence fits, in a model that can keep one (`supports_cache`: a causal LM).
    cached = use_cache and getattr(model, "supports_cache", hasattr(model, "new_cache")) and (
        limit is None or longest <= limit)

    with eval_mode(model):
        step = _decoder(model, ids, mask, total, masked=masked, cached=cached, fast=fast, limit=limit)
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
    out = []
    for i in range(b):
        new = ids[i, longest:cur].tolist()
        if eos_id is not None and eos_id in new:
            new = new[: new.index(eos_id) + 1]
        out.append(new)
    return out


def _check_next_token_model(model: nn.Module) -> None:
    """Refuse attnlab's models that do not predict the next token, whose last logits generation would read as one
    (a classifier's class scores as token ids, BERT's masked-LM guess of the last token itself); a seq2seq model
    translates. Other models are taken at their word (a causal LM of the user's with the same interface)."""
    from attnlab.models.bert import BertModel
    from attnlab.models.encoder import EncoderModel
    from attnlab.models.transformer import Seq2SeqTransformer
    from attnlab.training.distributed import unwrap

    model = unwrap(model)  # a compiled or DDP-wrapped model is judged by the model inside
    if isinstance(model, Seq2SeqTransformer):
        raise ConfigError("a seq2seq model translates a source: use greedy_translate or beam_search, not generate")
    if isinstance(model, BertModel) or (isinstance(model, EncoderModel) and model.config.head != "lm"):
        head = getattr(model.config, "head", None) or getattr(model.config, "heads", None)
        raise ConfigError(f"{type(model).__name__} with the {head!r} head does not predict the next token, so "
                          "generate cannot continue a prompt with it; give a GPT or an EncoderModel with the LM head")


def _decoder(model: nn.Module, ids: Tensor, mask: Tensor, total: int, *, masked: bool, cached: bool,
             fast: bool, limit: int | None):
    """A function cur -> (B, V) logits of the token after ids[:, :cur], called for cur = longest, longest+1...:
    the low-overhead decoder where it applies, else the model's forward with a KV cache; past a bounded model's
    `limit` positions (and without a cache), the forward over the last `limit` tokens, recomputed each step."""
    capacity = total if limit is None else min(total, limit)
    decoder = FastGPTDecoder.for_model(model, ids.shape[0], capacity, mask[:, :capacity] if masked else None) \
        if cached and fast else None
    cache = model.new_cache(capacity=capacity) if cached and decoder is None else None
    fed = 0  # tokens already in the cache
    weight = _a_weight(model)

    def step(cur: int) -> Tensor:
        nonlocal fed
        if decoder is not None and cur <= capacity:
            return decoder.step(ids[:, decoder.pos : cur])
        if cache is not None and cur <= capacity:
            start, fed = fed, cur
            with onednn_off(one_row_of_own_gemv(weight, ids.shape[0] * (cur - start))):
                return _last_logits(model(ids[:, start:cur], attention_mask=mask[:, :cur] if masked else None,
                                      cache=cache))
        start = 0 if limit is None else max(0, cur - limit)  # the window slides: positions restart at its start
        return _last_logits(model(ids[:, start:cur], attention_mask=mask[:, start:cur] if masked else None))

    return step


def _last_logits(output: object) -> Tensor:
    """The (B, V) logits of the last position from a forward's output: attnlab's models give an output with
    `.logits`, a user's model may give the (B, T, V) tensor itself."""
    logits = getattr(output, "logits", output)
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        shown = f"a {tuple(logits.shape)} tensor" if isinstance(logits, Tensor) else type(output).__name__
        raise ConfigError(f"the model's forward returned {shown}; generate needs the (batch, length, vocabulary) "
                          "logits, as a tensor or as an output's .logits")
    return logits[:, -1]


def _a_weight(model: nn.Module) -> Tensor | None:
    """A weight matrix of the model, whose dtype and device stand for the products of a decoding step (None
    for a model without one)."""
    parameters = model.parameters() if hasattr(model, "parameters") else ()
    return next((p for p in parameters if p.dim() == 2), None)


# --------------------------------------------------------------------------------------------------
# Encoder-decoder
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_translate(model: nn.Module, src_ids: Tensor, src_mask: Tensor | None = None, *,
                     max_len: int = 64, never_emit: Iterable[int] = ()) -> list[list[int]]:
    """Greedy decoding for a batch of sources with a KV cache; returns target ids without bos, up to eos, at most
    `max_len` of them and at most as many as the model has target positions (a bounded model: learned ones).
    pad and bos are never emitted (see `_never_emitted`), nor the ids of `never_emit`."""
    _check_max_len(max_len)
    _check_sources(model, src_ids)
    banned = _never_emitted(model.config, never_emit)
    with eval_mode(model):
        return _greedy_translate(model, src_ids, src_mask, _target_length(model, max_len), banned)


def _check_sources(model: nn.Module, src_ids: Tensor) -> None:
    """Sources as the translation decoders take them, or one line: ids outside the source vocabulary failed with an
    IndexError from inside the embedding, a source of no tokens with a reshape error (as `generate` checks its
    prompts)."""
    if not hasattr(model, "encode") or not hasattr(getattr(model, "config", None), "bos_id"):
        raise ConfigError(f"{type(model).__name__} is no translation model (an encoder-decoder, Seq2SeqTransformer): "
                          "greedy_translate and beam_search decode one; continue a prompt with generate instead")
    check_ids(src_ids, "src_ids")
    if src_ids.shape[1] == 0:
        raise ConfigError("the sources have no tokens (src_ids of shape (B, 0)); give each at least one token")
    vocab = getattr(model.config, "src_vocab_size", None)
    if vocab is not None and src_ids.numel():
        low, high = int(src_ids.min()), int(src_ids.max())
        if low < 0 or high >= vocab:
            raise ConfigError(f"source token id {low if low < 0 else high} is outside the model's source vocabulary "
                              f"(0 to {vocab - 1}); encode the sources with the model's tokenizer")


def _whole(value: object) -> bool:
    """An integer (Python's, NumPy's or a 0-d integer tensor), not a bool or a float."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _check_max_len(max_len: int) -> None:
    # Bounded as generate's -n is: the targets of every source are held for max_len tokens (a larger one crashed
    # in the allocation of that buffer).
    if not _whole(max_len) or not 0 <= max_len <= MAX_NEW_TOKENS:
        raise ConfigError(f"max_len (-n) must be a whole number in [0, {MAX_NEW_TOKENS:,}], got {max_len!r}")


def _target_length(model: nn.Module, max_len: int) -> int:
    """`max_len` capped at the model's target positions: a translation ends there, as it does at `max_len` (token
    n is predicted from bos and the n - 1 before it, n positions)."""
    limit = getattr(model, "max_len", None)
    return max_len if limit is None else min(max_len, limit)


def _greedy_translate(model: nn.Module, src_ids: Tensor, src_mask: Tensor | None, max_len: int,
                      banned: list[int]) -> list[list[int]]:
    c = model.config
    memory, _, _ = model.encode(src_ids, src_mask)
    b = src_ids.shape[0]
    cache = model.new_cache()
    tok = torch.full((b, 1), c.bos_id, dtype=torch.long, device=src_ids.device)
    out: list[Tensor] = []  # each step's tokens: memory by the translations' length, not max_len
    done = torch.zeros(b, dtype=torch.bool, device=src_ids.device)
    one_row = one_row_of_own_gemv(_a_weight(model), b)  # one source: torch's own bf16 matrix-vector kernel
    for _ in range(max_len):
        with onednn_off(one_row):
            logits, _, _, _ = model.decode(tok, memory, src_mask, cache=cache)
        step_logits = logits[:, -1]
        step_logits[:, banned] = -math.inf
        tok = step_logits.argmax(-1, keepdim=True)
        out.append(tok)
        done |= tok[:, 0] == c.eos_id
        if bool(done.all()):
            break
    return [_until_eos(row, c.eos_id) for row in torch.cat(out, dim=1).tolist()] if out else [[] for _ in range(b)]


def _never_emitted(config, never_emit: Iterable[int] = ()) -> list[int]:
    """The target ids a translation never contains: pad and bos are never a training label (bos starts the decoder's
    input, pad is ignored by the loss), so their logits are untrained and a decoder early in training can rank
    them first; and the caller's `never_emit` (tokens no target held, such as line breaks). eos stays emittable
    where a vocabulary shares its id with pad or bos."""
    extra = list(never_emit)
    vocab = getattr(config, "tgt_vocab_size", None)  # a decoder of the caller's own may not say
    wrong = next((i for i in extra if not _whole(i) or i < 0 or (vocab is not None and i >= vocab)), None)
    if wrong is not None:
        raise ConfigError(f"never_emit holds {wrong!r}, not a target token id"
                          + (f" (0 to {vocab - 1})" if vocab is not None else ""))
    return sorted(({config.pad_id, config.bos_id} | {int(i) for i in extra}) - {config.eos_id})


def _until_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


@torch.no_grad()
def beam_search(model: nn.Module, src_ids: Tensor, src_mask: Tensor | None = None, *, beam_size: int = 4,
                max_len: int = 64, length_penalty: float = 0.6, never_emit: Iterable[int] = ()) -> list[list[int]]:
    """Beam search with the GNMT length penalty ((5 + |y|) / 6)^α, every source of the batch at once.

    Each step ranks the 2k best continuations of a source's live beams: those that end (eos) become finished
    hypotheses, scored log p / penalty(length counting eos); the first k others live on. A source stops once
    no live beam can beat its best finished hypothesis (log-probabilities only fall and α ≥ 0), and at
    `max_len` (capped at the model's target positions) its live beams are finished as they are. Each source gets
    the tokens it gets alone.

    Returns the best target ids of each source (without bos and eos). pad and bos are never emitted, nor the ids of
    `never_emit`: each step's log-probabilities are over the other tokens (see `_never_emitted`).
    """
    check_beam_size(beam_size)
    if not 0 <= length_penalty < math.inf:  # the early stop bounds a live beam's best score assuming α ≥ 0
        raise ConfigError(f"length_penalty must be a finite number >= 0, got {length_penalty}")
    _check_max_len(max_len)
    _check_sources(model, src_ids)
    banned = _never_emitted(model.config, never_emit)
    with eval_mode(model):
        return _beam_search(model, src_ids, src_mask, beam_size, _target_length(model, max_len), length_penalty,
                            banned)


def _beam_search(model: nn.Module, src_ids: Tensor, src_mask: Tensor | None, beam_size: int, max_len: int,
                 length_penalty: float, banned: list[int]) -> list[list[int]]:
    c, k, device = model.config, beam_size, src_ids.device
    b = src_ids.shape[0]
    memory, _, _ = model.encode(src_ids, src_mask)
    memory = memory.repeat_interleave(k, dim=0)  # (B·k, S, D): beam j of source i is row i·k + j
    # A (1, S) mask (the models take one for every source) stands for each source's row before the beams repeat it.
    mask = None if src_mask is None else src_mask.expand(b, -1).repeat_interleave(k, dim=0)
    cache = model.new_cache()
    tokens = torch.full((b * k, 1), c.bos_id, dtype=torch.long, device=device)
    scores = torch.full((b, k), -math.inf, device=device)  # log-probabilities of the live beams; -inf: none
    scores[:, 0] = 0.0  # one live beam (bos) to start
    # Each live beam's tokens, and each source's best finished ones, as long as the search has gone: a buffer of
    # max_len, gathered whole at every step, made a step's cost grow with -n rather than with the translations.
    history = torch.zeros((b, k, 0), dtype=torch.long, device=device)
    best = torch.full((b,), -math.inf, device=device)  # each source's best finished score (`ranked`)
    best_history = torch.zeros((b, 0), dtype=torch.long, device=device)
    best_length = torch.zeros(b, dtype=torch.long, device=device)
    active = torch.ones(b, dtype=torch.bool, device=device)  # sources still searching
    rows = torch.arange(b, device=device)

    def ranked(logp: Tensor, n: int) -> Tensor:
        """log p / ((5 + n) / 6)^α as α·log((5 + n) / 6) - log(-log p), which orders hypotheses alike (it rises
        with it; -inf stays -inf): the penalty itself leaves float32's range at α ≈ 36 for 64 tokens, where every
        long hypothesis scored -0.0 and the shortest won, and float64's at larger α (an OverflowError)."""
        return length_penalty * math.log((5 + n) / 6) - torch.log(-logp)

    def finish(candidate: Tensor, beams: Tensor, length: int) -> None:
        """Keep, per source, the first best of `candidate` (B, n) scores where it beats the best so far."""
        nonlocal best_history
        value, at = candidate.max(dim=1)  # the first of equal scores, as a list ranked in order keeps it
        better = value > best
        best.copy_(torch.where(better, value, best))
        chosen = history[rows, beams[rows, at]]  # (B, steps so far)
        kept = torch.nn.functional.pad(best_history, (0, chosen.shape[1] - best_history.shape[1]))
        best_history = torch.where(better[:, None], chosen, kept)
        best_length.copy_(torch.where(better, torch.full_like(best_length, length), best_length))

    step = 0
    one_row = one_row_of_own_gemv(_a_weight(model), b * k)
    for step in range(1, max_len + 1):
        with onednn_off(one_row):
            logits, _, _, _ = model.decode(tokens, memory, mask, cache=cache)
        step_logits = logits[:, -1].float()
        step_logits[:, banned] = -math.inf  # a distribution over the tokens a translation may contain
        logp = torch.log_softmax(step_logits, dim=-1)  # (B·k, V)
        vocab = logp.shape[-1]
        cand = (scores[:, :, None] + logp.view(b, k, vocab)).view(b, k * vocab)
        top, idx = torch.topk(cand, min(2 * k, k * vocab), dim=1)  # (B, 2k), best first
        beam, token = idx // vocab, idx % vocab
        valid = torch.isfinite(top)  # candidates of beams that exist
        ends = (token == c.eos_id) & valid
        goes_on = ~ends & valid
        kept_before = torch.cumsum(goes_on.long(), dim=1) - goes_on.long()  # live candidates ranked ahead
        keep = goes_on & (kept_before < k)
        ended = ends & (kept_before < k)  # ranked before the k-th live one
        finish(torch.where(ended, ranked(top, step), torch.full_like(top, -math.inf)), beam, step - 1)
        # The k live candidates of each source (fewer: the rest are -inf slots that never win).
        order = torch.argsort((~keep).long(), dim=1, stable=True)[:, :k]  # kept ones first, in rank order
        new_scores = torch.where(keep.gather(1, order), top.gather(1, order), torch.full_like(top[:, :k], -math.inf))
        new_beam = beam.gather(1, order)
        stop = ~keep.any(dim=1) | ((best > -math.inf) & (ranked(new_scores.max(dim=1).values, max_len) < best))
        active &= ~stop
        if not bool(active.any()):
            break
        # (B, k, step): each new beam's parent's tokens, then its own
        history = torch.cat([history[rows[:, None], new_beam], token.gather(1, order)[:, :, None]], dim=2)
        scores = torch.where(active[:, None], new_scores, torch.full_like(new_scores, -math.inf))
        index = (rows[:, None] * k + new_beam).flatten()
        for self_cache, cross_cache in cache:
            self_cache.reorder(index)
            cross_cache.reorder(index)
        tokens = history[:, :, -1].reshape(b * k, 1)
    else:  # max_len reached: the live beams of the sources still searching end as they are
        live = torch.where(active[:, None], ranked(scores, step), torch.full_like(scores, -math.inf))
        beams = torch.arange(k, device=device).expand(b, k)
        finish(live, beams, step)
    return [best_history[i, : int(best_length[i])].tolist() for i in range(b)]
