"""A tiny stand-in language model and batch sources for the training tests, and the DDP worker.

Run as a script under torchrun (``python -m torch.distributed.run --nproc-per-node 2 training_helpers.py
OUT_DIR``) it trains `tiny_model()` with `ddp_trainer_config()` on `ToySource` and writes the run into
OUT_DIR, for tests/test_ddp.py to compare with a single-process run.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.config import Config, check_positive
from attnlab.models.output import ModelOutput
from attnlab.models.registry import FAMILIES, register_family

VOCAB = 13
SEQ = 6


@dataclass
class TinyLMConfig(Config):
    vocab_size: int = VOCAB
    d_model: int = 8
    dropout: float = 0.0
    tie: bool = False

    def __post_init__(self):
        check_positive("vocab_size", self.vocab_size)
        check_positive("d_model", self.d_model)


class TinyLM(nn.Module):
    """Embedding -> dropout -> (optionally tied) output projection; follows the ModelOutput contract."""

    def __init__(self, config: TinyLMConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.norm = nn.LayerNorm(config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.d_model, config.vocab_size)
        if config.tie:
            self.head.weight = self.embed.weight

    def forward(self, input_ids, labels=None, attention_mask=None) -> ModelOutput:
        logits = self.head(self.drop(self.norm(self.embed(input_ids))))  # (B, T, V)
        if labels is None:
            return ModelOutput(logits=logits)
        flat = labels.reshape(-1)
        n = (flat != -100).sum()
        total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), flat, ignore_index=-100,
                                reduction="sum")
        return ModelOutput(logits=logits, loss=total / n.clamp(min=1), n_targets=n)


if "test-tiny-lm" not in FAMILIES:
    register_family("test-tiny-lm", TinyLMConfig, TinyLM)


def token_accuracy_counts(batch, out) -> dict[str, tuple]:
    """`eval_counts` for the tiny LM: next-token accuracy (%), and the share of rows with exactly one
    ignored target, reported only by batches that have such a row (with `ToySource`'s evaluation rows
    in batches of 2 only odd batches do, so under 2 processes only the second one sees the name)."""
    labels = batch["labels"]
    picked = labels != -100
    counts = {"token_accuracy": (100.0 * (out.logits.argmax(-1)[picked] == labels[picked]).sum(), picked.sum())}
    one = (~picked).sum(dim=1) == 1
    if bool(one.any()):
        counts["one_ignored"] = (one.sum(), labels.shape[0])
    return counts


def tiny_model(seed: int = 0, **kwargs) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(TinyLMConfig(**kwargs))


class ToySource:
    """Global batches that are a pure function of (seed, step); each row has a different number of
    ignored (-100) trailing labels, so micro-batches hold different numbers of targets."""

    def __init__(self, batch_size: int = 8, seed: int = 0, n_eval: int = 10, interrupt_at: int | None = None,
                 crash_at: int | None = None):
        self.batch_size = batch_size
        self.seed = seed
        self.n_eval = n_eval
        self.interrupt_at = interrupt_at
        self.crash_at = crash_at  # the process dies there, as if killed (kill -9, a lost node): nothing saved
        self.steps_per_epoch = None

    def _rows(self, generator: torch.Generator, n: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (n, SEQ + 1), generator=generator)
        labels = ids[:, 1:].clone()
        pads = torch.randint(0, SEQ, (n,), generator=generator)  # 0..SEQ-1 ignored targets per row
        for r in range(n):
            if pads[r]:
                labels[r, SEQ - int(pads[r]):] = -100
        return {"input_ids": ids[:, :-1].contiguous(), "labels": labels}

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        if self.interrupt_at is not None and step == self.interrupt_at:
            self.interrupt_at = None  # like a user pressing Ctrl-C once
            raise KeyboardInterrupt
        if self.crash_at is not None and step == self.crash_at:
            os._exit(3)
        return self._rows(torch.Generator().manual_seed(self.seed * 100_003 + step), self.batch_size)

    def iter_batches(self, batch_size: int):
        rows = self._rows(torch.Generator().manual_seed(999), self.n_eval)
        for lo in range(0, self.n_eval, batch_size):
            yield {k: v[lo:lo + batch_size] for k, v in rows.items()}


def stopped_and_resumed(cfg, tmp_path, stop: int = 3):
    """(the uninterrupted run's Trainer, the Trainer of the same run stopped at step `stop` and resumed from
    its checkpoint by a model built from another seed): for exact-resume tests, which compare their weights."""
    from attnlab.training import Trainer

    full = Trainer(tiny_model(dropout=0.3), cfg, ToySource(), eval_source=ToySource(), out_dir=tmp_path / "a")
    full.fit()
    first = Trainer(tiny_model(dropout=0.3), cfg.replace(steps=stop, save_every=stop), ToySource(),
                    eval_source=ToySource(), out_dir=tmp_path / "b")
    first.fit()
    second = Trainer(tiny_model(dropout=0.3, seed=123), cfg, ToySource(), eval_source=ToySource(),
                     out_dir=tmp_path / "b", resume=True)
    assert second.fit()["start_step"] == stop
    return full, second


def ddp_trainer_config(**changes):
    from attnlab.training import TrainerConfig

    settings = dict(steps=3, batch_size=8, micro_batch_size=2, lr=1e-2, warmup_steps=1, schedule="cosine",
                    precision="fp32", device="cpu", progress=False, log_every=1, weight_decay=0.1,
                    grad_clip=1.0)
    settings.update(changes)
    return TrainerConfig(**settings)


def log_window_config(steps: int):
    """Logs at steps 4 and 6 (and the end), a checkpoint at step 3: inside the first log window."""
    return ddp_trainer_config(steps=steps, schedule="noam", warmup_steps=2, log_every=4, save_every=3)


TOWNS = ["Lyon", "Oslo", "Porto", "Quito", "Accra", "Hanoi"]
PACKED_DOCS = [f"Person {i}. Person {i} was born in {TOWNS[i % 6]} and lives in {TOWNS[(i + 2) % 6]} ."
               for i in range(9)]


def packed_run(pack: bool):
    """A GPT and a span-corruption source with 8 documents a batch, packed several to a row or one to a row."""
    from attnlab.data.knowledge import KnowledgeVocab, SpanCorruptionSource
    from attnlab.models.gpt import GPT, GPTConfig

    vocab = KnowledgeVocab.from_texts("".join(PACKED_DOCS), "")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab.vocab_size, block_size=64, d_model=16, n_heads=2, n_layers=1))
    return model, SpanCorruptionSource(PACKED_DOCS, vocab, 64, 8, seed=3, pack=pack)


def bert_nsp_run(**options):
    """A BERT with masked-LM and next-sentence heads (a loss of two means, each weighted by its own count:
    `loss_terms`), a fixed batch of 8 padded pairs, and micro-batches of 2."""
    from attnlab.models.bert import BertConfig, BertModel
    from attnlab.training import TrainerConfig

    g = torch.Generator().manual_seed(0)
    rows, length, vocab = 8, 7, 20
    lengths = torch.randint(2, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    ids = torch.randint(3, vocab, (rows, length), generator=g).masked_fill(mask == 0, 0)
    labels = torch.full((rows, length), -100)
    picked = (torch.rand(rows, length, generator=g) < 0.4) & (mask == 1)
    labels[picked] = ids[picked]
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels,
             "next_sentence_label": torch.randint(0, 2, (rows,), generator=g)}

    class OneBatch:
        steps_per_epoch = None

        def batch(self, step):
            return batch

        def iter_batches(self, n=None):
            yield batch

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=vocab, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16,
                                 dropout=0.0, attention_dropout=0.0, **{"nsp": True, **options}))
    config = TrainerConfig(steps=3, batch_size=8, micro_batch_size=2, lr=1e-2, warmup_steps=1, precision="fp32",
                           device="cpu", progress=False, log_every=1, weight_decay=0.1, grad_clip=1.0)
    return model, config, OneBatch()


def _ddp_main(out_dir: str, layout: str = "plain") -> None:
    from attnlab.training import Trainer
    from attnlab.training.distributed import shutdown

    torch.set_num_threads(1)
    if layout == "packed":
        model, source = packed_run(pack=True)
        trainer = Trainer(model, ddp_trainer_config(), source, out_dir=out_dir)
    elif layout in ("bert-nsp", "bert-mlm-pooler"):  # the second: a pooler that no head reads
        model, config, source = bert_nsp_run(**({"nsp": False, "pooler": True} if layout == "bert-mlm-pooler" else {}))
        trainer = Trainer(model, config, source, out_dir=out_dir)
    elif layout in ("dropout-full", "dropout-first", "dropout-resume", "dropout-interrupted"):
        # each process draws its own masks; "dropout-interrupted": Ctrl-C in every process at step 3, where the
        # processes save without gathering (rank 0's random state alone)
        steps = 3 if layout == "dropout-first" else 6  # noam does not depend on `steps`
        config = ddp_trainer_config(steps=steps, schedule="noam", warmup_steps=2, save_every=3)
        source = ToySource(interrupt_at=3 if layout == "dropout-interrupted" else None)
        trainer = Trainer(tiny_model(dropout=0.3, seed=0 if layout != "dropout-resume" else 123), config,
                          source, out_dir=out_dir, resume=layout == "dropout-resume")
        if layout == "dropout-interrupted":
            from attnlab.training import TrainingInterrupted

            try:
                trainer.fit()
            except TrainingInterrupted:
                shutdown()
                return
            raise AssertionError("the run was not interrupted")
    elif layout in ("log-full", "log-crash", "log-resume"):  # a checkpoint inside a log window (steps 1-4)
        trainer = Trainer(tiny_model(), log_window_config(steps=6), ToySource(crash_at=3 if layout == "log-crash"
                                                                              else None),
                          out_dir=out_dir, resume=layout == "log-resume")
    elif layout in ("other-shape", "other-count"):  # rank 1 builds another model, as from other data files
        import os

        from attnlab.training.distributed import failed

        other = {"other-shape": dict(vocab_size=VOCAB + 1), "other-count": dict(tie=True)}[layout]
        model = tiny_model(**(other if os.environ.get("RANK") == "1" else {}))
        try:
            trainer = Trainer(model, ddp_trainer_config(), ToySource(), out_dir=out_dir)
        except BaseException:
            failed()  # as the command line does: leave at once, so that the other process fails too
            raise
    elif layout == "sampled-metric":  # a metric each process draws from its own random stream (seed + rank)
        config = ddp_trainer_config(steps=8, eval_every=1, best_metric="sampled", best_mode="max",
                                    early_stopping_patience=2)
        trainer = Trainer(tiny_model(), config, ToySource(), out_dir=out_dir,
                          metrics_fn=lambda model: {"sampled": float(torch.rand(())),
                                                    "rank": float(torch.distributed.get_rank())})
    else:
        trainer = Trainer(tiny_model(), ddp_trainer_config(), ToySource(), eval_source=ToySource(),
                          eval_counts=token_accuracy_counts, out_dir=out_dir)
    assert trainer.world.size == 2, trainer.world
    trainer.fit()
    shutdown()


if __name__ == "__main__":
    _ddp_main(*sys.argv[1:])
