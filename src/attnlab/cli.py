"""The `attnlab` command line. Thin: it parses, calls the library, and turns known errors into one
line on stderr with exit code 2 (130 for a run interrupted by Ctrl-C, 143 for one terminated by SIGTERM)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time
import warnings

import typer

from attnlab.errors import AttnlabError, ConfigError, Terminated
from attnlab.files import expand_home


def _flags_show_no_type() -> None:
    """typer 0.29's help shows a flag's type, `--resume <bool>`, which reads as if the flag took a value
    (`--resume true` then names 'true' as the config file). A flag is shown alone, as click shows it."""
    option = getattr(getattr(typer, "core", None), "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if shown is None or getattr(shown, "_attnlab_flags", False):
        return

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    display_type_rich._attnlab_flags = True
    option.display_type_rich = display_type_rich


_flags_show_no_type()


def _help_folds_long_words() -> None:
    """rich cuts a word longer than the help column with an ellipsis ("model.position=rotar…", a default such as
    "synthesizer-den…" at 60 columns): the help of an option folds it onto the next line instead. typer imports
    its rich help module (0.7 s) only to print help, so the help is patched then."""
    core = getattr(typer, "core", None)
    for kind in (getattr(core, "TyperCommand", None), getattr(core, "TyperGroup", None)):
        shown = getattr(kind, "format_help", None)
        if shown is None or getattr(shown, "_attnlab_folds", False):
            continue

        def format_help(self, ctx, formatter, _shown=shown):
            _fold_parameter_help()
            return _shown(self, ctx, formatter)

        format_help._attnlab_folds = True
        kind.format_help = format_help


def _fold_parameter_help() -> None:
    try:
        from typer import rich_utils
    except ImportError:  # without rich, click's plain help wraps words itself
        return
    built = getattr(rich_utils, "_get_parameter_help", None)
    if built is None or getattr(built, "_attnlab_folds", False):
        return

    def parameter_help(*args, **kwargs):
        columns = built(*args, **kwargs)
        for item in getattr(columns, "renderables", ()):
            if hasattr(item, "overflow"):  # rich Text (Markdown help folds already)
                item.overflow = "fold"
        return columns

    parameter_help._attnlab_folds = True
    rich_utils._get_parameter_help = parameter_help


_help_folds_long_words()

app = typer.Typer(
    name="attnlab",
    help="Attention and Transformer models: build, train, compare and look inside them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(given: bool) -> None:
    if given:
        from attnlab import __version__

        print(f"attnlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print attnlab's version and exit.")) -> None:
    """Attention and Transformer models: build, train, compare and look inside them."""


def _notes(error: BaseException) -> str:
    """An error's notes (Python 3.11's add_note: what was kept, as a failed evaluation's saved steps) for the end
    of its one line."""
    return "".join(f"; {note}" for note in getattr(error, "__notes__", ()))


def _one_process(command: str) -> None:
    """Refuse a command that does not train under torchrun: every process would do the whole of it and print it."""
    from attnlab.training.distributed import env_world

    if env_world().size > 1:
        raise ConfigError(f"attnlab {command} runs in one process; run it without torchrun")


@app.command()
def params(
    name: str | None = typer.Argument(None, help="A preset name (see `--list`), or a run folder (`./NAME` for "
                                       "one named like a preset).", callback=expand_home),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table."),
    list_all: bool = typer.Option(False, "--list", help="List every preset with its parameter count."),
) -> None:
    """Exact parameter accounting of a model, per component, with the closed-form formula of each row."""
    _one_process("params")
    from attnlab.analysis.params import params_command

    params_command(name, as_json=as_json, list_all=list_all)


@app.command()
def convert(
    hf_folder: str = typer.Argument(..., help="A Hugging Face BERT or GPT-2 folder as save_pretrained writes it: "
                                    "config.json, model.safetensors (or its shards), tokenizer.json (a BERT: or "
                                    "vocab.txt).",
                                    callback=expand_home),
    run_folder: str = typer.Argument(..., help="The attnlab run folder to write (new or empty).", callback=expand_home),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the attnlab run already in RUN_FOLDER."),
) -> None:
    """Turn a Hugging Face BERT or GPT-2 model into an attnlab run folder, for generate, evaluate, params and
    model.init_from (safetensors only: nothing is unpickled); a BERT without a head (a sentence encoder) is for
    params and model.init_from."""
    _one_process("convert")
    from attnlab.convert.to_run import save_hf_as_run

    folder = save_hf_as_run(hf_folder, run_folder, overwrite=overwrite)
    print(f"run folder: {run_folder} (checkpoint: {folder})")


@app.command()
def train(
    config: str | None = typer.Argument(None, help="A TOML or YAML run config (see configs/); omitted: a small char "
                                        "GPT on the embedded pydoc corpus.", callback=expand_home),
    overrides: list[str] | None = typer.Option(None, "--set", help="Override one setting: section.key=value "
                                        "(e.g. --set train.steps=200 --set model.position=rotary).",
                                        metavar="SECTION.KEY=VALUE"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run folder's last checkpoint."),
) -> None:
    """Train a model from a config file; writes checkpoints, metrics.jsonl and loss.png to train.out_dir."""
    from attnlab.training.recipe import load_run_config, train_run

    run = load_run_config(config, overrides, resume=resume)
    summary = train_run(run, resume=resume)
    if _other_rank() is not None:  # under torchrun, one summary (from rank 0) is enough
        return
    if "steps" in summary and summary.get("start_step") == summary["steps"] and not summary.get("redid_eval"):
        if summary.get("stopped_early"):
            print(f"nothing to train: the run stopped early at step {summary['steps']} (no better evaluation in "
                  "train.early_stopping_patience evaluations); give a larger patience, or 0, to train on")
        else:
            print(f"nothing to train: the checkpoint is already at train.steps = {summary['steps']}; give a "
                  "larger train.steps to train on")
        print(f"run folder: {run.train.out_dir}")
        return
    shown = {k: v for k, v in summary.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()))
    best = summary.get("best")
    if summary.get("stopped_early"):  # the summary's bool, left out above: the figures read as a whole run's
        print(f"stopped early at step {summary['steps']} of {run.train.steps}: no better evaluation in "
              f"train.early_stopping_patience = {run.train.early_stopping_patience} evaluations")
    if isinstance(best, dict) and {"metric", "step", "value"} <= set(best) and best["step"] != summary["steps"]:
        # best/ holds an earlier step than the figures above
        print(f"best/: step {best['step']}, {best['metric']} {best['value']:.4g}")
    print(f"run folder: {run.train.out_dir}")


@app.command()
def generate(
    run_dir: str = typer.Argument(..., help="A run folder written by `attnlab train` (or a checkpoint folder).",
                                  callback=expand_home),
    prompt: list[str] | None = typer.Option(None, "--prompt", "-p", metavar="TEXT", help="The text to continue (or to "
                                            "translate); repeat for several, decoded as one batch and printed in "
                                            "order."),
    input_file: str | None = typer.Option(None, "--input", "-i", help="Translation models: a file of source "
                                          "sentences, one per line, translated in batches; the translations are "
                                          "printed one per line, in order (an empty line for a blank one). A "
                                          "pipe does too, and - reads standard input.",
                                          callback=expand_home),
    max_new_tokens: int = typer.Option(200, "--max-new-tokens", "-n", help="How many tokens to add (for a "
                                       "translation: the longest output, in tokens)."),
    temperature: float | None = typer.Option(None, help="Sampling temperature (default 0.8)."),
    top_k: int | None = typer.Option(None, "--top-k", help="Sample among the k most likely tokens."),
    top_p: float | None = typer.Option(None, "--top-p", help="Sample from the smallest set with mass p."),
    greedy: bool = typer.Option(False, "--greedy", help="Always take the most likely token."),
    beam_size: int = typer.Option(1, "--beam-size", help="Beam search width (translation models; 1: greedy); "
                                  "beams rank finished translations with GNMT's length penalty, alpha 0.6."),
    seed: int | None = typer.Option(None, help="Seed of the sampler (same seed, same text; default 0)."),
    best: bool = typer.Option(False, "--best", help="Use the run's best/ checkpoint instead of the latest."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N (a GPU by number) or mps."),
    dtype: str = typer.Option("fp32", help="Weights: fp32 (as trained), bf16 or fp16 (half the memory read "
                              "per token: faster decoding of wide models on GPUs, on CPUs with bf16 instructions "
                              "and on the AVX2 CPUs measured, about 1.2-1.4x at 384 wide; on a CPU prefer bf16; "
                              "on an AVX-512 CPU without bf16 instructions about as fast as fp32 for one prompt and "
                              "slower for several; results differ by rounding)."),
) -> None:
    """Generate text from a trained language model (with a KV cache), or translate with a seq2seq model."""
    _one_process("generate")
    from attnlab.errors import ConfigError, a_name
    from attnlab.inference.runs import (
        check_decoding_options,
        check_generates,
        generate_texts,
        load_run,
        translate_file,
    )
    from attnlab.training.device import select_device

    if prompt is not None and input_file is not None:
        raise ConfigError("give --prompt (-p) or --input (-i), not both")
    run = load_run(run_dir, select_device(device), which="best" if best else "checkpoint", dtype=dtype)
    if prompt is None and input_file is None:
        check_generates(run)  # a classifier takes no prompt: say so, not ask for one
        raise ConfigError("give the text to continue or translate with --prompt (-p), or a file of sentences to "
                          "translate with --input (-i)")
    check_decoding_options(run.family, greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                           beam_size=beam_size)
    if input_file is not None:
        if run.family != "seq2seq":
            check_generates(run)  # a classifier takes no --prompt either: say what takes it
            raise ConfigError(f"--input translates a file with a translation model; this run is {a_name(run.family)} "
                              "model: give its prompts with --prompt (-p)")
        print("\n".join(translate_file(run, input_file, beam_size=beam_size, max_len=max_new_tokens)))
        return
    if run.family != "seq2seq" and temperature is None and not greedy:
        temperature = 0.8  # the command's default; the library's is 1.0
    texts = generate_texts(run, prompt, max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature,
                           top_k=top_k, top_p=top_p, seed=seed, beam_size=beam_size)
    shown = texts if run.family == "seq2seq" else [p + text for p, text in zip(prompt, texts)]
    print("\n\n".join(shown))  # several prompts: one blank line between their texts


@app.command()
def evaluate(
    run_dir: str = typer.Argument(..., help="A run folder written by `attnlab train` (or a checkpoint folder).",
                                  callback=expand_home),
    data: str = typer.Option(..., "--data", "-d", help="LM: a text file; classifier: a TSV/CSV/JSONL file "
                             "with the training columns; translation: source sentences; BERT pre-training: "
                             "documents separated by blank lines, a sentence per line (masks and sentence pairs "
                             "drawn with the run's train.seed).", callback=expand_home),
    target: str | None = typer.Option(None, "--target", help="Translation: the reference sentences.",
                                      callback=expand_home),
    batch_size: int = typer.Option(32, "--batch-size", help="Examples (or text windows) scored at once; lower it "
                                   "when memory runs short."),
    beam_size: int = typer.Option(1, "--beam-size", help="Translation: beam search width for BLEU (1: greedy; wider "
                                  "beams rank by GNMT's length penalty, alpha 0.6); each translation is at most the "
                                  "run's data.max_length tokens."),
    best: bool = typer.Option(False, "--best", help="Use the run's best/ checkpoint instead of the latest."),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N (a GPU by number) or mps."),
    text_column: str | None = typer.Option(None, "--text-column", help="Classifier: the text column of --data "
                                           "(a header name or a 0-based number), if not the training file's."),
    label_column: str | None = typer.Option(None, "--label-column", help="Classifier: the label column of --data, "
                                            "if not the training file's."),
    precision: str = typer.Option("fp32", "--precision", help="fp32 (exact, the default), bf16 or auto (bf16 "
                                  "where the hardware computes it): bf16 autocast is faster, as training evaluates "
                                  "a bf16 run, with losses that differ from the fourth digit on."),
) -> None:
    """Score a file: loss and perplexity (language models, translation + BLEU), accuracy (classifiers), or masked-LM
    perplexity and accuracy with next-sentence accuracy (BERT pre-training)."""
    _one_process("evaluate")
    from attnlab.inference.runs import evaluate_file, load_run
    from attnlab.training.device import select_device
    from attnlab.training.logging import json_line

    run = load_run(run_dir, select_device(device), which="best" if best else "checkpoint")
    metrics = evaluate_file(run, data, target=target, batch_size=batch_size, beam_size=beam_size,
                            text_column=text_column, label_column=label_column, precision=precision)
    counts = ("tokens", "examples", "masked_tokens", "sentence_pairs")
    metrics = {key: int(value) if key in counts else value for key, value in metrics.items()}
    if as_json:  # standard JSON: a perplexity past float64's range is null, as in metrics.jsonl
        print(json_line(metrics), end="")
        return
    width = max(11, *map(len, metrics))
    for key, value in metrics.items():
        print(f"{key:>{width}}  {value if key in counts else round(value, 4)}")


run_app = typer.Typer(help="Run a reproducible experiment end to end (results table, plots, checkpoints).",
                      no_args_is_help=False)
app.add_typer(run_app, name="run")

# The knowledge experiment's scale settings (`KnowledgeScale`'s fields, pinned by a test), named in --help without
# importing the experiment (and torch) to draw the help.
KNOWLEDGE_SETTINGS = ("n_people", "eval_fraction", "n_layers", "n_heads", "d_model", "block_size", "dropout",
                      "pretrain_epochs", "pretrain_batch", "pretrain_lr", "finetune_batch", "finetune_lr",
                      "finetune_epochs_scratch", "finetune_epochs_pretrained", "warmup_tokens", "decay_epochs",
                      "weight_decay", "precision")
_KNOWLEDGE_SET_HELP = ("Change one setting of the scale, e.g. --set n_people=600. Settings: "
                       f"{', '.join(KNOWLEDGE_SETTINGS)}.")

EXPERIMENTS = {
    "knowledge": "Pretraining gives a char GPT knowledge that fine-tuning makes it access (CS224n 2021 a5).",
}


@run_app.callback(invoke_without_command=True)
def _run(ctx: typer.Context,
         list_all: bool = typer.Option(False, "--list", help="List the experiments.")) -> None:
    """Run a reproducible experiment end to end: `attnlab run knowledge`."""
    if list_all and ctx.invoked_subcommand is not None:  # it ran the experiment over an earlier run's results
        raise _click_exceptions().UsageError(f"give --list or an experiment, not both: `attnlab run --list` lists "
                                             f"them, `attnlab run {ctx.invoked_subcommand}` runs one", ctx=ctx)
    if ctx.invoked_subcommand is None:
        if not list_all:
            raise _click_exceptions().UsageError(f"missing the experiment: attnlab run EXPERIMENT, with EXPERIMENT "
                                                 f"one of: {', '.join(EXPERIMENTS)}", ctx=ctx)
        for name, about in EXPERIMENTS.items():
            print(f"{name:<12} {about}")


def _parse_sets(items: list[str] | None) -> dict:
    """`--set key=value` items (values read as TOML, else strings) for an experiment's settings."""
    from attnlab.errors import ConfigError
    from attnlab.training.recipe import parse_value

    out = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set pretrain_epochs=50")
        key, raw = item.split("=", 1)
        if not key.strip():
            raise ConfigError(f"--set {item!r}: the setting's name is missing before '=', e.g. --set "
                              "pretrain_epochs=50")
        out[key.strip()] = parse_value(raw)
    return out


