"""examples/launch_phf.sh (every Qwen3 launcher's, the Slurm example's): how many ranks it starts and the checks of
that count before the conversion (minutes at 8B). One rank per GPU the node shows (CUDA_VISIBLE_DEVICES, else
``nvidia-smi -L``, faked here); more ranks than GPUs, a TP x PP that does not divide NGPU x NNODES, a batch the
data-parallel ranks do not split, a multi-node launch without its node rank: one line, exit code 2, nothing made."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from phf_megatron.runtime.process_group import standalone_environ

from ..helpers import REPO

LAUNCHER = os.path.join(REPO, "examples", "train_phf_qwen3_8b.sh")   # TP 2, global batch 32, micro-batch 2


def _node(tmp_path, gpus: int, extra_env: dict[str, str], migs: int = 0) -> tuple[dict[str, str], str]:
    """The environment of a node whose ``nvidia-smi -L`` lists ``gpus`` GPUs, each with ``migs`` MIG devices under
    it, and the run dir."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    listing = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}c{i:06d})\\n" + "".join(
        f"  MIG 1g.10gb     Device  {j}: (UUID: MIG-{i:04d}{j:04d})\\n" for j in range(migs)) for i in range(gpus))
    (bin_dir / "nvidia-smi").write_text(f"#!/usr/bin/env bash\n[ \"$1\" = -L ] && printf '{listing}'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    hf = tmp_path / "Qwen3 8B"   # a path with a space
    hf.mkdir(exist_ok=True)
    (hf / "config.json").write_text("{}")
    (tmp_path / "train.jsonl").write_text("")   # DATA: a local file must be there
    run = str(tmp_path / "run")
    env = {k: v for k, v in standalone_environ().items()
           if k not in ("CUDA_VISIBLE_DEVICES", "NGPU", "NNODES", "NODE_RANK", "MCORE_WAIT", "MCORE_STALE",
                        "MCORE_HEARTBEAT", "MCORE_SILENT", "SLURM_STEP_NUM_TASKS")}
    env.update({"HF_MODEL": str(hf), "RUN_DIR": run, "DATA": "train.jsonl", **extra_env,
                "PATH": os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]])})
    return env, run


