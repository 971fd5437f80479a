#!/usr/bin/env python3
"""Writes a benchmark's table of current values into docs/benchmarks.md.

    bench_table.py DOC KIND OUTPUT

OUTPUT is what muster-bench (or muster-fault) printed; KIND says which
benchmark it is (the keys of `tables` in main) and which markers of DOC
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


def relays(r):
    if "relays" not in r:
        return ""
    return f"{r['relays']}: {r['relay_regroup_cpu_s']} s, {r['relay_cpu_pct']}%, " \
        f"{number(r['relay_rss_mb'])} MB"


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
    ("relays: CPU per regroup, CPU, RSS", "---", relays),
    ("api p50 / p99 (ms)", "---:",
     lambda r: f"{r['api_p50_ms']} / {r['api_p99_ms']}" if "api_p50_ms" in r else ""),
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


def grouped(recs, key):
    """Records by key(record), in the order each key first appears."""
    out = {}
    for r in recs:
        out.setdefault(key(r), []).append(r)
    return out


def median(values):
    v = sorted(float(x) for x in values)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def spread(values, digits):
    """Each run's value, then the median in bold where there are several."""
    runs = ", ".join(number(v, digits) for v in values)
    return runs if len(values) < 2 else f"{runs} (**{number(median(values), digits)}**)"


def link_bits_per_s(lines):
    """The lab's link rate from a script's `# run N of M, links RATE` line."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for line in lines:
        m = re.match(r"# run .*links (\d+(?:\.\d+)?)([kmg]bit)", line)
        if m:
            return m.group(1) + m.group(2), float(m.group(1)) * units[m.group(2)]
    sys.exit("bench_table.py: no `# run ... links RATE` line")


def torch_allreduces(lines):
    """pytorch_step.py --mode allreduce's records, by --comm-hook."""
    return grouped([r for r in records(lines, "pytorch") if "comm_hook" in r],
                   lambda r: r["comm_hook"])


def hook_name(hook):
    return "float32" if hook == "none" else f"with the casts of DDP's {hook} hook"


