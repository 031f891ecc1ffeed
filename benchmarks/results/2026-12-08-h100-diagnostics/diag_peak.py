"""Where the cost model's peak and the measured peak differ: GPTLike (8 x 256) at fractions 0.0, 0.3."""
import sys, collections
sys.path.insert(0, "bindings/torch/tests")
import torch
import gpukit_torch.checkpoint as ckpt
from test_checkpoint import GPTLike, square_loss, apply_at

def model_ops(costs, schedule, o):
    r = ckpt._planner().simulate_ops(ckpt._stages(costs, o), schedule)
    ops = ckpt._parse(schedule); L = len(costs)
    fb = next(k for k, (kind, _) in enumerate(ops) if kind == "B")
    td, ta = ckpt._outputs_counted_twice(costs, ops)
    grads, rows = 0, []
    for k, (kind, i) in enumerate(ops):
        if k == L: grads += o.head_grad_bytes
        c = costs[i - 1]
        if kind == "B": extra = c.backward_transient_bytes + (c.output_bytes if i == L else 0)
        else:
            extra = c.forward_transient_bytes if kind == "Fe" else c.untaped_transient_bytes
            if L <= k < fb: extra += costs[-1].output_bytes
        rows.append((f"{kind}{i}", o.before_bytes + r["op_peak"][k] - td[k] + extra + grads, r["op_peak"][k], td[k], extra, grads))
        if kind == "B" and o.grads_persist: grads += c.grad_bytes
        if k == L - 1:
            x_last = 0 if costs[-1].saves_output else costs[-1].output_bytes
            rows.append(("head", o.before_bytes + r["after"][k] - ta[k] + x_last + o.head_bytes, r["after"][k], ta[k], x_last + o.head_bytes, grads))
    return rows

M = 1 << 20
torch.manual_seed(0)
model = GPTLike(layers=8, d=256, vocab=1000, seq=256).cuda()
ids = torch.randint(0, 1000, (8, 256), device="cuda")
first = ckpt.apply(model, 1 << 40, (ids,), loss_fn=square_loss)
print("costs:"); [print("  ", c) for c in first.costs]
print("outside:", first.outside)
for fraction in (0.0, 0.3, 0.0):
    p = apply_at(model, (ids,), first, fraction, loss_fn=square_loss)
    print(f"\n== fraction {fraction}: {p}\n schedule {p.schedule}\n outside {p.outside}")
    rows = model_ops(p.costs, p.schedule, p.outside)
    top = max(rows, key=lambda r: r[1])
    for r in rows:
        print(f"   {r[0]:>5} {r[1]/M:8.2f}  sim {r[2]/M:7.2f} twice {r[3]/M:6.2f} extra {r[4]/M:6.2f} grads {r[5]/M:6.2f}{'  <== model peak' if r is top else ''}")
    params = [q for q in model.parameters() if q.requires_grad]
    for step in range(3):
        for q in params: q.grad = None
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        if step == 2: torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
        square_loss(model(ids)).backward(); torch.cuda.synchronize()
        print(f" step {step}: peak {(torch.cuda.max_memory_allocated()-base)/M:.2f} MiB beyond {base/M:.2f}")
    snap = torch.cuda.memory._snapshot(); torch.cuda.memory._record_memory_history(enabled=None)
    ev = [e for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested")]
    live, cur, best, at = {}, 0, -1, None
    for n, e in enumerate(ev):
        if e["action"] == "alloc": live[e["addr"]] = e; cur += e["size"]
        elif e["addr"] in live: cur -= live.pop(e["addr"])["size"]
        if cur > best: best, at, snapshot_live = cur, n, dict(live)
    print(f" measured peak (traced, beyond trace start) {best/M:.2f} MiB at event {at} of {len(ev)}")
    def where(e):
        fr = [f for f in e.get("frames", []) if "python" not in f["filename"] or True]
        fr = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in fr if f["filename"].endswith(".py")][:4]
        return " < ".join(fr)
    g = collections.Counter(); cnt = collections.Counter()
    for e in snapshot_live.values(): g[where(e)] += e["size"]; cnt[where(e)] += 1
    for w, s in g.most_common(14): print(f"   {s/M:8.2f} MiB x{cnt[w]:3d}  {w[:230]}")
    e = ev[at]; print("  peak alloc:", e["size"], where(e)[:300])
