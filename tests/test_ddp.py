"""Two CPU processes under torchrun (gloo, loopback) train to the same weights as one process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from training_helpers import ToySource, ddp_trainer_config, packed_run, tiny_model, token_accuracy_counts

from attnlab.training import Trainer, load_model

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(target: list[str], out: Path, *, env: dict | None = None, timeout: float = 240) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `torchrun --nproc-per-node 2 TARGET...` on the CPU (gloo over loopback), whose
    run writes into `out` (named on the command line: a hung run's workers are found and killed by it)."""
    env = dict(os.environ if env is None else env, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *target]
    logs = out.parent / f"{out.name}.stdout.txt", out.parent / f"{out.name}.stderr.txt"
    with open(logs[0], "w", encoding="utf-8") as stdout, open(logs[1], "w", encoding="utf-8") as stderr:
        proc = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # kill torchrun, then its workers (each in a session of its own)
            os.killpg(proc.pid, signal.SIGKILL)
            subprocess.run(["pkill", "-9", "-f", str(out)], check=False)
            proc.wait()
            pytest.fail(f"the two processes hung (killed after {timeout} s)")
    return (proc.returncode, *(log.read_text(encoding="utf-8") for log in logs))


def run_two_processes(out: Path, *args: str, crashes: bool = False, timeout: float = 240) -> str:
    """Run training_helpers.py's `_ddp_main(out, *args)` in two processes; returns their stderr."""
    code, stdout, stderr = torchrun([str(Path(__file__).with_name("training_helpers.py")), str(out), *args], out,
                                    timeout=timeout)
    assert (code != 0) is crashes, (f"torchrun exited with {code}\n--- stderr ---\n{stderr[-6000:]}\n"
                                    f"--- stdout ---\n{stdout[-2000:]}")
    return stderr


def test_two_processes_match_one(tmp_path):
    run_two_processes(tmp_path / "ddp")

    single = Trainer(tiny_model(), ddp_trainer_config(), ToySource(), eval_source=ToySource(),
                     eval_counts=token_accuracy_counts, out_dir=tmp_path / "single")
    single.fit()

    distributed = load_model(tmp_path / "ddp")
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(distributed.state_dict()[name], value, rtol=0, atol=1e-6, msg=name)

    def records(run):
        return [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    ddp_log, single_log = records("ddp"), records("single")
    # eval_counts metrics are summed over the processes, also one that only the second process sees
    assert single_log[-1]["eval_one_ignored"] == pytest.approx(2 / 4)
    assert ddp_log[-1]["eval_one_ignored"] == pytest.approx(2 / 4) and "eval_token_accuracy" in ddp_log[-1]
    assert [r["step"] for r in ddp_log] == [r["step"] for r in single_log]
    for a, b in zip(ddp_log, single_log):
        for key in ("loss", "eval_loss", "eval_token_accuracy", "eval_one_ignored"):
            if key in b:
                assert a[key] == pytest.approx(b[key], abs=1e-5)
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir()) == [
        "best", "checkpoint", "loss.png", "metrics.jsonl"]
    assert len(json.loads((tmp_path / "ddp" / "checkpoint" / "trainer_state.json").read_text())["rng"]) == 2


def test_a_metric_each_process_draws_apart_picks_best_and_stops_alike_everywhere(tmp_path):
    # (fourth DDP audit) the processes disagreed on which evaluation was better: one saved best/ (a collective
    # gather of random states) while the other went on to the next step's all-reduce, and the run hung
    run_two_processes(tmp_path / "ddp", "sampled-metric", timeout=120)
    records = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if "eval_sampled" in r or "sampled" in r]
    assert evaluations, records
    # rank 0's values stand for the run (round-8 mutation: the last process's were logged, and nothing failed)
    assert {r.get("eval_rank", r.get("rank")) for r in evaluations} == {0.0}, evaluations


@pytest.mark.parametrize("layout", ["other-shape", "other-count"])
def test_processes_that_built_other_models_say_so_in_one_line(tmp_path, layout):
    # (fourth DDP audit) a process whose data gave another vocabulary or number of classes ended in DDP's
    # RuntimeError about params[33]'s sizes
    err = run_two_processes(tmp_path / "ddp", layout, crashes=True, timeout=120)
    assert "attnlab.errors.DataError: the processes of this distributed run built models of different shapes" \
        in err, err[-3000:]


