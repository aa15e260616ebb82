"""Rules of the data, file and checkpoint layers that a plausible one-line slip would break unnoticed by the
other tests (found by mutation testing): tokenizer edge cases, classification-file parsing, streamed decoding
errors, token-file sizes, atomic writes, checkpoint refusals and device/precision selection."""

from __future__ import annotations

import codecs
import itertools
import json
import os

import pytest

from attnlab.data.corpus import TokenFile, build_token_file, sidecar_path
from attnlab.data.text_files import (
    held_out_documents,
    iter_text_blocks,
    read_classification_file,
    read_text,
)
from attnlab.data.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    SpecialTokens,
    WordPieceTokenizer,
    WordTokenizer,
)
from attnlab.errors import ConfigError, DataError
from attnlab.files import write_text_atomic

LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "A tokenizer maps text to ids, and ids back to text!",
    "Attention is all you need; attention weights sum to one.",
] * 3


# ------------------------------------------------------------------------------------------------
# Tokenizers
# ------------------------------------------------------------------------------------------------
def test_char_vocabulary_entries_must_be_one_character():
    with pytest.raises(ConfigError, match="single character"):
        CharTokenizer(["a", ""])


def test_word_ties_are_broken_alphabetically():
    # "b" is seen first, but equal counts are ordered by the word itself, as documented.
    tok = WordTokenizer.train("b a d c", specials={"pad": "<pad>", "unk": None, "mask": None, "cls": None,
                                                   "sep": None, "bos": None, "eos": None})
    assert tok.vocab() == ["<pad>", "a", "b", "c", "d"]


def test_word_encode_array_of_one_string_is_its_encode():
    tok = WordTokenizer.train("ab cd ab")
    assert tok.encode_array("ab cd ab\ncd").tolist() == tok.encode("ab cd ab\ncd")
    assert tok.encode_array(["ab cd", "ab"]).tolist() == tok.encode("ab cd") + tok.encode("ab")


def test_subword_decode_refuses_an_id_outside_the_vocabulary():
    bpe = BPETokenizer.train(LINES, vocab_size=300)
    with pytest.raises(DataError, match="out of range"):
        bpe.decode([bpe.vocab_size])
    with pytest.raises(DataError, match="out of range"):
        bpe.decode([-1])


def test_bpe_smallest_vocabulary_is_accepted():
    smallest = 256 + 7  # byte symbols + the default specials
    tok = BPETokenizer.train(LINES, vocab_size=smallest)
    assert tok.vocab_size == smallest
    assert tok.decode(tok.encode(LINES[0])) == LINES[0]
    with pytest.raises(ConfigError, match="at least 263"):
        BPETokenizer.train(LINES, vocab_size=smallest - 1)


def test_wordpiece_needs_room_beyond_the_specials():
    with pytest.raises(ConfigError, match="must exceed"):
        WordPieceTokenizer.train(LINES, vocab_size=7)


def test_wordpiece_trains_the_same_from_a_one_shot_iterator():
    from_list = WordPieceTokenizer.train(LINES, vocab_size=120, min_frequency=1)
    from_iter = WordPieceTokenizer.train(iter(LINES), vocab_size=120, min_frequency=1)
    assert from_iter.vocab() == from_list.vocab()
    assert from_iter.encode(LINES[1]) == from_list.encode(LINES[1])


