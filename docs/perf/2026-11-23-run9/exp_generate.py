"""Where a decode step of `generate` loses time against its graph replay (GPU).

128 requests x (512 prompt + 256 new), `full_and_piecewise`, one engine: a first round warms up
(Triton compiles, graph capture at construction), a second one is measured:
- wall time per `Engine.step()` call, and per step in the decode phase;
- CUDA synchronisations, reported by torch's sync debug mode (the line that syncs);
- a torch.profiler window of DECODE_WINDOW decode steps: the GPU's busy share of the window
  (union of kernel and copy intervals) and the CPU ops with the most own time.

Run from the repository root: PYTHONPATH=. python3 docs/perf/2026-11-23-run9/exp_generate.py
"""

import statistics
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

import mla_func as mf

REQUESTS, PROMPT, NEW, PAGE = 128, 512, 256, 64
DECODE_WINDOW = (150, 160)  # step indices (of the measured round) profiled


def busy_share(prof) -> tuple[float, float]:
    """(GPU busy us, window us) from the profiler's device events."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    if not spans:
        return 0.0, 0.0
    busy, cur_s, cur_e = 0.0, *spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    return busy, spans[-1][1] - spans[0][0]


def main() -> None:
    cfg = mf.MLAConfig.preset("v2-lite")
    params = mf.init_params(cfg, seed=0, device="cuda", dtype=torch.bfloat16)
    need = -(-(PROMPT + NEW) // PAGE)
    t0 = time.perf_counter()
    engine = mf.Engine(cfg, params, num_pages=REQUESTS * need + 2, mode="full_and_piecewise",
                       attention_backend="triton", page_size=PAGE, max_batch_tokens=8192,
                       max_seqs=REQUESTS, eos_token_id=None, progress=False)
    print(f"# {torch.cuda.get_device_name()}: engine built in {time.perf_counter() - t0:.1f} s",
          flush=True)
    for rnd in ("warm-up", "measured"):
        for prompt in torch.randint(2, 100000, (REQUESTS, PROMPT)).tolist():
            engine.submit(prompt, NEW)
        times, prof = [], None
        torch.cuda.synchronize()
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if rnd == "measured":
                torch.cuda.set_sync_debug_mode("warn")
            i = 0
            while engine.has_work:
                t = time.perf_counter()
                if rnd == "measured" and i == DECODE_WINDOW[0]:
                    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                    prof.__enter__()
                engine.step()
                if prof is not None and i == DECODE_WINDOW[1] - 1:
                    torch.cuda.synchronize()
                    prof.__exit__(None, None, None)
                times.append(time.perf_counter() - t)
                i += 1
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        print(f"{rnd}: {len(times)} steps, {wall:.2f} s, {REQUESTS * NEW / wall:.0f} output "
              f"tokens/s; step() wall ms: first 10 {[round(x * 1e3, 1) for x in times[:10]]}, "
              f"median of 20-240 {statistics.median(times[20:240]) * 1e3:.2f}", flush=True)
        if rnd == "measured":
            sites = {}
            for w in caught:
                key = f"{w.filename}:{w.lineno}: {str(w.message)[:90]}"
                sites[key] = sites.get(key, 0) + 1
            print("sync sites (count, where):")
            for key, n in sorted(sites.items(), key=lambda kv: -kv[1])[:12]:
                print(f"  {n:5d}  {key}")
            busy, span = busy_share(prof)
            n = DECODE_WINDOW[1] - DECODE_WINDOW[0]
            print(f"profiled {n} decode steps: GPU busy {busy / 1e3:.1f} of {span / 1e3:.1f} ms "
                  f"({100 * busy / max(span, 1):.0f}%), {span / n / 1e3:.2f} ms a step")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18,
                                            max_name_column_width=60))


if __name__ == "__main__":
    main()
