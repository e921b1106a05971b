#!/usr/bin/env python
"""Time to send a step's completions (token ids) from the engine's rank to the others, as the trainer does.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/ids_broadcast.py --shapes 32x1024 256x1024 1024x4096

``RolloutDriver.generate`` broadcasts the completions as a list of lists of ints with
``broadcast_object_list`` over a gloo group (pickle on the source, a size then a byte tensor,
unpickle everywhere). Two local ranks on loopback; per shape (sequences x tokens) the median of
``--repeats`` broadcasts, the pickled bytes per id, and the fitted latency and bandwidth
(``fit_line`` over the shapes) that ``scaling_model.ids_s`` takes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _worker(rank: int, world: int, port: int, shapes: list[tuple[int, int]], repeats: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = []
    for seqs, tokens in shapes:
        ids = [[(7919 * i + j) % 151_936 for j in range(tokens)] for i in range(seqs)]
        times = []
        for _ in range(repeats):
            box = [ids if rank == 0 else None]
            dist.barrier()
            t0 = time.perf_counter()
            dist.broadcast_object_list(box, src=0)
            times.append(time.perf_counter() - t0)
            assert box[0] == ids
        dist.barrier()
        if rank == 1:      # the receiving side sees the whole transfer (pickle, send, unpickle)
            import pickle
            nbytes = len(pickle.dumps(ids))
            rows.append({"sequences": seqs, "tokens": tokens, "ids": seqs * tokens, "pickled_bytes": nbytes,
                         "seconds": statistics.median(times), "seconds_all": times})
    if rank == 1:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> None:
    from benchmarks.scaling_model import fit_line

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["32x1024", "256x1024", "1024x4096"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/bench_ids"))
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, 2, args.port, shapes, args.repeats, queue)) for r in range(2)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    latency, s_per_byte = fit_line([r["pickled_bytes"] for r in rows], [r["seconds"] for r in rows], relative=True)
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "torch": torch.__version__, "ranks": 2,
              "backend": "gloo, loopback", "rows": rows, "latency_s": latency,
              "bytes_per_s": 1 / s_per_byte if s_per_byte > 0 else None,
              "bytes_per_id": statistics.median(r["pickled_bytes"] / r["ids"] for r in rows)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ids_broadcast.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
