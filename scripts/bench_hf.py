"""HF transformers' DeepseekV2ForCausalLM on the same shapes as `bench_step`'s decode steps:
eager with `grouped_mm` experts on a DynamicCache filled with random latents, and
`torch.compile(mode="reduce-overhead")` on a StaticCache. Skipped with a message when
transformers is absent.
"""

import gc
import time

import torch

import mla_func as mf
from scripts.bench_common import cuda_time_ms


def hf_model(cfg: mf.MLAConfig):
    """(config, model): HF DeepseekV2ForCausalLM with `grouped_mm` experts, random bf16 weights
    on the GPU; None when transformers is absent (the caller skips its comparison)."""
    try:
        from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
    except ImportError as e:
        print(f"HF transformers not available ({e}); skipping the HF comparison")
        return None
    hf_cfg = DeepseekV2Config(**cfg.to_hf_dict(), experts_implementation="grouped_mm")
    torch.manual_seed(0)
    with torch.device("cuda"):
        return hf_cfg, DeepseekV2ForCausalLM(hf_cfg).to(torch.bfloat16).eval()


def bench_hf(cfg: mf.MLAConfig, args) -> list[dict]:
    """HF decode steps (eager) on a DynamicCache filled with random latents."""
    built = hf_model(cfg)
    if built is None:
        return []
    import transformers
    from transformers.cache_utils import DynamicCache

    hf_cfg, model = built
    rows = []
    for bsz in args.batches:
        ctx = args.hf_ctx
        cache = DynamicCache(config=hf_cfg)
        for layer in range(cfg.num_hidden_layers):
            cache.update(
                torch.randn(bsz, 1, ctx, cfg.kv_lora_rank, device="cuda", dtype=torch.bfloat16),
                torch.randn(bsz, 1, ctx, cfg.qk_rope_head_dim, device="cuda",
                            dtype=torch.bfloat16), layer)
        ids = torch.randint(0, cfg.vocab_size, (bsz, 1), device="cuda")
        pos = torch.full((bsz, 1), ctx, device="cuda")

        def step(ids=ids, pos=pos, cache=cache, ctx=ctx):
            with torch.no_grad():
                model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
            cache.crop(ctx)

        ms = cuda_time_ms(step, warmup=2, reps=5)
        rows.append({"batch": bsz, "ctx": ctx, "hf_grouped_mm_ms": ms,
                     "transformers": transformers.__version__})
        print(rows[-1], flush=True)
    model = built = None  # let the HF weights go before our model is built
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def bench_hf_compile(cfg: mf.MLAConfig, args) -> list[dict]:
    """HF with `torch.compile(mode="reduce-overhead")` and a StaticCache, decode steps after
    an eager prefill of `--hf-ctx` random tokens; compile time reported apart."""
    built = hf_model(cfg)
    if built is None:
        return []
    from transformers.cache_utils import StaticCache

    hf_cfg, model = built
    compiled = torch.compile(model, mode="reduce-overhead")
    rows = []
    for bsz in args.hf_compile_batches:
        ctx = args.hf_ctx
        cache = StaticCache(config=hf_cfg, max_cache_len=ctx + 16)
        prompt = torch.randint(0, cfg.vocab_size, (bsz, ctx), device="cuda")
        with torch.no_grad():
            model(input_ids=prompt, past_key_values=cache, use_cache=True,
                  cache_position=torch.arange(ctx, device="cuda"))
        ids = torch.randint(0, cfg.vocab_size, (bsz, 1), device="cuda")
        pos = torch.tensor([ctx], device="cuda")

        def step(ids=ids, pos=pos, cache=cache):
            with torch.no_grad():
                compiled(input_ids=ids, past_key_values=cache, use_cache=True,
                         cache_position=pos)

        t0 = time.perf_counter()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        ms = cuda_time_ms(step, warmup=3, reps=10)
        rows.append({"batch": bsz, "ctx": ctx, "hf_compile_ms": ms, "compile_s": compile_s})
        print(rows[-1], flush=True)
    return rows
