"""Read a checkpoint once across the ranks of a torch.distributed group; every rank gets every
tensor. Run: torchrun --nproc-per-node 2 examples/python/many_ranks.py MODEL_DIR [cuda]"""

import os
import sys

import torch.distributed as dist

import safetensors_staging as st

gpu = len(sys.argv) > 2 and sys.argv[2] == "cuda"
dist.init_process_group("nccl" if gpu else "gloo")
device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if gpu else "cpu"
with st.stage(sys.argv[1], device, process_group=dist.group.WORLD) as it:
    weights = dict(it)
    report = it.report()
print(
    f"rank {dist.get_rank()}: {len(weights)} tensors, read {report['bytes_read']} bytes, "
    f"received {report['bytes_received']}"
)
dist.destroy_process_group()
