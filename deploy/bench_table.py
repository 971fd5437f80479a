#!/usr/bin/env python3
"""Writes a benchmark's table of current values into docs/benchmarks.md.

    bench_table.py DOC KIND OUTPUT

OUTPUT is what muster-bench (or muster-fault) printed; KIND says which
benchmark it is (coordinator, allreduce, train, checkpoint, recovery,
reliability, sharding, sharding-reduce-scatter) and which markers of DOC
(<!-- KIND:begin --> ... <!-- KIND:end -->) the table replaces. The
table's caption gives the date, the commit and the machine, so that no
figure there is typed by hand.
"""
import os
import platform
import re
import subprocess
import sys


def runs(lines, first):
    """Groups `key=value` lines into runs, each starting at a line `first ...`."""
    out = []
    for line in lines:
        words = line.split()
        if not words:
            continue
        fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        if words[0] == first:
            out.append({})
        if out:
            out[-1].update({f"{words[0]}.{k}": v for k, v in fields.items()})
    return out


def number(v, digits=0):
    return f"{float(v):,.{digits}f}"


def records(lines, first):
    """The `key=value` fields of each line that starts with `first`."""
    return [dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
            for line in lines if line.split()[:1] == [first]]


def size(nbytes):
    n = int(nbytes)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def allreduce(lines):
    """busbw in GB/s and, in brackets, the median seconds: a row per backend
    and placement, a column per size."""
    cells, sizes = {}, []
    for r in records(lines, "allreduce"):
        key = (r["backend"], r["world"], r["nodes"], r.get("compression", "none"))
        if r["bytes"] not in sizes:
            sizes.append(r["bytes"])
        cells.setdefault(key, {})[r["bytes"]] = f"{float(r['busbw_GBps']):.2f} ({r['median_s']})"
    sizes.sort(key=int)
    rows = ["| backend | world | nodes | compression | " + " | ".join(size(b) for b in sizes) + " |",
            "| --- | ---: | ---: | --- |" + " ---: |" * len(sizes)]
    for (backend, world, nodes, compression), by_size in cells.items():
        rows.append(f"| {backend} | {world} | {nodes} | {compression} | " +
                    " | ".join(by_size.get(b, "") for b in sizes) + " |")
    return rows


def columns(first, cols):
    """A table with a row per line that starts with `first`. Each of `cols`
    is a key, whose value is the cell (right-aligned), or (heading,
    alignment, the cell of a record)."""
    cols = [(c, "---:", lambda r, k=c: r[k]) if isinstance(c, str) else c for c in cols]

    def table(lines):
        rows = ["| " + " | ".join(c[0] for c in cols) + " |",
                "|" + "".join(f" {c[1]} |" for c in cols)]
        for r in records(lines, first):
            rows.append("| " + " | ".join(c[2](r) for c in cols) + " |")
        return rows
    return table


coordinator = columns("coordinator", [
    ("members", "---:", lambda r: number(r["members"])),
    ("sessions", "---:", lambda r: number(r["sessions"])),
    "channels",
    ("rendezvous_s (coordinator CPU)", "---:",
     lambda r: f"{r['rendezvous_s']} ({r['rendezvous_cpu_s']})"),
    ("regroup_s (coordinator CPU)", "---:", lambda r: f"{r['regroup_s']} ({r['regroup_cpu_s']})"),
    "hb_p50_ms", "hb_p99_ms",
    ("rss_mb", "---:", lambda r: number(r["rss_mb"])),
    "cpu_pct",
    ("period (ms)", "---:", lambda r: r["hb_interval_ms"]),
])
train = columns("train", [
    ("model", "---", lambda r: r["model"]), "world", "nodes", "bucket_mb",
    ("all-reduce", "---", lambda r: r["overlap"]), "steps_per_s",
    ("samples_per_s", "---:", lambda r: number(r["samples_per_s"])),
    "comm_overlap_pct", "test_accuracy",
])
checkpoint = columns("checkpoint", ["state_mb", "blocking_s", "backlog_s", "write_s",
                                    "write_MBps", "dd_direct_MBps", "step_s",
                                    "step_overhead_pct"])
