#!/usr/bin/env python3
"""PyTorch eager reference for muster's GPU step time.

The same models as trainer/models/models.cc (cnn, resnet18), batch,
optimizer (SGD, momentum 0.9, lr 0.01 x world) and loss as muster-train,
timed the same way: from the batch on the device to the optimizer step done
(torch.cuda.synchronize), median over the steps after a warm-up. muster's
time (--time-steps) also holds its own work at the step boundary. With
--world 2 the ranks share one GPU under DistributedDataParallel over Gloo:
NCCL refuses two ranks on one GPU, so Gloo (which stages CUDA tensors through
host memory) is PyTorch's equivalent of muster's hier(nccl+gloo) with one
trainer per node.

Prints: pytorch device=cuda model=M batch=B world=W step_ms_p50=T
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


def run(rank, args):
    torch.manual_seed(args.seed)
    device = torch.device("cuda", 0)
    model = {"cnn": SmallCnn, "resnet18": ResNet18}[args.model](
        args.channels, args.size, args.size, 10).to(device)
    if args.world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=args.world)
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * args.world, momentum=0.9)
    x = torch.randn(args.batch, args.channels, args.size, args.size, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    times = []
    for step in range(args.steps):
        started = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize(device)
        if step >= args.warmup:
            times.append((time.perf_counter() - started) * 1e3)
    if rank == 0:
        print(f"pytorch device=cuda model={args.model} batch={args.batch} world={args.world} "
              f"step_ms_p50={statistics.median(times):.3f}", flush=True)
    if args.world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", choices=["cnn", "resnet18"])
    p.add_argument("--size", type=int, default=224, help="images are N x N")
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if args.world > 1:
        mp.spawn(run, args=(args,), nprocs=args.world)
    else:
        run(0, args)


if __name__ == "__main__":
    main()