# ------------------------------------------------------------------------------------------------
# Text files
# ------------------------------------------------------------------------------------------------
def test_empty_file_is_reported_as_empty(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    with pytest.raises(DataError, match="is empty"):
        read_text(path)


@pytest.mark.parametrize("bom", [codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE])
def test_utf16_files_are_named_as_such(tmp_path, bom):
    path = tmp_path / "utf16.txt"
    encoding = "utf-16-le" if bom == codecs.BOM_UTF16_LE else "utf-16-be"
    path.write_bytes(bom + "héllo wörld\n".encode(encoding))
    with pytest.raises(DataError, match="UTF-16"):
        read_text(path)


def test_binary_file_detection_threshold(tmp_path):
    # Over 1 % NUL bytes in a file that is not UTF-8: a binary file. Fewer: the bad byte is located.
    path = tmp_path / "data.txt"
    path.write_bytes(b"\xff" + b"\x00" * 3 + b"a" * 96)  # 3 % NUL
    with pytest.raises(DataError, match="looks like a binary file"):
        read_text(path)
    path.write_bytes(b"\xff" + b"\x00" + b"a" * 498)  # 0.2 % NUL
    with pytest.raises(DataError, match=r"byte 0xff at line 1 \(byte offset 0\)"):
        read_text(path)


def test_streamed_decode_error_offset_when_a_character_straddles_blocks(tmp_path):
    path = tmp_path / "bad.txt"
    data = b"abc" + "é".encode() + b"\xff" + b"xyz\n"  # é is bytes 3-4, the bad byte is at 5
    path.write_bytes(data)
    with pytest.raises(DataError, match=r"byte 0xff at line 1 \(byte offset 5\)"):
        list(iter_text_blocks(path, block_bytes=4))  # the first block ends inside é


def test_streamed_blocks_drop_a_bom_split_across_blocks(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(codecs.BOM_UTF8 + b"ab\ncd\n")
    for block_bytes in (1, 2, 3):
        assert "".join(iter_text_blocks(path, block_bytes=block_bytes)) == "ab\ncd\n"


def test_jsonl_line_must_be_an_object(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": 1}\n"text label"\n')
    with pytest.raises(DataError, match="line 2: expected a JSON object"):
        read_classification_file(path)


def test_jsonl_text_must_be_a_string(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": 1}\n{"text": 5, "label": 0}\n')
    with pytest.raises(DataError, match="line 2: no string field 'text'"):
        read_classification_file(path)


def test_jsonl_same_text_and_label_field_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": "1"}\n')
    with pytest.raises(DataError, match="are the same"):
        read_classification_file(path, text_column="label", label_column="label")


@pytest.mark.parametrize("value", ["true", "1.5"])
def test_jsonl_labels_must_be_strings_or_integers(tmp_path, value):
    path = tmp_path / "d.jsonl"
    lines = [{"text": "a", "label": 1}, '{"text": "b", "label": ' + value + "}"]
    path.write_text(json.dumps(lines[0]) + "\n" + lines[1] + "\n")
    with pytest.raises(DataError, match="line 2: label"):
        read_classification_file(path)
    path.write_text('{"text": "a", "label": 1.0}\n')
    assert read_classification_file(path).labels == ["1"]


def test_csv_line_numbers_count_physical_lines(tmp_path):
    # A quoted field holding a line break: the next row starts on line 4, not on line 3.
    path = tmp_path / "d.csv"
    path.write_text('text,label\n"two\nlines",1\nnext,0\n')
    data = read_classification_file(path)
    assert data.texts == ["two\nlines", "next"]
    assert data.line_numbers == [2, 4]


def test_header_names_are_matched_without_case_or_padding(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("Sentence\tLabel\nhello\t1\nworld\t0\n")
    data = read_classification_file(path)
    assert data.texts == ["hello", "world"] and data.labels == ["1", "0"]
    path.write_text("text \t label\nhello\t1\n")
    data = read_classification_file(path, text_column="text", label_column="label")
    assert data.texts == ["hello"] and data.labels == ["1"]
    # A column named in the config finds the header's "Label" as the columns found without a name do ...
    path.write_text("Sentence\tLabel\nhello\t1\n")
    data = read_classification_file(path, label_column="label")
    assert data.texts == ["hello"] and data.labels == ["1"]
    assert read_classification_file(path, text_column="SENTENCE ", label_column="label").texts == ["hello"]
    # ... where one column only is so named; two are refused as ambiguous.
    path.write_text("text\tLabel\tlabel \nhello\t1\t0\n")
    with pytest.raises(DataError, match=r"columns 1 \('Label'\) and 2 \('label'\) of the header both read as "
                                        "'LABEL', so the label column is ambiguous"):
        read_classification_file(path, label_column="LABEL")


def test_a_headerless_file_read_with_one_named_column_says_it_has_no_header(tmp_path):
    """The shipped classifier config names the label column only: a file without a header had been told its first
    row was a header without a text column, and to name one, which then gave the right message."""
    path = tmp_path / "d.tsv"
    path.write_text("lovely nice movie\t1\nawful movie\t0\n")
    for text_column in (None, "sentence"):
        with pytest.raises(DataError, match=r"first row \['lovely nice movie', '1'\] does not look like a header; "
                                            "if the file has none, give the columns by 0-based number"):
            read_classification_file(path, text_column=text_column, label_column="label")
    # a header of names attnlab does not know, one of them given: a header, whose other column is to be named
    path.write_text("tweet\tstars\ngood\t5\n")
    with pytest.raises(DataError, match=r"cannot find the label column in the header \['tweet', 'stars'\]; set "
                                        "data.label_column"):
        read_classification_file(path, text_column="tweet")
    with pytest.raises(DataError, match=r"cannot find the text column in the header \['tweet', 'stars'\]; set "
                                        "data.text_column"):
        read_classification_file(path, label_column="stars")


def test_headerless_two_columns_keep_labels_when_they_are_optional(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("hello\t1\nworld\t0\n")
    data = read_classification_file(path, require_labels=False)
    assert data.texts == ["hello", "world"] and data.labels == ["1", "0"]


def test_negative_column_numbers_are_refused(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("hello\t1\nworld\t0\n")
    with pytest.raises(DataError, match="column -1 does not exist"):
        read_classification_file(path, text_column=-1, label_column=0)


def test_named_column_in_a_headerless_file_explains_itself(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("hello\t1\nworld\t0\n")
    with pytest.raises(DataError, match="does not look like a header"):
        read_classification_file(path, text_column="review", label_column=1)


def test_held_out_documents_whole_only_from_two():
    docs = [[f"d{i}s{j}" for j in range(3)] for i in range(4)] + [[f"d4s{j}" for j in range(5)]]
    train, held = held_out_documents(docs, 0.4)  # two whole documents
    assert train == docs[:3] and held == docs[3:]
    # A fraction that holds out one document cuts sentences instead: the last 3 of the 17.
    train, held = held_out_documents(docs, 0.2)
    assert held == [docs[4][2:]] and train == [*docs[:4], docs[4][:2]]


def test_held_out_part_needs_a_sentence_pair():
    docs = [["a1", "a2", "a3"], ["b1", "b2", "b3"], ["c1"], ["d1"]]
    # The last 2 of 8 sentences are two one-sentence documents: no pair, so nothing is held out.
    assert held_out_documents(docs, 0.25) == (docs, [])


# ------------------------------------------------------------------------------------------------
# Token files
# ------------------------------------------------------------------------------------------------
def _first_blocks(source, block_chars, n=20):
    from attnlab.data.corpus import _blocks

    return ["".join(group) for group in itertools.islice(_blocks(source, block_chars), n)]


def test_string_source_is_cut_at_line_ends_into_bounded_blocks():
    # Before the line end, where every tokenizer ends a token (BPE joins "\n" to the next line's indentation).
    assert _first_blocks("ab\ncd\nef", 4) == ["ab", "\ncd", "\nef"]
    # No line end inside a block: cut at the block size, nothing lost at the end.
    assert _first_blocks("abcdefg", 3) == ["abc", "def", "g"]
    assert _first_blocks("abcdef", 3) == ["abc", "def"]


def _word_tokenizer(size):
    return WordTokenizer([str(i) for i in range(size)], specials=SpecialTokens.none())


def test_explicit_uint16_refuses_a_vocabulary_that_does_not_fit(tmp_path):
    with pytest.raises(ConfigError, match="does not fit"):
        build_token_file("1 2", _word_tokenizer(65537), tmp_path / "t.bin", dtype="uint16")
    assert build_token_file("1 65535", _word_tokenizer(65536), tmp_path / "t.bin", dtype="uint16")[:].tolist() == [
        1, 65535]


def test_token_file_dtype_must_be_unsigned_16_or_32_bits(tmp_path):
    with pytest.raises(ConfigError, match="uint16 or uint32"):
        build_token_file("1 2", _word_tokenizer(10), tmp_path / "t.bin", dtype="int32")


def test_token_file_source_items_must_be_strings(tmp_path):
    with pytest.raises(ConfigError, match="expected strings"):
        build_token_file(["1 2", b"3"], _word_tokenizer(10), tmp_path / "t.bin")


def test_add_eos_needs_an_eos_token(tmp_path):
    with pytest.raises(ConfigError, match="eos"):
        build_token_file(["1 2"], _word_tokenizer(10), tmp_path / "t.bin", add_eos=True)


def test_token_file_with_no_tokens_or_a_bad_sidecar_is_refused(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(b"")
    meta = {"format": "attnlab-token-ids", "version": 1, "dtype": "uint16", "length": 0, "vocab_size": 3}
    sidecar_path(path).write_text(json.dumps(meta))
    with pytest.raises(DataError, match="rebuild"):
        TokenFile(path)
    path.write_bytes(b"\x01\x00")
    sidecar_path(path).write_text(json.dumps({**meta, "length": None}))
    with pytest.raises(DataError, match="corrupt"):
        TokenFile(path)
    path.write_bytes(b"\x01\x00\x00\x00")  # one float32 or int32 "id": read as such before
    for dtype in ("float32", "int32", "object"):
        sidecar_path(path).write_text(json.dumps({**meta, "dtype": dtype, "length": 1}))
        with pytest.raises(DataError, match="corrupt.*uint16 or uint32"):
            TokenFile(path)


# ------------------------------------------------------------------------------------------------
# Atomic writes
# ------------------------------------------------------------------------------------------------
def test_atomic_write_flushes_the_new_file_before_renaming(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    path = write_text_atomic(tmp_path / "results.md", "x\n")
    assert path.stat().st_ino in synced  # the renamed file is the one that was flushed


# ------------------------------------------------------------------------------------------------
# Checkpoints
# ------------------------------------------------------------------------------------------------
def _trained_tiny(seed: int = 0, tie: bool = False, **optimizer_options):
    import torch
    from training_helpers import ToySource, tiny_model

    model = tiny_model(seed=seed, tie=tie)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, **optimizer_options)
    model(**ToySource().batch(seed)).loss.backward()
    optimizer.step()
    return model, optimizer


def _rewrite_safetensors(path, rename=None, metadata=None, change=None):
    """Rewrite a safetensors file with keys renamed, header entries replaced and tensors changed."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    tensors = {(rename or {}).get(k, k): v for k, v in tensors.items()}
    for key, fn in (change or {}).items():
        tensors[key] = fn(tensors[key])
    save_file(tensors, str(path), metadata={**meta, **(metadata or {})})


class _PlainTokenizer:
    def save(self, path):
        with open(path, "w") as f:
            f.write("{}")


def test_checkpoint_files_and_folders_are_flushed(tmp_path, monkeypatch):
    from attnlab.training.checkpoint import save_checkpoint

    model, optimizer = _trained_tiny()
    synced = set()
    real_fsync = os.fsync

    def spy(fd):
        st = os.fstat(fd)
        synced.add((st.st_dev, st.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    folder = save_checkpoint(tmp_path / "checkpoint", model, optimizer, {"step": 1}, _PlainTokenizer())
    monkeypatch.undo()
    paths = [*folder.iterdir(), folder, tmp_path]
    assert len(paths) == 7
    for path in paths:
        st = path.stat()
        assert (st.st_dev, st.st_ino) in synced, path.name


def test_failed_checkpoint_save_leaves_no_temporary_folder(tmp_path, monkeypatch):
    import attnlab.training.checkpoint as ckpt

    model, optimizer = _trained_tiny()
    ckpt.save_checkpoint(tmp_path / "checkpoint", model, optimizer, {"step": 1})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_write_json", crash)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path / "checkpoint", model, optimizer, {"step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_save_over_a_stale_old_copy(tmp_path):
    from attnlab.training.checkpoint import load_model, save_checkpoint

    model, _ = _trained_tiny(seed=1)
    save_checkpoint(tmp_path / "checkpoint", model)
    stale = tmp_path / ".checkpoint.old"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"left by a crash")
    new, _ = _trained_tiny(seed=2)
    save_checkpoint(tmp_path / "checkpoint", new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert load_model(tmp_path).embed.weight.equal(new.embed.weight)


def test_old_copy_is_not_used_beside_an_incomplete_folder(tmp_path):
    from attnlab.errors import CheckpointError
    from attnlab.training.checkpoint import find_checkpoint, save_checkpoint

    model, _ = _trained_tiny()
    save_checkpoint(tmp_path / "checkpoint", model)
    (tmp_path / "checkpoint").rename(tmp_path / ".checkpoint.old")
    assert find_checkpoint(tmp_path / "checkpoint") == tmp_path / ".checkpoint.old"  # the crash case
    (tmp_path / "checkpoint").mkdir()  # something else is there now: not the crash case
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        find_checkpoint(tmp_path / "checkpoint")


def test_non_finite_weights_are_refused(tmp_path):
    import torch

    from attnlab.errors import CheckpointError
    from attnlab.training.checkpoint import load_model, save_checkpoint

    model, _ = _trained_tiny()
    with torch.no_grad():
        model.norm.bias[0] = float("nan")
    save_checkpoint(tmp_path / "c", model)
    with pytest.raises(CheckpointError, match="'norm.bias' contains NaN or inf"):
        load_model(tmp_path / "c")


def test_alias_to_a_missing_tensor_is_refused(tmp_path):
    from attnlab.errors import CheckpointError
    from attnlab.training.checkpoint import load_model, save_checkpoint

    model, _ = _trained_tiny(tie=True)
    folder = save_checkpoint(tmp_path / "c", model)
    _rewrite_safetensors(folder / "model.safetensors", metadata={"aliases": json.dumps({"head.weight": "gone"})})
    with pytest.raises(CheckpointError, match="points to missing tensor 'gone'"):
        load_model(folder)


def test_optimizer_state_for_a_parameter_past_the_end_is_refused(tmp_path):
    from attnlab.errors import CheckpointError
    from attnlab.training.checkpoint import load_checkpoint_into, save_checkpoint

    model, optimizer = _trained_tiny()
    folder = save_checkpoint(tmp_path / "c", model, optimizer)
    n = len(list(model.parameters()))
    _rewrite_safetensors(folder / "optimizer.safetensors", rename={"0.exp_avg": f"{n}.exp_avg"})
    fresh, fresh_opt = _trained_tiny(seed=3)
    with pytest.raises(CheckpointError, match=f"state for parameter {n} but the optimizer has {n}"):
        load_checkpoint_into(folder, fresh, fresh_opt)


def test_optimizer_implementation_switches_stay_the_current_ones(tmp_path):
    from attnlab.training.checkpoint import load_checkpoint_into, save_checkpoint

    model, optimizer = _trained_tiny(foreach=True)
    folder = save_checkpoint(tmp_path / "c", model, optimizer)
    fresh, fresh_opt = _trained_tiny(seed=3, foreach=False)
    load_checkpoint_into(folder, fresh, fresh_opt)
    assert fresh_opt.param_groups[0]["foreach"] is False
    assert fresh_opt.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


# ------------------------------------------------------------------------------------------------
# Devices and precision (feature detection monkeypatched: nothing depends on this machine)
# ------------------------------------------------------------------------------------------------
def test_auto_device_prefers_mps_over_the_cpu(monkeypatch):
    import torch

    from attnlab.training import device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device, "_mps_available", lambda: True)
    assert device.select_device("auto") == torch.device("mps")
    monkeypatch.setattr(device, "_mps_available", lambda: False)
    assert device.select_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="not available"):
        device.select_device("mps")


def test_cuda_index_must_exist(monkeypatch):
    import torch

    from attnlab.training import device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device.select_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ConfigError, match="does not exist"):
        device.select_device("cuda:2")
    for name in ("cuda:x", "cuda:-1"):
        with pytest.raises(ConfigError, match="is not a device name"):
            device.select_device(name)
    with pytest.raises(ConfigError, match="unknown device"):
        device.select_device("auto:0")


def test_mps_never_gets_bf16_autocast(monkeypatch):
    import torch

    from attnlab.training import device

    assert device.resolve_precision("auto", torch.device("mps")) is None


@pytest.mark.parametrize("torch_says", [None, "error", "warning"])
def test_explicit_bf16_on_mps_is_refused_where_torch_cannot_autocast_it(monkeypatch, torch_says):
    """torch 2.4 has no MPS autocast (a traceback at the first forward); 2.5, or macOS 13, disables it with a
    warning, and the run trained in fp32 while recorded as bf16. Where torch takes it, bf16 it is."""
    import warnings

    import torch

    from attnlab.training import device

    real = torch.autocast

    def autocast(device_type, dtype=None, **kwargs):
        if device_type == "mps" and torch_says == "error":
            raise RuntimeError("User specified an unsupported autocast device_type 'mps'")
        if device_type == "mps" and torch_says == "warning":
            warnings.warn("In MPS autocast, but the target dtype is not supported. Disabling autocast.\n"
                          "MPS Autocast only supports dtype of torch.float16 currently.", stacklevel=2)
            return real("cpu", dtype=dtype, enabled=False)
        return real(device_type, dtype=dtype, **kwargs)

    monkeypatch.setattr(torch, "autocast", autocast)
    if torch_says is None:
        assert device.resolve_precision("bf16", torch.device("mps")) is torch.bfloat16
        return
    with pytest.raises(ConfigError) as info:
        device.resolve_precision("bf16", torch.device("mps"))
    message = str(info.value)
    assert "\n" not in message and message.startswith('precision = "bf16" cannot run on this MPS device')
    assert ("unsupported autocast device_type" if torch_says == "error" else "Disabling autocast") in message
    assert message.endswith('use precision = "auto" or "fp32"')


@pytest.mark.parametrize("capability, amd, wanted", [("AVX512", True, True), ("AVX2", True, False),
                                                     ("DEFAULT", True, False), ("AVX512", False, False)])
def test_onednn_switch_only_for_wide_models_on_avx512_cpus(monkeypatch, capability, amd, wanted):
    # (the last case, stop 42: on an Intel Ice Lake MKL runs AVX-512 itself, and the switch made an fp32 step at
    # shape B 12 % slower)
    import torch

    from attnlab.training import device
    from attnlab.training.device import ONEDNN_FP32_MIN_WIDTH, wants_onednn_fp32

    monkeypatch.setattr(device, "cpu_is_amd", lambda: amd)

    class M(torch.nn.Module):
        def __init__(self, d_model):
            super().__init__()
            self.config = type("C", (), {"d_model": d_model})()

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert wants_onednn_fp32(M(ONEDNN_FP32_MIN_WIDTH)) is wanted
    assert not wants_onednn_fp32(M(ONEDNN_FP32_MIN_WIDTH - 1))


def test_config_without_a_family_is_refused(tmp_path):
    from attnlab.errors import CheckpointError
    from attnlab.training.checkpoint import load_model, save_checkpoint

    model, _ = _trained_tiny()
    folder = save_checkpoint(tmp_path / "c", model)
    (folder / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="has no model family"):
        load_model(folder)


def test_tied_weights_are_stored_once(tmp_path):
    from safetensors import safe_open

    from attnlab.training.checkpoint import save_checkpoint

    model, _ = _trained_tiny(tie=True)
    folder = save_checkpoint(tmp_path / "c", model)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    assert len(keys & {"embed.weight", "head.weight"}) == 1
    assert len(json.loads(meta["aliases"])) == 1


@pytest.mark.parametrize("entry, value, match", [
    ("aliases", {"head.weight": ["embed.weight"]}, "not an object of strings"),
])
def test_malformed_model_header_is_refused(tmp_path, entry, value, match):
    from attnlab.errors import CheckpointError
    from attnlab.training.checkpoint import load_model, save_checkpoint

    model, _ = _trained_tiny(tie=True)
    folder = save_checkpoint(tmp_path / "c", model)
    _rewrite_safetensors(folder / "model.safetensors", metadata={entry: json.dumps(value)})
    with pytest.raises(CheckpointError, match=match):
        load_model(folder)


def test_malformed_optimizer_groups_and_trainer_state_are_refused(tmp_path):
    from attnlab.errors import CheckpointError
    from attnlab.training.checkpoint import load_checkpoint_into, read_trainer_state, save_checkpoint

    model, optimizer = _trained_tiny()
    folder = save_checkpoint(tmp_path / "c", model, optimizer, {"step": 1})
    (folder / "trainer_state.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="not a JSON object"):
        read_trainer_state(folder)
    _rewrite_safetensors(folder / "optimizer.safetensors", metadata={"param_groups": "[1]"})
    fresh, fresh_opt = _trained_tiny(seed=3)
    with pytest.raises(CheckpointError, match="no parameter groups"):
        load_checkpoint_into(folder, fresh, fresh_opt)


def test_onednn_switch_is_for_the_cpu_only(monkeypatch):
    import torch

    from attnlab.training import device

    backend = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    if backend is None or not hasattr(backend, "fp32_precision"):
        pytest.skip("this torch has no oneDNN fp32 precision switch")
    monkeypatch.setattr(device, "onednn_fp32_is_exact", lambda: True)  # as on an AVX-512 CPU without AMX
    before = backend.fp32_precision
    with device.fast_fp32_matmul("cuda") as used:
        assert used is False and backend.fp32_precision == before
    with device.fast_fp32_matmul("cpu") as used:
        assert used is True
    assert backend.fp32_precision == before
