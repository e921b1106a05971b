"""The trainer's faults a user can fix, as a user meets them: one line (``error: ...``), exit code
2, no traceback (neither ours nor vLLM's shutdown at exit), and the run directory as it was.

* a refused resume (settings that differ from the checkpoint's) leaves every byte of the run
  directory as it was (``config.yaml`` was overwritten with the refused settings), and with the
  vLLM engine up it stops it before the process group goes (vLLM's exit hook printed 17 lines of
  "Invalid process group specified");
* a truncated checkpoint file is named;
* a full disk (a real 200 KiB tmpfs: config and metrics fit, the first checkpoint does not) says
  "No space left on device" and that there is no earlier checkpoint, and leaves no temp directory;
* a read-only run directory is named;
* a data row whose prompt can never fit ``data.max_prompt_length``, or whose longest sequence can never
  fit ``training.max_tokens_per_microbatch``, is named (file and line) before any step; a model that is not a Qwen3 is named by its config.json's own model_type.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from ..helpers.mounts import read_only_dir, small_tmpfs
from ..helpers.tiny_run import assert_ok, train

TWO_STEPS = ("--training.train_iters=2", "--checkpoint.save_interval=2")


def _one_error_line(proc) -> str:
    """The run's one line of stderr besides progress bars; exit code 2, no traceback."""
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines()
             if line.strip() and not re.search(r"\d+%( Completed)? ?\|", line)]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, \
        f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    assert lines[0].startswith("error: ")
    return lines[0]


def _tree(root: str) -> dict[str, bytes]:
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


@pytest.fixture(scope="module")
def two_step_run(tiny_inputs, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("faults") / "run")
    assert_ok(train(*tiny_inputs, run, *TWO_STEPS))
    return run


@pytest.mark.vllm
def test_refused_resume_leaves_the_run_directory_as_it_was(tiny_inputs, two_step_run):
    before = _tree(two_step_run)
    proc = train(*tiny_inputs, two_step_run, "--training.train_iters=3", "--rollout.backend=vllm")
    line = _one_error_line(proc)
    assert "the run's settings differ from the checkpoint's: rollout.backend: 'hf' -> 'vllm'" in line
    assert _tree(two_step_run) == before


