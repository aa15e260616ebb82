"""Translation fixes from the fourth seq2seq audit: a (1, S) source mask in beam search, parallel files of different
lengths refused before the tokenizer is trained, and HF tokenizers encoding long lists in bounded chunks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.errors import DataError
from attnlab.inference.generate import beam_search, greedy_translate
from attnlab.models.registry import build_model, get_preset

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_beam_search_takes_a_mask_of_one_row_for_every_source():
    # The models (and greedy_translate) take a (1, S) mask for every source; the beams repeated it to (k, S) rows
    # where B·k were needed, and the refusal named shapes the caller never gave.
    torch.manual_seed(0)
    model = build_model(get_preset("seq2seq-tiny")[1]).eval()
    src = torch.randint(4, model.config.src_vocab_size, (3, 6))
    one_row = torch.ones(1, 6, dtype=torch.long)
    one_row[0, 0] = 0  # the first position masked in every source
    full = one_row.expand(3, -1).clone()
    for k in (1, 3):
        assert beam_search(model, src, one_row, beam_size=k, max_len=8) == \
            beam_search(model, src, full, beam_size=k, max_len=8)
    assert greedy_translate(model, src, one_row, max_len=8) == greedy_translate(model, src, full, max_len=8)


def _translation_run(tmp_path, src_lines: int, tgt_lines: int, *, eval_lines: tuple[int, int] | None = None):
    from attnlab.training.recipe import load_run_config

    files = {}
    for name, n in (("train.src", src_lines), ("train.tgt", tgt_lines),
                    *((("dev.src", eval_lines[0]), ("dev.tgt", eval_lines[1])) if eval_lines else ())):
        files[name] = tmp_path / name
        files[name].write_text("".join(f"word {i} more\n" for i in range(n)), encoding="utf-8")
    dev = [f"data.eval_src_path={json.dumps(str(files['dev.src']))}",
           f"data.eval_tgt_path={json.dumps(str(files['dev.tgt']))}"] if eval_lines else \
        ["data.eval_src_path=\"\"", "data.eval_tgt_path=\"\""]
    return load_run_config(CONFIGS / "translate.toml", [
        f"data.src_path={json.dumps(str(files['train.src']))}", f"data.tgt_path={json.dumps(str(files['train.tgt']))}",
        *dev, "train.device=\"cpu\"", f"train.out_dir={json.dumps(str(tmp_path / 'run'))}"])


@pytest.mark.parametrize("lines", [dict(src_lines=20, tgt_lines=19),
                                   dict(src_lines=20, tgt_lines=20, eval_lines=(5, 6))])
def test_parallel_files_of_different_lengths_are_refused_before_the_tokenizer_is_trained(tmp_path, monkeypatch,
                                                                                        lines):
    # The refusal came from ParallelTextSource, after BPE had been trained on both files (minutes on a large corpus).
    from attnlab.training import recipe

    run = _translation_run(tmp_path, **lines)

    def no_training(*args, **kwargs):
        raise AssertionError("the tokenizer was trained before the files were checked")

    monkeypatch.setattr(recipe, "_tokenizer", no_training)
    with pytest.raises(DataError, match=r"parallel files differ in length: '.*(train|dev)\.src' has \d+ lines and "
                                        r"'.*(train|dev)\.tgt' has \d+"):
        recipe.prepare(run)


def test_hf_tokenizers_encode_a_long_list_in_chunks_with_the_same_ids(monkeypatch):
    # One encode_batch over a whole file held every HF Encoding (~100 times the ids) at once: 484 MB for a side of
    # 100,000 lines. The chunks must give the ids of one call, in order.
    from attnlab.data import tokenizers
    from attnlab.data.tokenizers import train_tokenizer

    texts = [f"line {i} of the text, with words {'x' * (i % 7)} and numbers {i * 37}" for i in range(50)]
    for kind in ("bpe", "wordpiece"):
        tokenizer = train_tokenizer(kind, texts, 300)
        whole = [tokenizer.encode(t) for t in texts]
        calls: list[int] = []
        monkeypatch.setattr(tokenizers, "ENCODE_CHUNK", 8)
        monkeypatch.setattr(tokenizer, "_hf", _Counting(tokenizer.hf, calls))
        assert tokenizer.encode_batch(texts) == whole
        assert calls == [8] * 6 + [2], (kind, calls)
        assert tokenizer.encode_batch([]) == []


class _Counting:
    """A HF tokenizer that records the size of each encode_batch call."""

    def __init__(self, hf, calls):
        self._hf, self._calls = hf, calls

    def encode_batch(self, batch, *args, **kwargs):
        self._calls.append(len(batch))
        return self._hf.encode_batch(batch, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._hf, name)