def lab_allreduce(lines):
    """tests/bench/lab_allreduce_compare.sh (and muster-bench allreduce
    --collective allgather|reducescatter in the same lab): muster's
    hierarchy against torch's Gloo ring, each against the bound its bytes
    over the link set."""
    rate, bps = link_bits_per_s(lines)
    named = {"allreduce": "all-reduce", "allgather": "all-gather",
             "reducescatter": "reduce-scatter"}
    muster = grouped([dict(r, collective=c) for c in named for r in records(lines, c)
                      if r.get("backend") == "hier"], lambda r: (r["collective"], r["compression"]))
    torch = torch_allreduces(lines)
    # (name, records, how its bytes cross a link, whether 16-bit on the wire)
    sides = [(f"muster hier {named[c]}, {'float32' if z == 'none' else z + ' on the wire'}",
              rs, c, z != "none") for (c, z), rs in muster.items()]
    sides += [(f"torch Gloo all-reduce, {hook_name(h)}", rs, "ring", h != "none")
              for h, rs in torch.items()]
    reference = median(r["median_s"] for r in torch["none"]) if "none" in torch else None
    rows = [f"| 64 MiB, 2 × 2, links {rate} | seconds, each run (median) | link bound (s) | "
            "bound / median | torch Gloo's float32 all-reduce / median |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for name, rs, how, half in sides:
        world, nbytes = int(rs[0]["world"]), int(rs[0]["bytes"])
        wire = 0.5 if half else 1.0
        # The hierarchy moves a node's bytes across its link once each way
        # for an all-reduce, half of them for an all-gather or a
        # reduce-scatter (by columns); a flat ring of W moves 2(W-1)/W of
        # them through every rank's link.
        share = {"ring": 2 * (world - 1) / world, "allreduce": 1.0}.get(how, 0.5)
        bound = nbytes * 8 / bps * wire * share
        m = median(r["median_s"] for r in rs)
        against = f"{reference / m:.2f}×" if reference and how in ("ring", "allreduce") else ""
        rows.append(f"| {name} | {spread([r['median_s'] for r in rs], 3)} | {bound:.3f} | "
                    f"{bound / m:.2f} | {against} |")
    return rows


def lab_train(lines):
    """tests/bench/lab_train_compare.sh: step medians of each side, per run."""
    rate, _ = link_bits_per_s(lines)
    by = grouped(records(lines, "lab-train"), lambda r: (r["compression"], r["side"]))
    rows = [f"| gradients on the wire, links {rate} | muster step p50, ms (median) | "
            "DDP step p50, ms (median) | DDP / muster |", "| --- | ---: | ---: | ---: |"]
    for compression in dict.fromkeys(c for c, _ in by):
        m = [r["step_ms_p50"] for r in by.get((compression, "muster"), [])]
        d = [r["step_ms_p50"] for r in by.get((compression, "ddp"), [])]
        name = "float32" if compression == "none" else f"{compression} (DDP: its {compression} hook)"
        ratio = f"{median(d) / median(m):.2f}×" if m and d else ""
        rows.append(f"| {name} | {spread(m, 0)} | {spread(d, 0)} | {ratio} |")
    return rows


def compression(lines):
    """Busbw of a 64 MiB all-reduce with each wire type, both sides, and
    the CNN's accuracy after an epoch with each."""
    muster = grouped(records(lines, "allreduce"), lambda r: r["compression"])
    torch = torch_allreduces(lines)
    trained = {r["gradient_compression"]: r for r in records(lines, "train")
               if r.get("overlap") == "buckets"}
    cols = [("muster " + c, muster[c], trained.get(c)) for c in muster]
    cols += [("PyTorch Gloo " + hook_name(h), torch[h], None) for h in torch]
    busbw = [spread([r["busbw_GBps"] for r in rs], 2) for _, rs, _ in cols]
    accuracy = [f"{100 * float(t['test_accuracy']):.2f}%" if t else "" for _, _, t in cols]
    steps = next((t["steps"] for _, _, t in cols if t and "steps" in t), "")
    first = next(iter(muster.values()))[0]
    return ["| figure | " + " | ".join(c[0] for c in cols) + " |",
            "| --- |" + " ---: |" * len(cols),
            f"| all-reduce of {size(first['bytes'])}, busbw GB/s (world {first['world']}, "
            f"{first['nodes']} nodes) | " + " | ".join(busbw) + " |",
            f"| CNN, test accuracy after {steps} steps of 4 × 64 (an epoch) | " +
            " | ".join(accuracy) + " |"]


def cpu_compare(lines):
    """tests/bench/cpu_train_compare.sh: each placement's runs, the median
    speed-up in bold."""
    rows = ["| model | placement | compression | muster step p50, ms | PyTorch DDP step p50, ms "
            "| speed-up |", "| --- | --- | --- | ---: | ---: | ---: |"]
    by = grouped(records(lines, "train"),
                 lambda r: (r["model"], r["nodes"], r["per_node"], r["compression"]))
    for (model, nodes, per_node, comp), rs in by.items():
        how = ("shared memory" if nodes == "1" else
               "Gloo over loopback" if per_node == "1" else "hier")
        place = f"{nodes} node{'s' if nodes != '1' else ''} × {per_node} ({how})"
        rows.append(f"| {model.upper()} | {place} | {comp} | "
                    f"{', '.join(number(r['muster_step_ms'], 1) for r in rs)} | "
                    f"{', '.join(number(r['pytorch_step_ms'], 1) for r in rs)} | "
                    f"{spread([r['speedup'] for r in rs], 2)} |")
    return rows


def train_runs(key, heading):
    """muster-bench train's runs grouped by one setting: steps/s of each
    run, and the share of all-reduce hidden behind backward."""
    def table(lines):
        rows = [f"| world | {heading} | steps_per_s, each run (median) | "
                "comm hidden behind backward |", "| ---: | --- | ---: | ---: |"]
        by = grouped(records(lines, "train"), lambda r: (r["world"], r["nodes"], r[key]))
        for (world, nodes, value), rs in by.items():
            place = f"{world} ({nodes} × {int(world) // int(nodes)})" if world != "1" else "1"
            hidden = ", ".join(f"{float(r['comm_overlap_pct']):.0f}%" for r in rs) \
                if world != "1" else ""
            rows.append(f"| {place} | {value} | {spread([r['steps_per_s'] for r in rs], 2)} | "
                        f"{hidden} |")
        return rows
    return table


def ettr(lines):
    rows = ["| run | failures | ETTR | full world | steps committed | lost steps |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in records(lines, "ettr"):
        rows.append(f"| MTBF {r['mtbf_s']} s, {r['minutes']} min, {r['world']} + {r['spares']} "
                    f"spare | {r['failures']} | {r['ettr']} | {r['world_full_pct']}% | "
                    f"{r['steps_committed_pct']}% | {r['lost_steps']} |")
    alarms = records(lines, "false_alarms")
    if alarms:
        rows += ["", "| failure-free run, the default limits | steps | checkpoints | members "
                 "failed | fenced | broken | regroups |", "| --- |" + " ---: |" * 6]
    for r in alarms:
        rows.append(f"| {r['minutes']} min, {r['world']} + {r['spares']} spare | "
                    f"{number(r['steps'])} | {r['checkpoints']} | {r['failed']} | {r['fenced']} | "
                    f"{r['broken']} | {r['regroups']} |")
    return rows


def lm(lines):
    losses = [r for r in records(lines, "lm") if "step" in r]
    summary = next(r for r in records(lines, "lm") if "max_rel_loss" in r)
    last = losses[-1]
    fp32, bf16 = float(summary["fp32_samples_per_s"]), float(summary["bf16_samples_per_s"])
    rows = ["| figure | value |", "| --- | ---: |",
            f"| bf16 loss against fp32, largest relative difference over steps "
            f"{losses[0]['step']}–{last['step']} | {100 * float(summary['max_rel_loss']):.2f}% "
            f"(step {last['step']}: {last['bf16_loss']} against {last['fp32_loss']}) |",
            f"| samples/s, fp32 | {number(fp32)} |",
            f"| samples/s, bf16 autocast | {number(bf16)} ({bf16 / fp32:.2f}×) |"]
    for r in records(lines, "one_process"):
        if r["test"].rsplit("/", 1)[-1] == "lm":
            rows.append(f"| 4 ranks against one process on the global batch, dropout 0, 30 "
                        f"steps: largest parameter difference over the largest magnitude | "
                        f"{float(r['max_abs_diff']) / float(r['largest_magnitude']):.1e} |")
    return rows


def loader(lines):
    by = grouped(records(lines, "loader"), lambda r: int(r["workers"]))
    workers = sorted(by)
    rows = ["| samples/s | " + " | ".join(f"workers {w}" for w in workers) + " | " +
            " | ".join(f"gain at {w}" for w in workers if w) + " |",
            "| --- |" + " ---: |" * (2 * len(workers) - 1)]
    for side, key in (("muster::DataLoader", "muster_samples_per_s"),
                      ("PyTorch DataLoader, DDP", "pytorch_samples_per_s")):
        rate = {w: median(r[key] for r in by[w]) for w in workers}
        rows.append(f"| {side} | " + " | ".join(number(rate[w]) for w in workers) + " | " +
                    " | ".join(f"{rate[w] / rate[0]:.2f}×" for w in workers if w) + " |")
    return rows


def syncbn(lines):
    rows = ["| figure | largest difference | tolerance |", "| --- | ---: | ---: |"]
    for r in records(lines, "syncbn"):
        for what, key in (("output", "output_max_diff"), ("input gradient", "input_grad_max_diff")):
            rows.append(f"| {r['ranks']} ranks against one process, {what} | "
                        f"{float(r[key]):.1e} | {float(r['tolerance']):.0e} |")
    names = {"gan_sync_bn": "`gan --sync-bn 1`, 2 × 2 against one process on the whole batch",
             "gan": "`gan` (BatchNorm), 2 × 2 against one process in ghost batches of 16"}
    for r in records(lines, "one_process"):
        name = names.get(r["test"].rsplit("/", 1)[-1])
        if name:
            rows.append(f"| {name}, 10 Adam steps, parameters | "
                        f"{float(r['max_abs_diff']):.1e} | {float(r['tolerance']):.0e} |")
    return rows


def sharding_changes(lines):
    """tests/bench/sharded_*_compare.sh under `change NAME` lines: each
    trainer's peak RSS and checksum; then the memory cap test's lines."""
    rows = ["| world change (51M MLP, AdamW, 2 × 2) | peak RSS of the three that stay (MB) | "
            "the one that left or died; the newcomer (MB) | one parameter checksum |",
            "| --- | ---: | ---: | --- |"]
    changes = []
    for line in lines:
        if line.startswith("change "):
            changes.append((line[len("change "):], {}))
        m = re.match(r"(\w+): (\d+) MB peak; (.*)", line)
        if m and changes:
            changes[-1][1][m.group(1)] = (int(m.group(2)), m.group(3))
    for name, peaks in changes:
        stay = [peaks[t][0] for t in ("t00", "t01", "t10") if t in peaks]
        other = [f"{peaks[t][0]:,}" for t in ("t11", "t11b", "spare") if t in peaks]
        sums = {v for t, (_, v) in peaks.items() if "checksum" in v and t != "t11"}
        rows.append(f"| {name} | {' / '.join(f'{p:,}' for p in stay)} | {'; '.join(other)} | "
                    f"{'yes' if len(sums) == 1 else 'NO'} |")
    for line in lines:
        m = re.match(r"sharded under (\d+) MB: peaks (.*) MB; (.*)", line)
        if m:
            peaks = [int(v) for v in re.findall(r"=(\d+)", m.group(2))]
            rows.append(f"| under a {number(m.group(1))} MB cap per trainer: a kill, its join, a "
                        f"hot spare, a leave, a stop as three ({m.group(3)}) | "
                        f"{min(peaks):,}–{max(peaks):,} (every trainer) | | yes |")
        m = re.match(r"unsharded under (\d+) MB: (.+?) OOM-killed \(peaks (.*) MB\)", line)
        if m:
            rows.append(f"| the same job unsharded under that cap | {m.group(3)} | | "
                        f"{m.group(2)} OOM-killed |")
    return rows


def suite(lines):
    """A log of `./deploy/dev test`: each phase's seconds, the suite's test
    count and its longest tests; then, where a log of `./deploy/dev test
    --quick` follows it, the quick tier's tests and seconds."""
    start = next((i + 1 for i, l in enumerate(lines) if "test: all passed in" in l),
                 next((i for i, l in enumerate(lines) if "test --quick:" in l), len(lines)))
    lines, quick = lines[:start], lines[start:]
    took = [re.search(r"dev:\S* (.+) took (\d+) s", l) for l in lines]
    took = [(m.group(1), int(m.group(2))) for m in took if m]
    counts = [re.search(r"out of (\d+)", l) for l in lines if "tests passed" in l]
    counts = [m.group(1) for m in counts if m]
    longest = sorted(((float(m.group(2)), m.group(1)) for m in
                      (re.search(r"Test +#\d+: (\S+) \.+ +Passed +([\d.]+) sec", l)
                       for l in lines) if m), reverse=True)[:4]
    total = next((int(m.group(1)) for m in (re.search(r"test: all passed in (\d+) s", l)
                                             for l in lines) if m), sum(s for _, s in took))
    rows = ["| figure | value |", "| --- | --- |",
            f"| the whole run, every test passed | {total / 60:.1f} min ({number(total)} s) |"]
    rows += [f"| {name} | {number(seconds)} s |" for name, seconds in took]
    if counts:
        rows.append(f"| tests in the suite; Debian's `libtorch` tests | {'; '.join(counts)} |")
    rows.append("| the suite's longest tests | " +
                ", ".join(f"`{n}` {s:.0f} s" for s, n in longest) + " |")
    passed = [m for m in (re.search(r"test --quick: all passed in (\d+) s", l) for l in quick) if m]
    if passed:
        tests = sum(int(m.group(1)) for m in (re.search(r"out of (\d+)", l) for l in quick
                                              if "tests passed" in l) if m)
        rows.append(f"| `./deploy/dev test --quick` with a warm build | {tests} tests, "
                    f"{passed[0].group(1)} s |")
    return rows


def caption(root, lines):
    """Today, this commit and this machine; for a log of `./deploy/dev
    test`, the commit and the date it names."""
    logged = next((m for m in (re.search(r"test: commit (\S+) on (\S+)", l) for l in lines) if m),
                  None)
    if logged:
        commit, date = logged.groups()
    else:
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
              "sharding": sharding, "sharding-reduce-scatter": sharding,
              "sharding-changes": sharding_changes,
              "lab-allreduce": lab_allreduce, "lab-train": lab_train,
              "compression": compression, "cpu-compare": cpu_compare,
              "buffers": train_runs("broadcast_buffers", "broadcast_buffers"),
              "backward-calls": train_runs("backward_calls", "backward calls"),
              "ettr": ettr, "lm": lm, "loader": loader, "syncbn": syncbn, "suite": suite}
    lines = open(output).read().splitlines()
    rows = tables[kind](lines)
    if len(rows) <= 2:
        sys.exit(f"bench_table.py: no {kind} figures in {output}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(doc)))
    begin, end = f"<!-- {kind}:begin -->", f"<!-- {kind}:end -->"
    text = open(doc).read()
    if begin not in text or end not in text:
        sys.exit(f"bench_table.py: {doc} has no {begin} ... {end}")
    block = "\n".join([begin, caption(root, lines), ""] + rows + [end])
    text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda m: block, text, flags=re.S)
    open(doc, "w").write(text)


if __name__ == "__main__":
    main()