def test_truncated_checkpoint_is_named(tiny_inputs, two_step_run, tmp_path):
    run = shutil.copytree(two_step_run, str(tmp_path / "run"))
    damaged = os.path.join(run, "checkpoints", "iter_0000002", "rank_tp00_pp000_dp000.pt")
    with open(damaged, "r+b") as f:
        f.truncate(os.path.getsize(damaged) // 2)
    line = _one_error_line(train(*tiny_inputs, run, "--training.train_iters=3"))
    assert line.startswith(f"error: {damaged}: not a readable torch file, truncated or corrupt")


def test_a_latest_file_naming_a_missing_checkpoint_is_not_a_finished_run(tiny_inputs, two_step_run, tmp_path):
    """latest_checkpointed_iteration.txt says 7, iter_0000007 is gone: the rerun said "is finished (step 7 of 3):
    nothing to train", latest iter_0000007, exit 0; now the resume's line names it and the checkpoints there."""
    run = shutil.copytree(two_step_run, str(tmp_path / "run"))
    save = os.path.join(run, "checkpoints")
    with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("7")
    line = _one_error_line(train(*tiny_inputs, run, "--training.train_iters=3"))
    assert line == (f"error: {save}/iter_0000007: no complete checkpoint here (meta.json missing); {save}/"
                    "latest_checkpointed_iteration.txt names it, the checkpoints there: iter_0000002 (write the "
                    "iteration of one into it, or use a new --checkpoint.save directory to start afresh)")


def test_checkpoints_without_a_latest_file_are_not_trained_over(tiny_inputs, two_step_run, tmp_path):
    """No latest file beside iter_0000002 (a first save killed after its rename): the rerun trained from step 0
    and saved over iter_0000002, exit 0; now one line names the latest file, and nothing is written."""
    run = shutil.copytree(two_step_run, str(tmp_path / "run"))
    latest = os.path.join(run, "checkpoints", "latest_checkpointed_iteration.txt")
    os.remove(latest)
    before = _tree(run)
    line = _one_error_line(train(*tiny_inputs, run, "--training.train_iters=3"))
    assert line.startswith(f"error: {latest}: missing, but ") and _tree(run) == before


def test_a_resume_with_another_model_names_the_checkpoint_file(tiny_inputs, two_step_run, tmp_path):
    """--model.hf_dir may change on resume (a moved model), to a model with a third layer: torch's optimizer
    load raised "loaded state dict contains a parameter group that doesn't match..." (a traceback, no file);
    the adapters are now checked first and the file and part named."""
    from ..helpers.tiny_qwen3 import make_tiny_hf

    run = shutil.copytree(two_step_run, str(tmp_path / "run"))
    three = make_tiny_hf(str(tmp_path / "three_layers"), num_layers=3)
    line = _one_error_line(train(three, tiny_inputs[1], run, "--training.train_iters=3"))
    shard = os.path.join(run, "checkpoints", "iter_0000002", "model_parallel_tp00_pp000.pt")
    assert line.startswith(f"error: {shard}: part 'adapters' does not fit this run: checkpoint tensors: missing "
                           "['layers.2.down_proj.lora_A', "), line


def test_a_full_fine_tuning_resume_with_another_model_is_not_called_damage(tiny_inputs, tmp_path):
    """The dist checkpoint of a full fine-tuning, resumed with a model of a third layer: Megatron's shape check
    was reported as "a file of this dist checkpoint is truncated or corrupt", with every rank's traceback."""
    from ..helpers.tiny_qwen3 import make_tiny_hf

    run, full = str(tmp_path / "run"), ("--lora.enabled=false", "--training.train_iters=1")
    assert_ok(train(*tiny_inputs, run, *full))
    three = make_tiny_hf(str(tmp_path / "three_layers"), num_layers=3)
    line = _one_error_line(train(three, tiny_inputs[1], run, *full[:1], "--training.train_iters=2"))
    assert line.startswith(f"error: {run}/checkpoints/iter_0000001/dist: saved from another model than this run's "
                           "(CheckpointingException: Global shape mismatch for loaded (torch.Size([2, 32])) and "
                           "expected ((3, 32)) tensor for key decoder."), line


def test_full_disk_at_the_first_checkpoint(tiny_inputs, tmp_path):
    with small_tmpfs(str(tmp_path / "full"), size="200k") as full:
        run = os.path.join(full, "run")
        line = _one_error_line(train(*tiny_inputs, run, *TWO_STEPS))
        save_dir = os.path.join(run, "checkpoints")
        assert line == (f"error: {save_dir}: cannot write: No space left on device; checkpoint iter_0000002 not "
                        "saved: writing per-rank files failed on rank(s) [0]; there is no earlier checkpoint")
        assert os.listdir(save_dir) == []


def test_read_only_run_directory(tiny_inputs, tmp_path):
    with read_only_dir(str(tmp_path / "ro")) as ro:
        run = os.path.join(ro, "run")
        line = _one_error_line(train(*tiny_inputs, run, *TWO_STEPS))
        why = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
        assert line == f"error: {run}: cannot write: {why}"


def test_a_non_qwen3_model_is_named_by_its_own_model_type(tiny_inputs, tmp_path):
    """config.json says 'mistral'; transformers loads it as a 'ministral' config, which the
    message named."""
    from phf_megatron.errors import ConfigError
    from phf_megatron.training.config_io import load_config
    from phf_megatron.training.model_setup import read_hf_config

    hf = shutil.copytree(tiny_inputs[0], str(tmp_path / "mistral"))
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump({**config, "model_type": "mistral", "architectures": ["MistralForCausalLM"]}, f)
    with pytest.raises(ConfigError) as err:
        read_hf_config(load_config(argv=[f"--model.hf_dir={hf}"]))
    assert err.value.line == "--model.hf_dir: model_type 'mistral' is not 'qwen3'"


def _long_third_row(tiny_inputs, tmp_path, repeat: int = 200) -> tuple[str, dict]:
    """The toy data with row 3's solution made long (``repeat`` more sentences): ``(path, row 3)``."""
    data = str(tmp_path / "long.jsonl")
    with open(tiny_inputs[1]) as f:
        rows = f.read().splitlines()
    row = json.loads(rows[2])
    row = {**row, "solution": row["solution"] + " 1 + 1 = 2." * repeat}
    rows[2] = json.dumps(row)
    with open(data, "w") as f:
        f.write("\n".join(rows) + "\n")
    return data, row


def test_a_row_over_the_prompt_limit_is_named_at_load(tiny_inputs, tmp_path):
    """Row 3 of the data can never fit ``data.max_prompt_length``: the run stops before any step
    (it was found when step 2 was planned, two trained steps later), naming the file and line."""
    data, _ = _long_third_row(tiny_inputs, tmp_path)
    run = str(tmp_path / "run")
    line = _one_error_line(train(tiny_inputs[0], data, run, *TWO_STEPS, "--data.max_prompt_length=400"))
    assert line == (f"error: --data.max_prompt_length: 1 row(s) have a prompt over 400 tokens, which the run could "
                    f"never train on: {data}:3; raise it, or remove the rows")
    assert not os.path.exists(os.path.join(run, "metrics.jsonl"))


def test_a_row_over_the_token_budget_is_named_at_load(tiny_inputs, tmp_path):
    """Row 3's teacher prompt + rollout.max_tokens is over ``training.max_tokens_per_microbatch`` alone: the run
    stops before any step (it stopped when step 2 came), naming the row and the smallest budget that fits every
    row (row 3's teacher prompt, tokenized here, + rollout.max_tokens); at that budget the run trains."""
    from phf_megatron.data import build_prompt_pair
    from phf_megatron.tokenizer import load_qwen3_tokenizer

    data, row = _long_third_row(tiny_inputs, tmp_path, repeat=30)  # a prompt within data.max_prompt_length
    prompt = len(build_prompt_pair(load_qwen3_tokenizer(tiny_inputs[0]), row["problem"], row["solution"]).teacher_ids)
    need = prompt + 12
    run = str(tmp_path / "run")
    line = _one_error_line(train(tiny_inputs[0], data, run, *TWO_STEPS, "--training.packing",
                                 "--rollout.max_tokens=12", "--training.max_tokens_per_microbatch=300"))
    assert line == (f"error: --training.max_tokens_per_microbatch: 1 row(s) make a sequence over the budget of 300 "
                    f"tokens alone, which would stop the run when its step came: {data}:3 makes {prompt} prompt + 12 "
                    f"completion tokens (rollout.max_tokens) = {need}; the smallest budget every row fits is {need}: "
                    "raise it to that, lower rollout.max_tokens, or remove the row(s)")
    assert not os.path.exists(os.path.join(run, "metrics.jsonl"))
    assert_ok(train(tiny_inputs[0], data, str(tmp_path / "fits"), "--training.train_iters=1",
                    "--checkpoint.save_interval=0", "--training.packing", "--rollout.max_tokens=12",
                    f"--training.max_tokens_per_microbatch={need}"))