recovery = columns("recovery", ["world", "nodes", "spares", "trials", "survivors_resume_p50_s",
                                "survivors_resume_max_s", "full_world_p50_s", "lost_steps_max",
                                "params_equal"])


def reliability(lines):
    rows = ["| scenario | trials | survived | recovered p50 (s) | recovered max (s) | "
            "lost steps max | committed checkpoints lost |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in records(lines, "fault"):
        if "trials" in f:
            rows.append("| {scenario} | {trials} | {survived} | {recovered_p50_s} | "
                        "{recovered_max_s} | {lost_steps_max} | {committed_ckpt_lost} |".format(**f))
        elif "scenario" in f:
            rows.append("| {} | skipped | | | | | |".format(f["scenario"]))
    return rows


def sharding(lines):
    by_mode = {r.get("train.shard_optimizer"): r for r in runs(lines, "train")}
    if set(by_mode) != {"off", "on"}:
        sys.exit("bench_table.py: expected an unsharded and a sharded run")
    off, on = by_mode["off"], by_mode["on"]

    def row(name, key, digits=0, saved=False):
        a, b = float(off[key]), float(on[key])
        delta = f" ({number(a - b, digits)} less)" if saved else ""
        return f"| {name} | {number(a, digits)} | {number(b, digits)}{delta} |"

    def account(r):
        return " / ".join(number(r[f"memory_account.{c}_mb"], 1)
                          for c in ("parameters", "gradients", "optimizer_state", "communication"))

    step_off, step_on = float(off["phases.step_ms"]), float(on["phases.step_ms"])
    return [
        "| figure | unsharded | sharded |",
        "| --- | ---: | ---: |",
        row("optimizer state elements, largest rank", "train.optimizer_state_elements", saved=True),
        f"| memory account (MB): parameters / gradients / state / communication | {account(off)} | {account(on)} |",
        row("memory account total (MB)", "memory_account.total_mb", 1, saved=True),
        row("steady RSS, largest rank (MB)", "train.steady_rss_mb", saved=True),
        row("peak RSS, largest rank (MB)", "train.peak_rss_mb", saved=True),
        f"| median step, rank 0 (ms) | {number(step_off)} | {number(step_on)} ({step_on / step_off:.2f}×) |",
    ]


def caption(root):
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    date = subprocess.run(["date", "+%F"], capture_output=True, text=True).stdout.strip()
    system = platform.system()
    try:
        release = dict(line.rstrip().split("=", 1) for line in open("/etc/os-release") if "=" in line)
        system = release.get("PRETTY_NAME", system).strip('"')
    except OSError:
        pass
    return f"Generated by `./deploy/dev bench` on {date} at `{commit}`: {os.cpu_count()} cores, {system}."


def main():
    doc, kind, output = sys.argv[1:4]
    # The same figures for sharded state with the gradients all-reduced
    # (two copies) and reduce-scattered (one copy).
    tables = {"coordinator": coordinator, "allreduce": allreduce, "train": train,
              "checkpoint": checkpoint, "recovery": recovery, "reliability": reliability,
              "sharding": sharding, "sharding-reduce-scatter": sharding}
    rows = tables[kind](open(output).read().splitlines())
    if len(rows) <= 2:
        sys.exit(f"bench_table.py: no {kind} figures in {output}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(doc)))
    begin, end = f"<!-- {kind}:begin -->", f"<!-- {kind}:end -->"
    text = open(doc).read()
    if begin not in text or end not in text:
        sys.exit(f"bench_table.py: {doc} has no {begin} ... {end}")
    block = "\n".join([begin, caption(root), ""] + rows + [end])
    text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda m: block, text, flags=re.S)
    open(doc, "w").write(text)


if __name__ == "__main__":
    main()
