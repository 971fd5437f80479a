#!/usr/bin/env python3
"""PyTorch eager reference for muster's step time and all-reduce bandwidth.

The same models as trainer/models/models.cc (mlp, cnn, resnet18), batch,
optimizer (SGD, momentum 0.9, lr 0.01 x world) and loss as muster-train,
timed the same way: from the batch on the device to the optimizer step done
(torch.cuda.synchronize on the GPU), median over the steps after a warm-up.
muster's time (--time-steps) also holds its own work at the step boundary.
With --world 2 on the GPU the ranks share one GPU under
DistributedDataParallel over Gloo: NCCL refuses two ranks on one GPU, so
Gloo (which stages CUDA tensors through host memory) is PyTorch's equivalent
of muster's hier(nccl+gloo) with one trainer per node. --device cpu runs
the ranks on the CPU (DDP over Gloo; --threads intra-op threads each, by
default the cores shared out as muster-train does), the side-by-side of
`muster-bench train`.

--comm-hook bf16|fp16 registers DDP's bf16_compress_hook / fp16_compress_hook
(torch.distributed.algorithms.ddp_comm_hooks.default_hooks): buckets travel
as bfloat16 / float16, the counterpart of muster's --gradient-compression.

--mode allreduce times dist.all_reduce of --bytes of float32 over Gloo on
the CPU instead (with --comm-hook: cast to the 16-bit type and divided by
the world, reduced, copied back, as the hook does), median over repeats of
the ranks' mean, busbw = algbw 2(W-1)/W counting the float32 bytes: the
figures of `muster-bench allreduce`.

--ranks A,B,... starts only those ranks here (default: every rank of
--world), so that a world spans hosts: run it once per host (or network
namespace, tests/bench/lab_allreduce_compare.sh) with MASTER_ADDR set to the
host of rank 0 and GLOO_SOCKET_IFNAME to the interface between them.

--phases times each phase apart (on the CPU always): forward, backward (DDP's
all-reduce overlaps it and ends in it), optimizer; medians, the
counterpart of muster's step timeline.

Prints: pytorch device=D model=M batch=B world=W comm_hook=H steps_per_s=S step_ms_p50=T
        pytorch_phases rank=0 step_ms=T forward_ms=T backward_ms=T optimizer_ms=T
    or: pytorch allreduce backend=gloo world=W bytes=N comm_hook=H median_s=T
        algbw_GBps=X busbw_GBps=Y
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


class Mlp(nn.Module):
    def __init__(self, c, h, w, classes):
        super().__init__()
        self.fc1 = nn.Linear(c * h * w, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, classes)

    def forward(self, x):
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


class SmallCnn(nn.Module):
    def __init__(self, c, h, w, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(c, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * (h // 4) * (w // 4), 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    def __init__(self, c, h, w, classes):
        super().__init__()
        self.small = h <= 64
        self.stem = (nn.Conv2d(c, 64, 3, padding=1, bias=False) if self.small
                     else nn.Conv2d(c, 64, 7, stride=2, padding=3, bias=False))
        self.bn = nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for stage, width in enumerate([64, 128, 256, 512]):
            for b in range(2):
                blocks.append(BasicBlock(cin, width, 2 if stage > 0 and b == 0 else 1))
                cin = width
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        if not self.small:
            x = F.max_pool2d(x, 3, 2, 1)
        for block in self.blocks:
            x = block(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


HOOKS = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}
HOOK_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def init(rank, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world)


def run(rank, args):
    torch.manual_seed(args.seed)
    cuda = args.device == "cuda"
    if not cuda:
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // args.world))
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    model = {"mlp": Mlp, "cnn": SmallCnn, "resnet18": ResNet18}[args.model](
        args.channels, args.size, args.size, 10).to(device)
    if args.world > 1:
        init(rank, args)
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0] if cuda else None)
        if args.comm_hook != "none":
            model.register_comm_hook(None, HOOKS[args.comm_hook])
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * args.world, momentum=0.9)
    x = torch.randn(args.batch, args.channels, args.size, args.size, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    times = []
    phases = {"forward": [], "backward": [], "optimizer": []}
    # On the GPU a phase ends when its kernels are done: synchronised only
    # with --phases, which then costs the step two more synchronisations.
    sync = cuda and args.phases

    def lap():
        if sync:
            torch.cuda.synchronize(device)
        return time.perf_counter()

    for step in range(args.steps):
        started = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        forward_done = lap()
        opt.zero_grad()
        loss.backward()  # DDP's bucketed all-reduce, and its wait at the end
        backward_done = lap()
        opt.step()
        if cuda:
            torch.cuda.synchronize(device)
        done = time.perf_counter()
        if step >= args.warmup:
            times.append((done - started) * 1e3)
            phases["forward"].append((forward_done - started) * 1e3)
            phases["backward"].append((backward_done - forward_done) * 1e3)
            phases["optimizer"].append((done - backward_done) * 1e3)
    if rank == 0:
        print(f"pytorch device={args.device} model={args.model} batch={args.batch} "
              f"world={args.world} comm_hook={args.comm_hook} "
              f"steps_per_s={1e3 * len(times) / sum(times):.2f} "
              f"step_ms_p50={statistics.median(times):.3f}", flush=True)
        if args.phases or not cuda:
            print(f"pytorch_phases rank=0 step_ms={statistics.median(times):.3f} " +
                  " ".join(f"{k}_ms={statistics.median(v):.3f}" for k, v in phases.items()),
                  flush=True)
    if args.world > 1:
        dist.destroy_process_group()


def allreduce(rank, args):
    init(rank, args)
    torch.set_num_threads(1)
    count = args.bytes // 4
    x = torch.ones(count)
    reps = min(max((512 << 20) // max(args.bytes, 1), 5), 50)
    times = []
    for i in range(reps + 2):
        dist.barrier()
        started = time.perf_counter()
        if args.comm_hook == "none":
            dist.all_reduce(x)
        else:  # what bf16/fp16_compress_hook does with a bucket
            compressed = x.to(HOOK_TYPES[args.comm_hook]).div_(args.world)
            dist.all_reduce(compressed)
            x.copy_(compressed)
        if i >= 2:
            times.append(time.perf_counter() - started)
    mean = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(mean)
    median = statistics.median((mean / args.world).tolist())
    algbw = args.bytes / median / 1e9
    if rank == 0:
        print(f"pytorch allreduce backend=gloo world={args.world} bytes={args.bytes} "
              f"comm_hook={args.comm_hook} median_s={median:.6f} algbw_GBps={algbw:.3f} "
              f"busbw_GBps={algbw * 2 * (args.world - 1) / args.world:.3f}", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", choices=["mlp", "cnn", "resnet18"])
    p.add_argument("--size", type=int, default=224, help="images are N x N")
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--threads", type=int, default=0,
                   help="CPU: intra-op threads per rank (0: the cores / world)")
    p.add_argument("--comm-hook", default="none", choices=["none", "bf16", "fp16"],
                   help="DDP's bf16_compress_hook / fp16_compress_hook")
    p.add_argument("--phases", action="store_true",
                   help="on the GPU: synchronise after the forward and the backward and print "
                        "each phase's median (the CPU prints them always)")
    p.add_argument("--mode", default="step", choices=["step", "allreduce"])
    p.add_argument("--bytes", type=int, default=64 << 20,
                   help="allreduce: float32 bytes per all-reduce")
    p.add_argument("--ranks", default="",
                   help="comma-separated ranks to start here (default: all of --world)")
    args = p.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else list(range(args.world))
    if any(r < 0 or r >= args.world for r in ranks):
        p.error(f"--ranks {args.ranks}: each must be in 0..{args.world - 1}")
    if args.mode == "allreduce":
        if args.world < 2:
            p.error("--mode allreduce needs --world 2 or more")
        mp.spawn(at_rank, args=(allreduce, ranks, args), nprocs=len(ranks))
    elif args.world > 1:
        mp.spawn(at_rank, args=(run, ranks, args), nprocs=len(ranks))
    else:
        run(0, args)


def at_rank(index, fn, ranks, args):
    """mp.spawn's process `index` runs rank ranks[index]."""
    fn(ranks[index], args)


if __name__ == "__main__":
    main()
