#!/usr/bin/env python3
"""The PyTorch + HuggingFace peer of dsactor's GPU training benchmark.

Times BERT training steps as a PyTorch user runs them on one GPU: HuggingFace transformers'
BertForPreTraining (seq 128, the pre-training shape) or BertForQuestionAnswering (seq 384,
the SQuAD fine-tuning shape), random weights and tokens, bf16 autocast, SDPA attention and
fused AdamW. Prints samples/s, model TFLOP/s and MFU against the bf16 matrix-product peak
measured in the same run, then one JSON line per shape.

usage: bench_torch_bert.py [--model bert-large|bert-base]
                           [--shapes pretrain:128:64,squad:384:32,layer:128:64,layer:384:32]
                           [--steps 10] [--warmup 3]
       bench_torch_bert.py [--model bert-large] --max-batch 384,512
With --max-batch, the largest micro-batch of the SQuAD step (BertForQuestionAnswering, bf16
autocast, fused AdamW with its state allocated) that fits on the GPU at each sequence
length, with gradient checkpointing off and on (HF's gradient_checkpointing_enable): batch
1, 2, 4, ... until out of memory, then bisection; one JSON line per setting (what dsactor
bench gpu-memory prints beside its own).
Needs a CUDA device, torch and transformers (the device machine has both); elsewhere it says
so and exits 3.
"""
import argparse
import json
import sys
import time

MODELS = {
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072),
    "bert-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                       intermediate_size=4096),
}
VOCAB = 30522


def training_flops_per_sample(cfg, seq):
    """Model FLOPs of one training step per sequence (forward + backward = 3 x forward):
    the layers' products (Q, K, V, output: 4 H^2; feed-forward: 2 H I) and attention's two
    products (2 T H per token), plus the MLM decoder over the vocabulary (H V per token),
    each 2 FLOPs per multiply-add. The standard count (as Megatron's paper), without the
    elementwise work."""
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    per_token = layers * (2 * (4 * h * h + 2 * h * i) + 2 * 2 * seq * h) + 2 * h * VOCAB
    return 3 * per_token * seq


def matmul_peak_tflops(torch):
    """bf16 8192^3 products on random data: median of 10 after 3 warm-ups, by CUDA events."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    times.sort()
    return 2 * n ** 3 / times[len(times) // 2] / 1e12


def time_layer(torch, transformers, model_name, seq, batch, steps, warmup, peak):
    """One HuggingFace BertLayer forward + backward under bf16 autocast: the peer of
    `dsactor bench gpu-kernels`' GPU encoder layer at the same shape."""
    from transformers.models.bert import modeling_bert
    cfg = dict(MODELS[model_name], vocab_size=VOCAB, max_position_embeddings=512)
    config = transformers.BertConfig(**cfg)
    config._attn_implementation = "sdpa"
    layer = modeling_bert.BertLayer(config).cuda().train()
    h = cfg["hidden_size"]
    x = torch.randn(batch, seq, h, device="cuda", requires_grad=True)
    dy = torch.randn(batch, seq, h, device="cuda", dtype=torch.bfloat16)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(dy.to(out.dtype))

    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    ms = times[len(times) // 2]
    i = cfg["intermediate_size"]
    flops = 3 * batch * seq * (2 * (4 * h * h + 2 * h * i) + 4 * seq * h)
    tflops = flops / (ms * 1e-3) / 1e12
    return dict(bench="torch-bert-layer", model=model_name, task="layer", seq=seq, batch=batch,
                attention=getattr(config, "_attn_implementation", "unknown"), layer_ms=round(ms, 4),
                model_tflops=round(tflops, 1), mfu=round(tflops / peak, 4),
                bf16_peak_tflops=round(peak, 1), torch=torch.__version__,
                transformers=transformers.__version__)


def time_shape(torch, transformers, model_name, task, seq, batch, steps, warmup, peak):
    cfg = dict(MODELS[model_name], vocab_size=VOCAB, max_position_embeddings=512)
    config = transformers.BertConfig(**cfg)
    cls = transformers.BertForPreTraining if task == "pretrain" else transformers.BertForQuestionAnswering
    try:
        model = cls._from_config(config, attn_implementation="sdpa")
    except (TypeError, ValueError):
        model = cls(config)
    attention = getattr(model.config, "_attn_implementation", "unknown")
    model = model.cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, seq), device="cuda", generator=gen)
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                  token_type_ids=torch.zeros_like(ids))
    if task == "pretrain":
        labels = torch.full_like(ids, -100)
        chosen = torch.rand((batch, seq), device="cuda", generator=gen) < 0.15
        labels[chosen] = ids[chosen]
        inputs.update(labels=labels,
                      next_sentence_label=torch.randint(0, 2, (batch,), device="cuda", generator=gen))
    else:
        inputs.update(start_positions=torch.randint(0, seq, (batch,), device="cuda", generator=gen),
                      end_positions=torch.randint(0, seq, (batch,), device="cuda", generator=gen))

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        loss = step()
    stop.record()
    stop.synchronize()
    seconds = start.elapsed_time(stop) / 1e3 / steps
    samples = batch / seconds
    tflops = training_flops_per_sample(cfg, seq) * samples / 1e12
    result = dict(bench="torch-bert", model=model_name, task=task, seq=seq, batch=batch,
                  attention=attention, step_s=round(seconds, 5), samples_per_s=round(samples, 2),
                  model_tflops=round(tflops, 1), mfu=round(tflops / peak, 4),
                  bf16_peak_tflops=round(peak, 1), loss=round(float(loss.detach()), 4),
                  peak_memory_gib=round(torch.cuda.max_memory_allocated() / 2 ** 30, 2),
                  torch=torch.__version__, transformers=transformers.__version__)
    del model, optimizer
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return result