def _launch(tmp_path, gpus: int, extra_env: dict[str, str], migs: int = 0) -> tuple[subprocess.CompletedProcess, str]:
    """The 8B launcher on that node (``_node``); returns the process and the run dir."""
    env, run = _node(tmp_path, gpus, extra_env, migs)
    proc = subprocess.run(["bash", LAUNCHER], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    return proc, run


@pytest.mark.parametrize("gpus, extra_env, ranks", [
    (4, {}, "4"),                                      # was 8: ranks 4-7 died in torch.cuda.set_device
    (4, {"CUDA_VISIBLE_DEVICES": "2,3"}, "2"),         # what CUDA shows the ranks, not what the driver lists
    # CUDA reads the entries up to the first that is not a GPU: each was 4 ranks, two died in set_device
    (4, {"CUDA_VISIBLE_DEVICES": "0,1,,2"}, "2"),      # an empty entry
    (4, {"CUDA_VISIBLE_DEVICES": "3,1,-1,0"}, "2"),    # -1
    (4, {"CUDA_VISIBLE_DEVICES": "1,2,7,0"}, "2"),     # an index past the node's GPUs
    (4, {"CUDA_VISIBLE_DEVICES": " +2,3x"}, "2"),      # strtoul's reading: " +2" is 2, "3x" is 3
    (4, {"CUDA_VISIBLE_DEVICES": "GPU-2c000002,GPU-0c000000,MIG-c,GPU-1c000001"}, "2"),   # a UUID of the other kind
    # a UUID (or its start: an abbreviation) of no GPU listed here, another node's: was counted, its rank died
    (4, {"CUDA_VISIBLE_DEVICES": "GPU-3c000003,GPU-1,GPU-8f2e1c3a,GPU-0c000000"}, "2"),
    (8, {"NGPU": "4"}, "4"),                           # fewer than the node has: as asked
    (0, {}, "8"),                                      # no GPU found (a login node's dry run): the presets' 8
])
def test_one_rank_per_gpu_the_node_shows(tmp_path, gpus, extra_env, ranks):
    proc, _ = _launch(tmp_path, gpus, {"DRY_RUN": "1", **extra_env})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    torchrun = [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ torchrun")]
    assert [argv[:4] for argv in torchrun] == [["torchrun", "--nproc-per-node", ranks, "--standalone"]]


@pytest.mark.parametrize("gpus, extra_env, line", [
    (4, {"NGPU": "8"}, "error: NGPU=8: this node shows 4 GPU(s) (CUDA_VISIBLE_DEVICES=unset): one rank per GPU, "
                       "NGPU <= 4"),
    (3, {}, "error: --model.tensor_model_parallel_size: world size 3 is not a multiple of tensor_model_parallel_size "
            "x pipeline_model_parallel_size = 2"),
    (6, {}, "error: --training.global_batch_size: 32 samples do not split over 3 data-parallel ranks"),
    *((8, {"NGPU": "3", "NNODES": "2", "NODE_RANK": node, "MASTER_ADDR": "gpu017"},
       "error: --training.global_batch_size: 32 samples do not split over 3 data-parallel ranks")
      for node in ("0", "1")),   # node 1's check was that of its first rank, 3: silent (rank 0's to say), 10 s later
    (8, {"NNODES": "2"}, "error: NNODES=2: set NODE_RANK, this node's index (0 to 1)"),
    (8, {"NNODES": "2", "NODE_RANK": "1"}, "error: NNODES=2: set MASTER_ADDR, the address of the node of NODE_RANK=0"),
    (8, {"NGPU": "eight"}, "error: NGPU=eight: expected a whole number >= 1"),
    (8, {"MCORE_HEARTBEAT": "0"}, "error: MCORE_HEARTBEAT=0: expected a whole number >= 1"),
    # a waiting node would take a live node 0, its heartbeat not seen to change in MCORE_SILENT s, for a dead one
    (8, {"MCORE_SILENT": "10"}, "error: MCORE_SILENT=10: expected more than twice MCORE_HEARTBEAT=5, the seconds "
     "between node 0's heartbeats"),
    # a node index out of range: was torchrun's error, after the conversion
    *((8, {"NNODES": nnodes, "NODE_RANK": rank, "MASTER_ADDR": "gpu017"}, f"error: NODE_RANK={rank}: expected this "
       f"node's index, a whole number from 0 to {int(nnodes) - 1} (NNODES={nnodes})")
      for nnodes, rank in (("2", "2"), ("2", "-1"), ("2", "one"), ("1", "1"), ("3", " 1"))),
    # no GPU as CUDA reads them (-1: the usual way to hide them; empty; a repeated one): was 1 rank (then the 8B
    # preset's TP 2 refused), or 8 ranks on a node that lists none, or 2 ranks that CUDA shows no GPU
    *((8, {"CUDA_VISIBLE_DEVICES": cvd}, f"error: CUDA_VISIBLE_DEVICES='{cvd}': CUDA shows no GPU with it (it reads the "
       "entries up to the first that is not a GPU here: -1, an empty one; a repeated one hides all): name this node's "
       "GPUs (0,1,...) or unset it") for cvd in ("-1", "", "1,1", ",0,1", "8,9",
                                    "GPU-8f2e1c3a", "GPU-", "GPU-1,GPU-1c000001")),   # no GPU's; several; GPU 1 twice
    # srun -N 2 (or --ntasks-per-node=8) running the launcher without NNODES: each task's torchrun was a standalone
    # run of its own, all training into the same RUN_DIR
    *((8, {"SLURM_STEP_NUM_TASKS": tasks, **nodes}, f"error: SLURM_STEP_NUM_TASKS={tasks}: srun started {tasks} "
       f"launchers for NNODES={nodes.get('NNODES', 1)}: each would start a run of its own into the same RUN_DIR; run one "
       "task per node (srun --ntasks-per-node=1) with NNODES=<the nodes> and NODE_RANK=$SLURM_NODEID "
       "(examples/slurm/train_phf_multinode.sbatch)")
      for tasks, nodes in (("2", {}), ("16", {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "gpu017"}))),
    (8, {"HF_MODEL": ""}, "error: HF_MODEL: is required: the Hugging Face Qwen3 checkpoint directory"),   # was bash's
    (8, {"HF_MODEL": "/no/such/model"}, "error: HF_MODEL: /no/such/model does not exist"),   # was "has no config.json"
    (8, {"HF_MODEL": "configs"}, "error: HF_MODEL: configs has no config.json (not a HF model directory)"),
    # a mistyped local data file: was the trainer's line, after the base model's conversion (minutes at 8B)
    (8, {"DATA": "/no/such/train.jsonl"}, "error: DATA: '/no/such/train.jsonl' does not exist"),
])
def test_ranks_that_do_not_fit_are_one_line_before_the_conversion(tmp_path, gpus, extra_env, line):
    """Each was found after the conversion: by the trainer as it started, by CUDA (a traceback per extra rank), or by
    bash's ``${NODE_RANK:?}`` at torchrun's command line; a missing HF_MODEL was bash's own line, exit code 1."""
    proc, run = _launch(tmp_path, gpus, extra_env)
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]), proc.stderr[-3000:]
    assert not os.path.exists(run)


