"""Two steps of DDP (gloo, CPU) on the shrunk Gemma 3 on text-only rows, as a run of it would take them."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoConfig, AutoModelForCausalLM

from sftdoctor.facts.unused_params import shrink_all

dist.init_process_group("gloo")
config = AutoConfig.from_pretrained(sys.argv[1])
shrink_all(config)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
ddp = DistributedDataParallel(model, find_unused_parameters=sys.argv[2] == "on")
for step in range(2):
    ids = torch.randint(3, 500, (2, 16))
    ddp(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    print(f"step {step} done", flush=True)
dist.destroy_process_group()