def squad_step_fits(torch, model, optimizer, seq, batch):
    """One SQuAD training step at this batch: True, or False when CUDA runs out of memory."""
    fits = True
    try:
        ids = torch.randint(1, VOCAB, (batch, seq), device="cuda")
        inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids),
                      start_positions=torch.zeros(batch, dtype=torch.long, device="cuda"),
                      end_positions=torch.zeros(batch, dtype=torch.long, device="cuda"))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**inputs).loss
        loss.backward()
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        fits = False
    optimizer.zero_grad(set_to_none=True)
    inputs = ids = loss = None
    torch.cuda.empty_cache()
    return fits


def max_batches(torch, transformers, model_name, seqs, limit=1024):
    cfg = dict(MODELS[model_name], vocab_size=VOCAB, max_position_embeddings=512)
    for checkpointing in (False, True):
        config = transformers.BertConfig(**cfg)
        try:
            model = transformers.BertForQuestionAnswering._from_config(config, attn_implementation="sdpa")
        except (TypeError, ValueError):
            model = transformers.BertForQuestionAnswering(config)
        model = model.cuda().train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        # One step at batch 1 so the optimizer's state holds its memory, as in training.
        squad_step_fits(torch, model, optimizer, seqs[0], 1)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for seq in seqs:
            ok, bad = 0, limit + 1
            b = 1
            while b <= limit:
                if not squad_step_fits(torch, model, optimizer, seq, b):
                    bad = b
                    break
                ok = b
                b *= 2
            while bad - ok > 1:
                mid = ok + (bad - ok) // 2
                if squad_step_fits(torch, model, optimizer, seq, mid):
                    ok = mid
                else:
                    bad = mid
            print(json.dumps(dict(bench="torch-bert-max-batch", model=model_name, seq=seq,
                                  checkpointing=checkpointing, max_batch=ok,
                                  torch=torch.__version__, transformers=transformers.__version__)), flush=True)
        del model, optimizer
        torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-large", choices=sorted(MODELS))
    parser.add_argument("--shapes", default="pretrain:128:64,squad:384:32,layer:128:64,layer:384:32",
                        help="comma-separated task:seq:batch, task pretrain, squad or layer (one "
                             "encoder layer forward + backward)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-batch", default="",
                        help="comma-separated sequence lengths: the largest SQuAD micro-batch at each, "
                             "checkpointing off and on, instead of timing")
    args = parser.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"bench_torch_bert: PyTorch or transformers missing ({e}); nothing was run", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("bench_torch_bert: no CUDA device; nothing was run", file=sys.stderr)
        return 3
    if args.max_batch:
        try:
            seqs = [int(s) for s in args.max_batch.split(",")]
        except ValueError:
            print(f"bench_torch_bert: --max-batch '{args.max_batch}': expected lengths, comma-separated",
                  file=sys.stderr)
            return 2
        max_batches(torch, transformers, args.model, seqs)
        return 0
    shapes = []
    for item in args.shapes.split(","):
        parts = item.split(":")
        if len(parts) != 3 or parts[0] not in ("pretrain", "squad", "layer"):
            print(f"bench_torch_bert: --shapes entry '{item}': expected task:seq:batch with task "
                  "pretrain, squad or layer", file=sys.stderr)
            return 2
        shapes.append((parts[0], int(parts[1]), int(parts[2])))
    began = time.time()
    peak = matmul_peak_tflops(torch)
    print(f"{torch.cuda.get_device_name()}: bf16 8192^3 matmul {peak:.1f} TFLOP/s (torch {torch.__version__})",
          flush=True)
    for task, seq, batch in shapes:
        if task == "layer":
            r = time_layer(torch, transformers, args.model, seq, batch, args.steps, args.warmup, peak)
            print(f"{args.model} layer fwd+bwd seq {seq} batch {batch}: {r['layer_ms']:.3f} ms, "
                  f"{r['model_tflops']:.1f} TFLOP/s, MFU {100 * r['mfu']:.1f}%", flush=True)
            print(json.dumps(r), flush=True)
            continue
        r = time_shape(torch, transformers, args.model, task, seq, batch, args.steps, args.warmup, peak)
        print(f"{args.model} {task} seq {seq} batch {batch}: {r['samples_per_s']:.1f} samples/s, "
              f"{r['model_tflops']:.1f} TFLOP/s, MFU {100 * r['mfu']:.1f}% ({r['attention']} attention, "
              f"{r['peak_memory_gib']} GiB peak)", flush=True)
        print(json.dumps(r), flush=True)
    print(f"bench_torch_bert: {time.time() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
