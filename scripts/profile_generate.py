"""Where the host time of `generate` goes (GPU): cProfile over the engine's step loop.

    python -m scripts.profile_generate [--requests 128] [--prompt 512] [--new 64]

Builds the engine (cache, graph capture) outside the profile, then profiles `Engine.run` and
prints the loop's wall time and the functions with the most own time (a CUDA sync inside a
function, such as the argmax's `.tolist()`, shows up as that function's time).
"""

import argparse
import cProfile
import pstats
import time

import torch

import mla_func as mf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    need = -(-(args.prompt + args.new) // args.page_size)
    engine = mf.Engine(cfg, params, num_pages=args.requests * need + 2,
                       mode="full_and_piecewise", attention_backend="triton",
                       page_size=args.page_size, max_batch_tokens=8192,
                       max_seqs=args.requests, eos_token_id=None, progress=False)
    prompts = torch.randint(2, 100000, (args.requests, args.prompt)).tolist()
    for prompt in prompts:
        engine.submit(prompt, args.new)
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    start = time.perf_counter()
    prof.enable()
    engine.run(progress=False)
    prof.disable()
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    print(f"{engine.steps} steps, loop {wall:.2f} s (under cProfile), "
          f"{args.requests * args.new / wall:.0f} output tokens/s")
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
