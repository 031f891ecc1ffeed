# SPDX-License-Identifier: Apache-2.0
"""What the PyTorch benchmarks (train_table.py, train_compare.py) share: the models they train on
synthetic data, and running one (model, allocator) pair in its own process.

Models (random initialisation, synthetic data, nothing downloaded; batch sizes are each model's
default below unless --batch-image, --batch-gpt2 or --batch-bert say otherwise):
    resnet50      torchvision's ResNet-50, batch 128 of 224x224 images, SGD
    vit_b16       torchvision's ViT-B/16, batch 64 of 224x224 images, AdamW
    gpt2          transformers' GPT-2 small (124M), batch 8 x 1024 tokens, AdamW
    gpt2_varlen   the same with a sequence length drawn per step (64..1024; one fixed sequence
                  for every allocator): shapes that vary from step to step, where allocators
                  fragment
    bert_varlen   transformers' BERT base (110M) masked-LM, batch 32, sequence length drawn per
                  step (64..512, one fixed sequence for every allocator), AdamW
    compiled      a 4-layer transformer encoder (d=1024, batch 32 x 256 tokens) under
                  torch.compile(mode="reduce-overhead"): CUDA graphs replayed from the allocator's
                  graph pools
"""

import argparse
import json
import random
import subprocess
import time

import harness

environment = harness.environment  # train_table and train_compare take it from here

MODELS = ("resnet50", "vit_b16", "gpt2", "gpt2_varlen", "bert_varlen", "compiled")
GiB = float(1 << 30)
# Each model's batch unless an option overrides it: (option's attribute, default).
BATCH = {"resnet50": ("batch_image", 128), "vit_b16": ("batch_image", 64),
         "gpt2": ("batch_gpt2", 8), "gpt2_varlen": ("batch_gpt2", 8),
         "bert_varlen": ("batch_bert", 32)}


def batch_of(name, args):
    """The batch size model `name` trains with: its option's value when given, else its own."""
    attr, default = BATCH[name]
    value = getattr(args, attr, None)
    return value if value else default


def varying_lengths(total, lo, hi, seed=1234):
    """One fixed sequence of lengths in [lo, hi], the same for every allocator."""
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(total)]


def build(name, torch, args, amp=True):
    """The model's step(i) function: one training step (forward, backward, optimizer) on synthetic
    data, under bf16 autocast unless amp is False. args: batch_image, batch_gpt2, batch_bert
    (None: the model's default), warmup, steps."""
    dev = torch.device("cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp)

    def train(model, opt, loss_of):
        def step(i):
            with autocast:
                loss = loss_of(i)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    if name in ("resnet50", "vit_b16"):
        import torchvision
        ctor = torchvision.models.resnet50 if name == "resnet50" else torchvision.models.vit_b_16
        model = ctor(weights=None).to(dev)
        opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if name == "resnet50"
               else torch.optim.AdamW(model.parameters(), lr=1e-4))
        batch = batch_of(name, args)
        x = torch.randn(batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
        loss_fn = torch.nn.CrossEntropyLoss()
        return train(model, opt, lambda i: loss_fn(model(x), y))
    if name in ("gpt2", "gpt2_varlen"):
        import transformers
        config = transformers.GPT2Config()
        model = transformers.GPT2LMHeadModel(config).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        total = args.warmup + args.steps
        if name == "gpt2":
            lengths = [config.n_positions] * total
        else:
            lengths = varying_lengths(total, 64, config.n_positions)
        batch = batch_of(name, args)
        gen = torch.Generator(device=dev)
        gen.manual_seed(0)

        def loss_of(i):
            ids = torch.randint(0, config.vocab_size, (batch, lengths[i]), device=dev,
                                generator=gen)
            return model(input_ids=ids, labels=ids).loss
        return train(model, opt, loss_of)
    if name == "bert_varlen":
        import transformers
        config = transformers.BertConfig()
        model = transformers.BertForMaskedLM(config).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        lengths = varying_lengths(args.warmup + args.steps, 64, config.max_position_embeddings,
                                  seed=4321)
        batch = batch_of(name, args)
        gen = torch.Generator(device=dev)
        gen.manual_seed(0)

        def loss_of(i):
            ids = torch.randint(0, config.vocab_size, (batch, lengths[i]), device=dev,
                                generator=gen)
            return model(input_ids=ids, labels=ids).loss
        return train(model, opt, loss_of)
    if name == "compiled":
        layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, dropout=0.0)
        model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).to(dev)
        compiled = torch.compile(model, mode="reduce-overhead")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(32, 256, 1024, device=dev)

        def loss_of(i):
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(x).float().pow(2).mean()
        return train(model, opt, loss_of)
    raise SystemExit(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")


def add_arguments(ap, models, configs, timeout):
    """The options both benchmarks take: --models, --configs (defaults: these), --steps,
    --warmup, the batch sizes (batch_options() passes them on), --timeout, and the hidden
    --worker MODEL CONFIG."""
    ap.add_argument("--models", default=",".join(models))
    ap.add_argument("--configs", default=",".join(configs))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-image", type=int, help="resnet50 and vit_b16 (default 128 and 64)")
    ap.add_argument("--batch-gpt2", type=int, help="gpt2, gpt2_varlen (default 8)")
    ap.add_argument("--batch-bert", type=int, help="bert_varlen (default 32)")
    ap.add_argument("--timeout", type=int, default=timeout, help="seconds per process")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)


def batch_options(args):
    """The batch options given on this command line, to pass on to a worker."""
    out = []
    for attr in ("batch_image", "batch_gpt2", "batch_bert"):
        if getattr(args, attr, None):
            out += ["--" + attr.replace("_", "-"), str(getattr(args, attr))]
    return out


def selection(ap, args, configs, variant):
    """The --models and --configs lists, each name checked (a config may also be `variant`'s
    prefix, e.g. gpukit:...); ap.error names an unknown one."""
    models = [m for m in args.models.split(",") if m]
    chosen = [c for c in args.configs.split(",") if c]
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: unknown model {m!r} (known: {', '.join(MODELS)})")
    for c in chosen:
        if c not in configs and not c.startswith(variant.split(":")[0] + ":"):
            ap.error(f"--configs: unknown allocator {c!r} (known: {', '.join(configs)}, {variant})")
    return models, chosen


def time_steps(torch, step, warmup, steps, after_step=None, before_timed=None):
    """Runs warmup steps, then times `steps` steps (wall clock between two
    torch.cuda.synchronize() calls, in ms); after_step() runs after each timed step,
    before_timed() once between the warm-up and the first timed step."""
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    if before_timed:
        before_timed()
    times = []
    for i in range(warmup, warmup + steps):
        t0 = time.perf_counter()
        step(i)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        if after_step:
            after_step()
    return times


def report(result):
    """A worker's last word: the line run_worker reads back."""
    print("RESULT " + json.dumps(result), flush=True)


def run_worker(cmd, env, timeout, model, config, tail_lines=8):
    """Runs one worker process (cmd) and returns the dict it reported, or one with "error" (and
    the last lines of its output) when it failed or ran past `timeout` seconds."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": model, "config": config, "error": f"timed out after {timeout} s"}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-tail_lines:]
    return {"model": model, "config": config, "error": f"exit {p.returncode}",
            "stderr_tail": tail, "seconds": time.perf_counter() - t0}