def test_two_processes_on_packed_rows_match_one_process_on_one_example_per_row(tmp_path):
    # Packed rows are shared among the processes and their micro-batches; the gradient stays the global batch's.
    run_two_processes(tmp_path / "ddp", "packed")
    model, source = packed_run(pack=False)
    Trainer(model, ddp_trainer_config(), source, out_dir=tmp_path / "single").fit()
    distributed = load_model(tmp_path / "ddp")
    for name, value in model.state_dict().items():
        if name.endswith("k_proj.bias"):  # its true gradient is 0 (a softmax ignores q·b_k); AdamW scales up the noise
            continue
        torch.testing.assert_close(distributed.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_two_processes_train_bert_with_next_sentence_prediction_as_one_does(tmp_path):
    """BERT's loss is two means, each weighted by its own count (`loss_terms`): that branch of the trainer must
    scale by the number of processes as the plain loss does (a slip there left every other test green)."""
    from training_helpers import bert_nsp_run

    run_two_processes(tmp_path / "ddp", "bert-nsp")
    model, config, source = bert_nsp_run()
    Trainer(model, config, source, out_dir=tmp_path / "single").fit()
    distributed = load_model(tmp_path / "ddp")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(distributed.state_dict()[name], value, rtol=0, atol=1e-6, msg=name)
    # each process keeps its own random streams (its own dropout masks): saved apart, and not equal
    rng = json.loads((tmp_path / "ddp" / "checkpoint" / "trainer_state.json").read_text())["rng"]
    assert len(rng) == 2 and rng[0] != rng[1]


def test_a_resumed_two_process_run_with_dropout_ends_as_the_uninterrupted_one(tmp_path):
    """Each process restores its own random streams (its dropout masks go on as they would have), not rank 0's."""
    run_two_processes(tmp_path / "full", "dropout-full")
    run_two_processes(tmp_path / "cut", "dropout-first")
    run_two_processes(tmp_path / "cut", "dropout-resume")
    full, resumed = load_model(tmp_path / "full").state_dict(), load_model(tmp_path / "cut").state_dict()
    for name, value in full.items():
        assert torch.equal(resumed[name], value), name


def test_a_resumed_two_process_run_logs_the_steps_before_its_checkpoint(tmp_path):
    """The checkpoint at step 3 falls inside the log window of steps 1-4, and the processes die at step 4: the
    checkpoint keeps the loss of every process, so the resumed run's record at step 4 is the uninterrupted run's,
    with two processes or one (the window was restored only for one process, and step 4's record then averaged
    step 4 alone)."""
    from training_helpers import log_window_config

    def losses(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}

    run_two_processes(tmp_path / "full", "log-full")
    run_two_processes(tmp_path / "cut", "log-crash", crashes=True)  # both die at step 4, after step 3's save
    assert not (tmp_path / "cut" / "metrics.jsonl").read_text(encoding="utf-8").strip()
    run_two_processes(tmp_path / "cut", "log-resume")
    full = losses("full")
    assert sorted(full) == [4, 6]
    assert losses("cut") == pytest.approx(full, rel=1e-6)
    run_two_processes(tmp_path / "one", "log-crash", crashes=True)  # the same checkpoint, resumed by one process
    Trainer(tiny_model(), log_window_config(steps=6), ToySource(), out_dir=tmp_path / "one", resume=True).fit()
    assert losses("one")[4] == pytest.approx(full[4], rel=1e-6)


def test_a_two_process_run_with_dropout_interrupted_by_ctrl_c_resumes_exactly(tmp_path):
    """Ctrl-C reaches every process anywhere in its step, so they save without gathering: the checkpoint holds
    rank 0's random state alone. Each step seeds dropout from (seed, rank, step), so rank 1 needs none (it was
    reseeded at resume, and its masks differed from the uninterrupted run's)."""
    run_two_processes(tmp_path / "full", "dropout-full")
    run_two_processes(tmp_path / "cut", "dropout-interrupted")
    state = json.loads((tmp_path / "cut" / "checkpoint" / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["step"] == 3 and len(state["rng"]) == 1
    run_two_processes(tmp_path / "cut", "dropout-resume")
    full, resumed = load_model(tmp_path / "full").state_dict(), load_model(tmp_path / "cut").state_dict()
    for name, value in full.items():
        assert torch.equal(resumed[name], value), name


# ---- messages under torchrun: every process runs the same command ----------------------------------------------


@pytest.mark.parametrize("rank,shown", [("0", True), ("1", False)])
def test_a_refused_setting_is_reported_by_rank_zero_alone(capsys, monkeypatch, rank, shown):
    """Under torchrun each process refuses the same bad setting: the line came once per process."""
    from cli_helpers import run_cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    code, _, err = run_cli(capsys, "train", "--set", "train.stpes=3")
    assert code == 2
    assert ("attnlab: error: unknown setting train.stpes" in err) is shown
    assert (err.strip() == "") is not shown
    code, _, err = run_cli(capsys, "train", "--no-such-option")  # the command line too
    assert code == 2 and (err.strip() != "") is shown


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_folder_another_rank_cannot_make_is_reported_with_its_rank(capsys, monkeypatch, tmp_path, rank):
    # (fourth DDP audit) a folder one process cannot make (its node's disk) was refused as a setting every process
    # refuses alike: a process other than rank 0 said nothing, and rank 0 only that it was terminated
    from attnlab.cli import _main
    from attnlab.files import make_folder

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    (tmp_path / "afile").write_text("x")

    def fail(*args, **kwargs):
        make_folder(tmp_path / "afile" / "run", "train.out_dir")

    monkeypatch.setattr("attnlab.cli.app", fail)
    with pytest.raises(SystemExit) as exit_:
        _main([], [])
    err = capsys.readouterr().err
    prefix = "attnlab: error: " if rank == "0" else "attnlab (rank 1): error: "
    assert exit_.value.code == 2 and err.startswith(prefix + "train.out_dir: cannot create the folder"), err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("command", [["evaluate", "RUN", "--data", "x.txt"], ["generate", "RUN", "-p", "x"],
                                     ["params", "gpt-char-tiny"]])
@pytest.mark.parametrize("rank", ["0", "1"])
def test_commands_that_do_not_train_refuse_torchrun_once(capsys, monkeypatch, command, rank):
    # (fourth DDP audit) `torchrun ... -m attnlab evaluate` scored the whole file in every process and printed the
    # results once per process
    from cli_helpers import run_cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    code, out, err = run_cli(capsys, *command)
    assert code == 2 and out == ""
    expected = f"attnlab: error: attnlab {command[0]} runs in one process; run it without torchrun"
    assert err.strip() == (expected if rank == "0" else ""), err


def test_a_folder_another_run_holds_stops_every_process_at_once(tmp_path):
    # (fourth DDP audit) rank 0 refused the folder before joining the process group: rank 1 waited in torchrun's
    # rendezvous for it until torchrun killed it ("forcefully exiting via 9"), half a minute later
    from attnlab.files import folder_lock

    out = tmp_path / "run"
    with folder_lock(out, "train.out_dir"):
        code, _, err = torchrun(["-m", "attnlab", "train", "--set", "model.preset=gpt-char-tiny",
                                 "--set", "train.steps=2", "--set", "train.progress=false",
                                 "--set", "train.precision=fp32", "--set", "train.device=cpu",
                                 "--set", "train.batch_size=4", "--set", f"train.out_dir={json.dumps(str(out))}"],
                                out, timeout=120)
    assert code != 0
    assert f"attnlab: error: train.out_dir: another attnlab run is writing into '{out}'" in err, err[-3000:]
    assert "attnlab (rank 1): error: another process of this distributed run stopped" in err, err[-3000:]
    assert "forcefully exiting" not in err and "SIGKILL" not in err, err[-3000:]


def test_a_data_error_in_another_rank_names_its_rank(capsys, monkeypatch, tmp_path):
    """A file or data error may be one process's own (a file missing on one node): every process reports it,
    the others than rank 0 under their rank; their warnings, repeats of rank 0's, are not shown."""
    import warnings

    from attnlab.cli import _main
    from attnlab.data.text_files import read_text

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    missing = tmp_path / "missing.txt"

    def read(*args, **kwargs):  # a command of this process reading a file its node lacks
        read_text(missing)

    with monkeypatch.context() as m:
        m.setattr("attnlab.cli.app", read)
        with pytest.raises(SystemExit) as exit_:
            _main([], [])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith("attnlab (rank 1): error: ") and len(err.strip().splitlines()) == 1, err
    with warnings.catch_warnings():

        def warn(*args, **kwargs):
            warnings.warn("the same for every process", stacklevel=1)
            raise SystemExit(0)

        monkeypatch.setattr("attnlab.cli.app", warn)
        with pytest.raises(SystemExit):
            _main([], [])
    assert capsys.readouterr().err == ""


def test_an_error_in_one_process_ends_the_run_at_once_with_one_line_from_each(tmp_path):
    """The failing process left the process group at exit only after a barrier its peer, blocked in the gradients'
    all-reduce, never reached: the run hung until gloo's 30-minute timeout. Now it leaves at once, the peer's
    collective fails, and each process says one line."""

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('RANK') == '1':\n"
        "    import attnlab.training.trainer as T\n"
        "    step = T.Trainer._train_step\n"
        "    def failing(self, n):\n"
        "        if n == 3:\n"
        "            raise RuntimeError('out of memory (a test on rank 1)')\n"
        "        return step(self, n)\n"
        "    T.Trainer._train_step = failing\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "run"
    code, _, err = torchrun(["-m", "attnlab", "train", "--set", "model.preset=gpt-char-tiny",
                             "--set", "model.block_size=16", "--set", "train.steps=40", "--set", "train.batch_size=4",
                             "--set", "train.progress=false", "--set", "train.precision=fp32",
                             "--set", "train.device=cpu", "--set", "train.eval_every=0",
                             "--set", f"train.out_dir={json.dumps(str(out))}"], out, env=env, timeout=180)
    assert code != 0
    assert "attnlab (rank 1): error: out of memory" in err, err[-3000:]
    assert "attnlab: error: another process of this distributed run stopped" in err, err[-3000:]
    assert "[rank0]" not in err and "[rank1]" not in err, err[-3000:]  # no worker's traceback