@pytest.mark.parametrize("environ, line", [
    ({"RANK": "0", "WORLD_SIZE": "6"}, "error: --training.global_batch_size: 32 samples do not split over 3 "
                                       "data-parallel ranks"),
    ({"WORLD_SIZE": "6"}, None),   # without RANK the trainer is one process (process_group): a stray WORLD_SIZE
    # a hand-made launch: one line naming the variable (was a KeyError / ValueError traceback)
    ({"RANK": "0"}, "error: WORLD_SIZE is not set (RANK='0'): torchrun sets RANK and WORLD_SIZE (whole numbers, "
                    "RANK < WORLD_SIZE); unset RANK for a run of one process"),
    ({"RANK": "0", "WORLD_SIZE": "two"}, "error: WORLD_SIZE='two': torchrun sets RANK and WORLD_SIZE (whole "
                                         "numbers, RANK < WORLD_SIZE); unset RANK for a run of one process"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "error: [rank 2] RANK=2 is not below WORLD_SIZE=2: torchrun sets RANK and WORLD_SIZE "
                                       "(whole numbers, RANK < WORLD_SIZE); unset RANK for a run of one process"),
    ({}, None),
])
def test_print_config_checks_the_layout_against_the_world_it_would_run_in(environ, line):
    env = {k: v for k, v in standalone_environ().items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-m", "phf_megatron.train", "--config", "configs/phf_qwen3_8b.yaml",
                           "--print-config"], cwd=REPO, env={**env, **environ}, capture_output=True, text=True,
                          timeout=120)
    if line is None:
        assert proc.returncode == 0 and proc.stdout.startswith("run_dir: runs/phf_qwen3_8b\n"), proc.stderr
    else:
        assert (proc.returncode, proc.stderr.splitlines(), proc.stdout) == (2, [line], "")


@pytest.mark.parametrize("migs, extra_env", [(3, {}), (0, {"CUDA_VISIBLE_DEVICES": "MIG-00000000,MIG-00000001"})])
def test_a_mig_node_shows_one_device(tmp_path, migs, extra_env):
    """A CUDA process enumerates one MIG device, however many the node has (NVIDIA's MIG user guide): the launcher
    counted the 2 GPUs that ``nvidia-smi -L`` lists (or the 2 MIG devices named) and started 2 ranks, the second
    died in ``set_device`` (or shared the first's device). Now one rank; more is refused in one line."""
    proc, run = _launch(tmp_path, 2, {"NGPU": "2", **extra_env}, migs=migs)
    shown = extra_env.get("CUDA_VISIBLE_DEVICES", "unset")
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [
        f"error: NGPU=2: this node shows 1 GPU(s) (CUDA_VISIBLE_DEVICES={shown}; MIG: CUDA shows a process one MIG "
        "device): one rank per GPU, NGPU <= 1"]), proc.stderr[-3000:]
    assert not os.path.exists(run)


