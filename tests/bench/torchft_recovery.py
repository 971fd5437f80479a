#!/usr/bin/env python3
"""torchft's recovery, measured as `muster-bench recovery` measures muster's.

Two replica groups of one process each (torchft's Manager and Optimizer
wrapper, Gloo across the groups; the gradients through Manager.allreduce,
or with --wrapper ddp through torchft's DistributedDataParallel) train the
same MLP on synthetic batches with --compute-ms of extra work per
step, against a Lighthouse in this process. In each trial one group is
SIGKILLed at a random step and started again at once (as muster-agent
restarts a trainer); group 0 logs every committed step with its time on
the host's monotonic clock (the same in every process) and the number of
groups in its quorum. From that:

  survivors_resume: from the kill to the first step committed in a quorum
                    formed after it (without the killed group, or with it
                    back already when its restart came first);
  full_world:       from the kill to the first step committed with both
                    groups again (the restarted one recovered from a peer);
  params_equal:     at the end both groups hold the same parameters.

Prints, like muster-bench recovery:
  recovery system=torchft trials=N survivors_resume_p50_s=.. survivors_resume_max_s=..
    full_world_p50_s=.. params_equal=K/N

Needs torchft (0.2.x) importable; on a machine without network, install its
wheel and its dependencies' wheels first. Usage:
  tests/bench/torchft_recovery.py [--device cpu|cuda] [--trials 5] [--steps 600]
"""

import argparse
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replica(args):
    """One replica group of one process: trains until --steps, logging each
    committed step to --log, then writes its parameter checksum."""
    import torch
    from torch.distributed import TCPStore
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    torch.manual_seed(0)
    device = torch.device(args.device)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).to(device)
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    store_port = free_port()
    store = TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=args.timeout)),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        timeout=timedelta(seconds=args.timeout),
        quorum_timeout=timedelta(seconds=args.timeout),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store_port,
        lighthouse_addr=args.lighthouse,
        replica_id=f"group{args.replica}",
    )
    # torchft 0.2.0's DistributedDataParallel ended the survivor when the
    # peer died during an all-reduce (its comm hook's `assert fut._fut`), so
    # by default the gradients go through Manager.allreduce as one
    # flattened bucket, as the wrapper's hook would send them.
    forward = DistributedDataParallel(manager, model) if args.wrapper == "ddp" else model
    optimizer = Optimizer(manager, inner)
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(1)
    with open(args.log, "a", buffering=1) as log:
        while manager.current_step() < args.steps:
            x = torch.randn(64, 784, generator=gen).to(device)
            y = torch.randint(0, 10, (64,), generator=gen).to(device)
            optimizer.zero_grad()  # starts the quorum of this step
            loss = torch.nn.functional.cross_entropy(forward(x), y)
            loss.backward()
            if args.wrapper == "manager":
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                manager.allreduce(flat).wait()
                offset = 0
                for p in params:
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
            if args.compute_ms > 0:
                time.sleep(args.compute_ms / 1000)
            participants = manager.num_participants()
            before = manager.current_step()
            optimizer.step()  # steps only if every group of the quorum commits
            if manager.current_step() > before:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                # The quorum's id has no public accessor in torchft 0.2.
                log.write(f"step {manager.current_step()} t {time.monotonic():.6f} "
                          f"participants {participants} quorum {manager._quorum_id}\n")
    checksum = sum(p.detach().double().abs().sum().item() for p in model.parameters())
    with open(args.log + ".params", "w") as f:
        f.write(f"{checksum:.9g}\n")
    os._exit(0)  # torchft's threads would hold the process open


def read_steps(path):
    steps = []
    if not os.path.exists(path):
        return steps
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 8 and parts[0] == "step":
                steps.append((int(parts[1]), float(parts[3]), int(parts[5]), int(parts[7])))
    return steps


def trial(args, lighthouse, rng, workdir, n):
    logs = [os.path.join(workdir, f"t{n}_group{g}.log") for g in range(2)]
    script = os.path.abspath(__file__)

    def start(g):
        cmd = [sys.executable, script, "--replica", str(g), "--lighthouse", lighthouse,
               "--log", logs[g], "--device", args.device, "--steps", str(args.steps),
               "--compute-ms", str(args.compute_ms), "--timeout", str(args.timeout),
               "--wrapper", args.wrapper]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                stderr=open(logs[g] + ".err", "a"))

    procs = [start(0), start(1)]
    kill_at = rng.randint(args.steps // 4, args.steps // 2)
    deadline = time.monotonic() + args.trial_timeout
    while time.monotonic() < deadline:
        s = read_steps(logs[0])
        if s and s[-1][0] >= kill_at and s[-1][2] == 2:
            break
        time.sleep(0.005)
    else:
        raise RuntimeError(f"trial {n}: step {kill_at} with both groups never came; "
                           f"group 0 logged {read_steps(logs[0])[-3:]}")
    killed_at = time.monotonic()
    os.kill(procs[1].pid, signal.SIGKILL)
    procs[1].wait()
    procs[1] = start(1)
    for p in procs:
        p.wait(timeout=max(1, deadline - time.monotonic()))
    steps = read_steps(logs[0])
    last_quorum = max(q for _, t, _, q in steps if t <= killed_at)
    # A step of the quorum of the kill that commits after it was in flight
    # and done before the kill: not a recovery.
    after = [(t, k) for _, t, k, q in steps if t > killed_at and q > last_quorum]
    resumed = after[0][0] if after else None
    both = next((t for t, k in after if k == 2), None)
    if resumed is None or both is None:
        raise RuntimeError(f"trial {n}: no step of a new quorum, or none with both groups, "
                           f"after the kill (group 0 logged {steps[-3:]})")
    params = []
    for g in range(2):
        with open(logs[g] + ".params") as f:
            params.append(f.read().strip())
    return resumed - killed_at, both - killed_at, params[0] == params[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--compute-ms", type=float, default=10)
    ap.add_argument("--timeout", type=float, default=10,
                    help="torchft's Manager and Gloo timeouts, seconds")
    ap.add_argument("--trial-timeout", type=float, default=300)
    ap.add_argument("--wrapper", choices=["manager", "ddp"], default="manager",
                    help="gradients through Manager.allreduce, or torchft's "
                         "DistributedDataParallel")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replica", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--lighthouse", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replica is not None:
        return replica(args)

    from torchft.coordination import LighthouseServer

    rng = random.Random(args.seed)
    resumed, full, equal = [], [], 0
    workdir = tempfile.mkdtemp(prefix="torchft-recovery-")  # kept when a trial fails
    for n in range(args.trials):
        # A fresh lighthouse per trial, as muster-bench starts a fresh job.
        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100)
        try:
            r, f, same = trial(args, lighthouse.address(), rng, workdir, n)
        finally:
            lighthouse.shutdown()
        resumed.append(r)
        full.append(f)
        equal += same
        print(f"trial {n}: survivors_resume_s={r:.3f} full_world_s={f:.3f} "
              f"params_equal={int(same)}", flush=True)
    shutil.rmtree(workdir)
    print(f"recovery system=torchft trials={args.trials} "
          f"survivors_resume_p50_s={statistics.median(resumed):.3f} "
          f"survivors_resume_max_s={max(resumed):.3f} "
          f"full_world_p50_s={statistics.median(full):.3f} params_equal={equal}/{args.trials}")


if __name__ == "__main__":
    sys.exit(main())