@run_app.command("knowledge")
def knowledge(
    scale: str = typer.Option("quick", help="quick (minutes), standard (under an hour in bf16, longer in "
                              "fp32) or full (the assignment's settings)."),
    variants: str = typer.Option("none,dot,synthesizer-dense", help="Comma-separated rows: none (no "
                                 "pretraining), attention variants, position schemes, or attention+position."),
    corpus: str | None = typer.Option(None, help="Pretraining corpus, one biography per line (e.g. wiki.txt).",
                                      callback=expand_home),
    train: str | None = typer.Option(None, help="Fine-tuning pairs: question<TAB>answer lines.", callback=expand_home),
    eval_path: str | None = typer.Option(None, "--eval", help="Evaluation pairs: question<TAB>answer lines.",
                                         callback=expand_home),
    predict: str | None = typer.Option(None, help="Questions to answer (answers optional): writes "
                                       "predictions/<variant>.predict.tsv.", callback=expand_home),
    out: str = typer.Option("runs/knowledge", "--out", "-o", help="Output folder.", callback=expand_home),
    seed: int = typer.Option(0, help="Seed of the synthetic world, the split and training."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N (a GPU by number) or mps."),
    overrides: list[str] | None = typer.Option(None, "--set", metavar="KEY=VALUE",
                                               help=_KNOWLEDGE_SET_HELP),
    resume: bool = typer.Option(False, "--resume", help="Skip finished phases and resume an interrupted one."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
) -> None:
    """Span-corruption pretraining then fine-tuning on "Where was X born?" vs fine-tuning from scratch."""
    from attnlab.experiments.knowledge import run_knowledge
    from attnlab.training.trainer import TrainingInterrupted

    try:
        run_knowledge(out, scale=scale, variants=variants, corpus=corpus, train=train, eval_path=eval_path,
                      predict=predict, seed=seed, device=device, overrides=_parse_sets(overrides), resume=resume,
                      progress=not quiet)
    except KeyboardInterrupt:  # between phases (answering, writing the tables): a phase's own interrupt says more
        from pathlib import Path

        from attnlab.training.checkpoint import checkpoint_present

        try:
            kept = any(checkpoint_present(phase / "checkpoint") for phase in Path(out).iterdir()
                       if phase.name.startswith(("pretrain-", "finetune-")))
        except OSError:  # no folder: a folder made for the run is removed again when it holds nothing
            kept = False
        if not kept:  # while the data was read or the model built
            raise TrainingInterrupted("interrupted before any phase was trained; nothing was kept") from None
        raise TrainingInterrupted(f"interrupted; what was trained is kept in {out}: to go on, run the same command "
                                  "with --resume") from None


def _click_exceptions():
    """typer >= 0.24 bundles its own copy of click; older versions use click itself."""
    try:
        from typer._click import exceptions
    except ImportError:  # pragma: no cover - older typer
        from click import exceptions
    return exceptions


def _usage_line(e) -> str:
    """A click usage error as one line: the problem, then where the help is."""
    ctx = getattr(e, "ctx", None)
    where = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
    return f"{e.format_message().rstrip('.')}{where}"


def _out_of_memory(e: BaseException) -> bool:
    """Whether `e` says memory ran out: Python's or numpy's MemoryError, or torch's allocators (CPU, CUDA: also
    torch.cuda.OutOfMemoryError, MPS), which raise RuntimeErrors."""
    text = str(e).lower()
    return isinstance(e, MemoryError) or any(s in text for s in _NO_MEMORY)


# What torch and numpy say when memory runs out, or when a size is too large to ask for (a setting of 2**62).
_NO_MEMORY = ("can't allocate memory", "out of memory", "storage size calculation overflowed", "array is too big",
              "cannot be represented as a symint")


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """While the command runs, SIGTERM raises `Terminated` (once: a second SIGTERM, as Slurm sends to every
    process of a job and torchrun forwards to its workers, must not cut the checkpoint's save short).
    Yields a list that holds the signal once received."""
    received: list[int] = []

    def handler(signum, frame):
        if not received:
            received.append(signum)
            raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave the signal alone
        yield received
        return
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def _reader_went_away(e: SystemExit) -> bool:
    """Whether exit code 1 is typer's or rich's answer to a broken pipe: click wraps stdout to stay quiet, and rich
    (printing the help, `attnlab --help | head`) exits from its own `on_broken_pipe`."""
    if type(sys.stdout).__name__ == "PacifyFlushWrapper":
        return True
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name == "on_broken_pipe"


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; known errors become one line on stderr and exit code 2 (130 for Ctrl-C,
    143 for SIGTERM)."""
    with _sigterm_as_interrupt() as terminated:
        try:
            _main(argv, terminated)
        except BaseException as e:
            # Under torchrun: leave at exit without waiting for the other processes. Only a command that imported
            # the module can have joined a process group (importing it here would import torch on every refused
            # command line).
            distributed = sys.modules.get("attnlab.training.distributed")
            if distributed is not None and not (isinstance(e, SystemExit) and e.code in (0, None)):
                distributed.failed()
            raise
        finally:
            _forget_escaped_interrupt()


def _refuse_repeated_options(argv: list[str]) -> None:
    """Refuse an option that takes one value given twice: click keeps the last silently (`evaluate -d a.txt -d
    b.txt` scored b.txt alone, `-n 20 -n 0` asked for 0 tokens). Options that gather values (--set, --prompt) and
    switches may repeat."""
    if not isinstance(app, typer.Typer):  # a stand-in (tests replace the app)
        return
    command = typer.main.get_command(app)  # typer's own copy of click: its classes are not click's
    args = list(argv)
    while hasattr(command, "commands"):  # down to the command the line names (`run knowledge`: its options
        # are read by the experiment, which takes --set as a list)
        name = next((a for a in args if not a.startswith("-")), None)
        if name is None or name not in command.commands:
            return  # help, or a command click refuses in its own words
        args, command = args[args.index(name) + 1:], command.commands[name]
    options = {opt: p for p in command.params if p.param_type_name == "option" for opt in p.opts}
    given: set[object] = set()
    skip = False
    for token in args:
        if skip:  # the value of the option before it, which may start with "-"
            skip = False
            continue
        if token == "--":
            break
        name = token.split("=", 1)[0] if token.startswith("--") else token[:2]
        param = options.get(name)
        if param is None or param.is_flag:
            continue
        inline = "=" in token if token.startswith("--") else len(token) > 2
        skip = not inline
        if param.multiple:
            continue
        if param in given:
            raise ConfigError(f"{' ('.join(param.opts[:2])}{')' if len(param.opts) > 1 else ''} is given twice; "
                              "give it once")
        given.add(param)


def _forget_escaped_interrupt() -> None:
    """Let the exit code we chose stand after a Ctrl-C we handled.

    CPython marks a KeyboardInterrupt that escaped an ``exec`` of a string (dataclasses build their methods
    that way, hundreds of times while torch imports) as unhandled, even once our code has caught it, and at
    exit kills the process with SIGINT: status -2 instead of 130 after "attnlab: interrupted". Every exec of
    a string clears the mark before it runs, so an empty one clears it (CPython 3.10-3.13)."""
    exec("")  # noqa: S102 - a constant empty string


def _other_rank() -> str | None:
    """Under torchrun, this process's rank when it is not rank 0 (None in rank 0 and in a single process)."""
    rank, size = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    return rank if size not in ("", "1") and rank not in ("", "0") else None


def _report(message: str, *, same_in_every_process: bool = False) -> None:
    """Print one line on stderr. Under torchrun every process runs the same command: a message each of them gives
    alike (a refused command line or setting, Ctrl-C) comes from rank 0 alone, and any other names its rank."""
    rank = _other_rank()
    if rank is not None:
        if same_in_every_process:
            return
        message = message.replace("attnlab:", f"attnlab (rank {rank}):", 1)
    print(message, file=sys.stderr)


QUIET_RANK_WAIT_S = 5.0


def _quiet_rank_waits() -> None:
    """Under torchrun, a process other than rank 0 that kept quiet about an error every process meets (see
    `_report`) waits, before it exits, for rank 0 to say it: exiting at once, it had torchrun stop rank 0 (SIGTERM)
    before rank 0's line, which then said only "terminated", giving no reason at all. torchrun's SIGTERM, sent once
    rank 0 has exited, ends the wait."""
    if _other_rank() is None:
        return
    try:
        time.sleep(QUIET_RANK_WAIT_S)
    except KeyboardInterrupt:  # Terminated (torchrun's SIGTERM) or Ctrl-C: rank 0 is done or stopping
        pass


def _report_terminated(what: str) -> None:
    """Say that SIGTERM stopped the command. Under torchrun a process may be sent it alone (`kill PID`): each says
    so itself, the others without rank 0's account of the run (`what`, which they did not save); torchrun also
    sends it to every process when one of them fails, which rank 0 names as a possible cause."""
    if _other_rank() is not None:
        _report("attnlab: terminated (SIGTERM)")
    elif os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
        _report(f"attnlab: terminated (SIGTERM, which torchrun also sends when another process of the run fails; "
                f"its summary names the process){what}")
    else:
        _report(f"attnlab: terminated (SIGTERM){what}")


def _main(argv: list[str] | None, terminated: list[int]) -> None:
    exceptions = _click_exceptions()
    # A terminal or pipe in another encoding than UTF-8 (PYTHONIOENCODING=ascii, an old Windows console) gets a
    # character it cannot show as a backslash escape: a model's text or the results table ended in a
    # UnicodeEncodeError after every phase had trained.
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError):  # a detached or closed stream
            pass
    # Warnings as one line each, without the source line Python shows by default; under torchrun from rank 0
    # only (every process reads the same settings and data, so the others would repeat its warnings).
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"attnlab: warning: {message}\n"
    if _other_rank() is not None:
        warnings.simplefilter("ignore")
    try:
        _refuse_repeated_options(sys.argv[1:] if argv is None else list(argv))
        result = app(args=argv, standalone_mode=False)
    except SystemExit as e:
        # A reader that stopped early (`attnlab generate ... | head`): typer answers the broken pipe with exit
        # code 1, the code of a bug, after wrapping stdout to stay quiet; a pipe's writer exits 141 (SIGPIPE).
        if e.code == 1 and _reader_went_away(e):
            sys.exit(141)
        raise
    except (typer.Abort, KeyboardInterrupt):
        result = 130
    except typer.Exit as e:
        sys.exit(getattr(e, "exit_code", 0))
    except exceptions.ClickException as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `attnlab` alone: the help, already printed by typer's rich
            help_text = e.format_message().strip()
            if help_text:
                _report(help_text, same_in_every_process=True)
        else:
            _report(f"attnlab: error: {_usage_line(e)}", same_in_every_process=True)
        _quiet_rank_waits()
        sys.exit(2)
    except AttnlabError as e:
        code = getattr(e, "exit_code", 2)
        if code == 130 and terminated:  # stopped (a checkpoint saved) by SIGTERM, not Ctrl-C
            _report_terminated(f": {e}")
            sys.exit(143)
        # A refused setting (or a diverged loss) is every process's alike; data and file errors, and a folder this
        # process cannot make or write (PathError), may be one process's own.
        same = e.same_in_every_process
        _report(f"attnlab: {'' if code == 130 else 'error: '}{e}{_notes(e)}", same_in_every_process=code == 130 or same)
        if same and code != 130:
            _quiet_rank_waits()
        sys.exit(code)
    except (MemoryError, RuntimeError, ValueError) as e:  # ValueError: numpy's "array is too big" alone
        if isinstance(e, ValueError) and not _out_of_memory(e):
            raise
        kept = _notes(e)
        from attnlab.training.distributed import peer_gone

        if peer_gone(e) and not _out_of_memory(e):
            # Most likely another process stopped; but a failure of this process's own communication (an NCCL
            # setup error) looks the same from here, so its first line is kept.
            here = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)[:200]
            _report("attnlab: error: another process of this distributed run stopped (its own message says why), "
                    f"or this one could not reach it; this one stops too (here: {here}){kept}")
            sys.exit(2)
        if not _out_of_memory(e):
            raise
        _report("attnlab: error: out of memory; use a smaller model (model.d_model, model.n_layers...) or smaller "
                "batches (train.batch_size or train.micro_batch_size; --batch-size when evaluating), or fewer new "
                f"tokens (-n when generating){kept}")
        sys.exit(2)
    except OSError as e:  # the system refused a file operation (a folder that cannot be made, a full disk...)
        where = f": {e.filename}" if e.filename else ""
        fix = "free some space, or write to another disk (train.out_dir, --out)" if e.errno == errno.ENOSPC else \
            "check the path and its permissions"
        _report(f"attnlab: error: {e.strerror or e}{where}; {fix}")
        sys.exit(2)
    if result == 130 and terminated:
        _report_terminated("")
        result = 143
    elif result == 130:  # typer turns Ctrl-C outside our own handlers into a return value of 130
        _report("attnlab: interrupted", same_in_every_process=True)
    if isinstance(result, int) and result:
        sys.exit(result)
