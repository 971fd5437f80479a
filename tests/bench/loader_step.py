"""PyTorch's side of tests/bench/loader_compare.sh: the same synthetic images
as examples/images.cc (each costs DECODE_US microseconds of the loading
thread's CPU time), the
same CNN, SGD and batch, trained under DDP over Gloo (world 1) with
torch.utils.data.DataLoader and WORKERS workers. Prints samples/s over the
steps after the first 5."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    def __init__(self, decode_us):
        self.decode_us = decode_us

    def __len__(self):
        return 2048

    def __getitem__(self, i):
        until = time.thread_time() + self.decode_us / 1e6  # this thread's CPU clock
        g = torch.Generator().manual_seed(i + 7)
        label = i % 10
        image = torch.randn(3, 32, 32, generator=g) * 0.5 + label / 5
        work = image
        while time.thread_time() < until:
            work = work.flip(2)
        return image, label


def main():
    workers, decode_us, steps, batch = (int(a) for a in sys.argv[1:5])
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(SyntheticImages(decode_us), batch_size=batch, shuffle=True,
                        num_workers=workers, persistent_workers=workers > 0, drop_last=True)
    done, start = 0, None
    while done < steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == 5:
                start = time.perf_counter()
            if done >= steps:
                break
    print(f"{(steps - 5) * batch / (time.perf_counter() - start):.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