@pytest.mark.parametrize("environ, refused", [
    ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "3", "SLURM_LOCALID": "3"}, True),   # srun, one task per GPU
    ({"SLURM_STEP_NUM_TASKS": "2", "RANK": "0", "WORLD_SIZE": "1"}, False),   # torchrun's worker in an srun task
    ({"SLURM_STEP_NUM_TASKS": "1"}, False),                                  # srun -n 1: a run of one process
])
def test_srun_tasks_without_torchrun_are_one_line(tmp_path, environ, refused):
    """``srun --ntasks-per-node=8 python -m phf_megatron.train`` (no torchrun): no task had RANK, so each was a world
    of one on the first GPU it sees, all training alone into the same run directory. Now one line, before any
    input is read; the documented way is one task per node that starts torchrun."""
    env = {k: v for k, v in standalone_environ().items() if not k.startswith("SLURM_")}
    proc = subprocess.run([sys.executable, "-m", "phf_megatron.train", "--config", "configs/tiny_cpu.yaml",
                           f"--run_dir={tmp_path / 'run'}", f"--model.hf_dir={tmp_path / 'no_model'}"],
                          cwd=REPO, env={**env, **environ}, capture_output=True, text=True, timeout=120)
    line = ("error: SLURM_STEP_NUM_TASKS=8: srun started 8 trainers without torchrun (no RANK): each would train alone, "
            "as one process, into the same run directory; run one task per node that starts torchrun "
            "(examples/launch_phf.sh, examples/slurm/train_phf_multinode.sbatch)")
    assert proc.returncode == 2 and (proc.stderr.splitlines() == [line]) == refused, proc.stderr[-3000:]


@pytest.mark.parametrize("local, line", [
    ("1", "LOCAL_RANK='1': this process sees 1 GPU(s) (CUDA_VISIBLE_DEVICES=5): one rank per GPU, LOCAL_RANK < 1; "
          "torchrun sets it (examples/launch_phf.sh)"),
    ("x", "LOCAL_RANK='x': expected a whole number (torchrun sets it: examples/launch_phf.sh)"),
])
def test_a_local_rank_past_the_gpus_this_process_sees_is_one_line(monkeypatch, local, line):
    """srun's one task per GPU with ``--gpus-per-task=1`` and ``LOCAL_RANK=$SLURM_LOCALID``: each task sees one GPU,
    so ``set_device(LOCAL_RANK)`` was CUDA's ``invalid device ordinal`` traceback on every task but the first (a
    LOCAL_RANK that is not a number: a ValueError). Now one line naming LOCAL_RANK, before the device is set."""
    import torch

    from phf_megatron.errors import UserError
    from phf_megatron.runtime import process_group

    def set_device(device):
        raise RuntimeError("CUDA error: invalid device ordinal")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": local, "CUDA_VISIBLE_DEVICES": "5"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError) as err:
        process_group.join_default_group()
    assert err.value.line == line


