"""The Python API, third audit (stop 43): a classifier trained with `Trainer` keeps its class names, so `evaluate`
scores its run (it was refused, told that files present were missing); `load_model` takes the device names
`load_run` and `TrainerConfig` take ("auto" failed in torch's words, after the whole model was loaded)."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.data import ClassificationData, ClassificationSource, train_tokenizer
from attnlab.errors import ConfigError
from attnlab.inference.runs import evaluate_file, load_run
from attnlab.models.encoder import EncoderConfig, EncoderModel
from attnlab.training import Trainer, TrainerConfig, load_model

TEXTS = ["good movie", "bad film", "great acting", "terrible plot"] * 2
LABELS = ["pos", "neg", "pos", "neg"] * 2


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "cls"
    tokenizer = train_tokenizer("word", TEXTS)
    source = ClassificationSource(ClassificationData(TEXTS, LABELS, list(range(1, 9))), tokenizer, 4,
                                  prefix_ids=[tokenizer.cls_id], suffix_ids=[tokenizer.sep_id])
    torch.manual_seed(0)
    model = EncoderModel(EncoderConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                                       head="classification", n_classes=source.num_labels, pad_id=tokenizer.pad_id))
    Trainer(model, TrainerConfig(steps=2, batch_size=4, device="cpu", progress=False, precision="fp32"), source,
            tokenizer=tokenizer, out_dir=out).fit()
    return out, source.label_names


def test_a_classifier_trained_from_python_is_evaluated_by_its_class_names(classifier_run, tmp_path):
    out, names = classifier_run
    table = tmp_path / "dev.tsv"
    table.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in zip(TEXTS, LABELS)), encoding="utf-8")
    scores = evaluate_file(load_run(out), table)
    assert scores["examples"] == 8 and 0 <= scores["accuracy"] <= 100
    state = json.loads((out / "checkpoint" / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["extra_state"]["labels"] == names == ["neg", "pos"]


@pytest.mark.parametrize("name", ["auto", "cpu", torch.device("cpu")])
def test_load_model_takes_the_device_names_load_run_takes(classifier_run, name):
    assert next(load_model(classifier_run[0], name).parameters()).device.type == "cpu"


def test_load_model_refuses_a_device_name_in_one_line(classifier_run):
    with pytest.raises(ConfigError, match=r"^device: unknown device 'gpu'; choose one of"):
        load_model(classifier_run[0], "gpu")


def _gpt():
    from attnlab.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=1)).eval()


@pytest.mark.parametrize("given, says", [
    ({"document_ids": torch.tensor([0, 0, 1, 1, 1])}, "document_ids has shape (5,); it must be (2, 5), input_ids'"),
    ({"document_ids": torch.zeros(2, 4, dtype=torch.long)}, "document_ids has shape (2, 4); it must be (2, 5)"),
    ({"document_ids": torch.zeros(2, 5)}, "document_ids must be a tensor of integers; got float32"),
    ({"positions": torch.arange(5.0)[None] / 2}, "positions must be a tensor of integers; got float32"),
])
def test_gpt_refuses_document_ids_and_positions_of_the_wrong_shape_or_type_in_one_line(given, says):
    # (document ids of shape (5,) failed in an unpacking error, fractional positions were read as a table's rows)
    with pytest.raises(ConfigError) as info:
        _gpt()(torch.randint(0, 11, (2, 5)), **given)
    assert str(info.value).startswith(says), info.value


def test_bert_refuses_float_segment_ids_in_one_line():
    from attnlab.models.bert import BertConfig, BertModel

    model = BertModel(BertConfig(vocab_size=11, max_len=8, d_model=16, n_heads=2, n_layers=1)).eval()
    with pytest.raises(ConfigError, match=r"^token_type_ids must be a tensor of integers; got float32$"):
        model(torch.randint(0, 11, (2, 5)), token_type_ids=torch.zeros(2, 5))
    assert model(torch.randint(0, 11, (2, 5)), token_type_ids=torch.zeros(2, 5, dtype=torch.int32)).logits.shape[:2] \
        == (2, 5)


def test_dir_of_the_lazy_packages_lists_their_exports():
    import attnlab.convert
    import attnlab.data

    for package in (attnlab.convert, attnlab.data):
        assert set(package.__all__) <= set(dir(package)), package.__name__