def _dry_run(tmp_path, script: str, **given: str) -> subprocess.CompletedProcess:
    """``DRY_RUN=1 bash examples/<script>`` on 2 ranks, run from ``tmp_path`` (a model directory there, ``hf``)."""
    hf = tmp_path / "hf"
    hf.mkdir(exist_ok=True)
    (hf / "config.json").write_text("{}")
    env = {k: v for k, v in standalone_environ().items() if k not in ("CUDA_VISIBLE_DEVICES", "NNODES", "RUN_DIR")}
    env.update(DRY_RUN="1", NGPU="2", HF_MODEL=str(hf), PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    return subprocess.run(["bash", os.path.join(REPO, "examples", script)], cwd=str(tmp_path), env={**env, **given},
                          capture_output=True, text=True, timeout=120)


def _torchrun(proc: subprocess.CompletedProcess) -> list[str]:
    """The torchrun command a ``DRY_RUN=1`` launch printed, as argv."""
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return next(shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ torchrun"))


def _own_preset(tmp_path, edit: str = "") -> str:
    """``tmp_path/configs/phf_qwen3_8b.yaml``: the repository's preset plus ``edit``; returns its path."""
    (tmp_path / "configs").mkdir()
    ours = tmp_path / "configs" / "phf_qwen3_8b.yaml"
    ours.write_text(open(os.path.join(REPO, "configs", "phf_qwen3_8b.yaml")).read() + edit)
    return os.path.join(os.path.realpath(tmp_path), "configs", "phf_qwen3_8b.yaml")   # as the launcher's `pwd -P`


def test_relative_paths_are_read_from_the_directory_the_launcher_is_run_from(tmp_path):
    """The launcher changes to the repository: HF_MODEL=models/Qwen3-8B given in another directory was looked for in
    the repository ("has no config.json") and RUN_DIR=runs/exp1 written there. They are now the caller's; a DATA that
    is not a path there (a Hub name) and the defaults (runs/ in the repository) stay as they were."""
    hf = tmp_path / "my models" / "Qwen3-8B"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (tmp_path / "train.jsonl").write_text("")
    argv = _torchrun(_dry_run(tmp_path, "train_phf_qwen3_8b.sh", HF_MODEL="my models/Qwen3-8B", DATA="train.jsonl",
                              RUN_DIR="runs/exp1"))
    here = os.path.realpath(tmp_path)   # the launcher's `pwd -P`
    run = os.path.join(here, "runs", "exp1")
    assert [f"--run_dir={run}", f"--model.hf_dir={here}/my models/Qwen3-8B", f"--model.pretrained_checkpoint={run}/mcore_base",
            f"--data.path={here}/train.jsonl"] == argv[argv.index("--config") + 2:], argv
    argv = _torchrun(_dry_run(tmp_path, "train_grpo_qwen3.sh", HF_MODEL=str(hf), DATA="siyanzhao/Openthoughts_math_30k_opsd"))
    assert ["--run_dir=runs/grpo_qwen3_1p7b", f"--model.hf_dir={hf}",
            "--model.pretrained_checkpoint=runs/grpo_qwen3_1p7b/mcore_base",
            "--data.path=siyanzhao/Openthoughts_math_30k_opsd"] == argv[argv.index("--config") + 2:][:4], argv


@pytest.mark.parametrize("ngpu, given, seen", [("2", None, "1"), ("2", "6", "6"), ("1", None, "unset")])
def test_several_ranks_get_torchruns_thread_default_without_its_warning(tmp_path, ngpu, given, seen):
    """torchrun sets OMP_NUM_THREADS=1 for several ranks when it is unset, with a warning banner in every run's log
    (the CPU test of the 8B launcher set it to keep its log quiet, so a user's log had one); the launcher sets the
    same default first. One rank: left unset, as torchrun leaves it; a value given is kept."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/usr/bin/env bash\n[ "$1" = --help ] && exit 0\necho "omp=${OMP_NUM_THREADS-unset}"\n')
    (bin_dir / "torchrun").chmod(0o755)
    (tmp_path / "mcore").mkdir()   # converted already: straight to torchrun
    extra = {"NGPU": ngpu, "MCORE_DIR": str(tmp_path / "mcore"), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
             **({"OMP_NUM_THREADS": given} if given else {})}
    env = {k: v for k, v in standalone_environ().items() if k != "OMP_NUM_THREADS"}
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    proc = subprocess.run(["bash", os.path.join(REPO, "examples", "train_phf_qwen3_1p7b.sh")], cwd=str(tmp_path),
                          env={**env, "HF_MODEL": str(hf), "RUN_DIR": str(tmp_path / "run"), **extra},
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, f"omp={seen}\n"), proc.stderr


def test_a_preset_of_ones_own_is_read_from_the_directory_the_launcher_is_run_from(tmp_path):
    """CONFIG=my.yaml given in another directory was looked for in the repository ("error: config file 'my.yaml' does
    not exist", beside it); it is read from there when the repository has no such file. A file there that is the
    same as the repository's of that name is nothing to choose: the repository's."""
    _own_preset(tmp_path)
    shutil.copy(os.path.join(REPO, "configs", "phf_qwen3_8b.yaml"), tmp_path / "my.yaml")
    here = os.path.realpath(tmp_path)   # the launcher's `pwd -P`
    for config, read in (("my.yaml", os.path.join(here, "my.yaml")),
                         ("configs/phf_qwen3_8b.yaml", "configs/phf_qwen3_8b.yaml")):
        argv = _torchrun(_dry_run(tmp_path, "launch_phf.sh", CONFIG=config, RUN_DIR=str(tmp_path / "run")))
        assert argv[argv.index("--config") + 1] == read


def test_a_preset_of_ones_own_that_differs_from_the_repositorys_of_that_name_is_one_line(tmp_path):
    """CONFIG=configs/phf_qwen3_8b.yaml given in a directory holding one's own edited copy trained on the
    repository's preset, silently. Now one line naming both and how to choose, exit 2, before python starts (no
    conversion, nothing made); either absolute path given is the one read."""
    ours = _own_preset(tmp_path, "# lr edited\n")
    preset = os.path.join(os.path.realpath(REPO), "configs", "phf_qwen3_8b.yaml")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f"#!/usr/bin/env bash\ntouch {shlex.quote(str(tmp_path / 'python_ran'))}\nexit 3\n")
    (bin_dir / "python").chmod(0o755)
    proc = _dry_run(tmp_path, "launch_phf.sh", CONFIG="configs/phf_qwen3_8b.yaml", RUN_DIR=str(tmp_path / "run"),
                    PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [
        f"error: CONFIG=configs/phf_qwen3_8b.yaml: {ours} and the repository's {preset} differ: name the one to train "
        f"on, CONFIG={ours} (yours) or CONFIG={preset} (the preset)"]), proc.stderr[-3000:]
    assert proc.stdout == "" and not (tmp_path / "python_ran").exists() and not (tmp_path / "run").exists()
    for config in (ours, preset):
        argv = _torchrun(_dry_run(tmp_path, "launch_phf.sh", CONFIG=config, RUN_DIR=str(tmp_path / "run")))
        assert argv[argv.index("--config") + 1] == config


@pytest.mark.parametrize("script, scale, run_dir", [
    ("train_phf_qwen3_8b.sh", {}, "runs/phf_qwen3_8b"),
    ("train_sft_qwen3.sh", {"SCALE": "8b"}, "runs/sft_qwen3_8b"),
    ("train_grpo_qwen3.sh", {"SCALE": "8b"}, "runs/grpo_qwen3_8b"),
])
def test_a_train_launcher_reads_the_repositorys_preset_wherever_it_is_run_from(tmp_path, script, scale, run_dir):
    """The train_*.sh launchers name the repository's preset: run from a directory that holds another
    configs/phf_qwen3_8b.yaml they read the repository's (by its absolute path), with no question asked; RUN_DIR's
    default stays runs/<preset or baseline> in the repository."""
    _own_preset(tmp_path, "# lr edited\n")
    argv = _torchrun(_dry_run(tmp_path, script, **scale))
    assert argv[argv.index("--config") + 1] == os.path.join(os.path.realpath(REPO), "configs", "phf_qwen3_8b.yaml")
    assert argv[argv.index("--config") + 2] == f"--run_dir={run_dir}"
