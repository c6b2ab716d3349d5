"""Tensor parallel (attention by heads, experts spread over ranks, vocabulary shards) against
one device, on the CPU with gloo: the sharding math, sharded loading, the same schedule on
every rank, and the errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from parallel_helpers import rank_group, run_ranks

import mla_func as mf
from mla_func.fp8 import Fp8Weight, dense, dequantize
from mla_func.parallel.comm import COLLECTIVES
from mla_func.parallel.group import ParallelError, TensorParallel
from mla_func.parallel.shard import shard_params
from mla_func.quantize import dequantize as dequantize_fp8
from mla_func.quantize import quantize_fp8

ROOT = Path(__file__).resolve().parents[1]
TINY = mf.MLAConfig.preset("tiny")
CONFIGS = {
    "tiny": TINY,
    "v3-qlora": TINY.with_(model_type="deepseek_v3", topk_method="noaux_tc", n_group=2,
                           topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                           q_lora_rank=24),
}
CONFIGS["v3-qlora-fp8"] = CONFIGS["v3-qlora"]  # its weights in block FP8 (`_params`)


def _params(name: str) -> mf.Params:
    params = mf.init_params(CONFIGS[name], seed=1)
    return quantize_fp8(params) if name.endswith("-fp8") else params


PROMPTS = [[5, 9, 200, 3, 17, 88, 41], [7, 7, 2], list(range(30, 52)), [250, 4]]
NEW = 6
KW = dict(page_size=4, max_batch_tokens=16, max_seqs=3, eos_token_id=None, return_logits=True)


def _generate(rank: int, world: int, out: Path, names: tuple[str, ...]) -> None:
    from mla_func.compile_step import plan_step

    for name in names:
        got = mf.generate(CONFIGS[name], _params(name), PROMPTS, NEW, mesh=rank_group(), **KW)
        torch.save({"tokens": got.tokens, "logits": got.logits}, out / f"{name}_{rank}.pt")
    if rank == 0:  # the capture plan of a shard
        shard = shard_params(mf.init_params(TINY, device="meta"), rank_group())
        plan = plan_step(shard, mf.init_state(TINY, 8, 4, device="meta"), max_tokens=8)
        dims = {k: d.size for k, d in plan.signature.dims.items()}
        torch.save({"meta": plan.meta, "dims": dims}, out / "plan.pt")


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_matches_one_device(tmp_path, world):
    """Greedy tokens on `world` ranks equal one device's exactly (float32, and block-FP8
    weights cut with their scales; a mixed continuous-batching workload: prefill chunks beside
    decodes), every rank the same; the logits differ by the summation order only."""
    names = tuple(CONFIGS)
    run_ranks(world, _generate, tmp_path, tmp_path, names)
    for name in names:
        want = mf.generate(CONFIGS[name], _params(name), PROMPTS, NEW, **KW)
        for rank in range(world):
            got = torch.load(tmp_path / f"{name}_{rank}.pt")
            assert got["tokens"] == want.tokens, (name, rank)
            for a, b in zip(got["logits"], want.logits, strict=True):
                torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
    plan = torch.load(tmp_path / "plan.pt")
    assert plan["meta"]["tensor_parallel"] == {"rank": 0, "ranks": world}
    sizes = plan["dims"]
    assert (sizes["heads"], sizes["local_experts"], sizes["local_vocab"]) == (
        4 // world, 8 // world, 256 // world)
    assert sizes["experts"] == 8  # the router sees every expert
    # Two sums a layer and the embedding's, inside the segments (not split points): the
    # attention's and the MoE's with the residual add and norm, the dense MLP's and the
    # embedding's alone (tiny: 3 layers, the first dense).
    counts = plan["meta"]["collectives"]
    total = {op: sum(c.get(op, 0) for c in counts.values()) for op in COLLECTIVES}
    assert total == {"mla_func::all_reduce": 2, "mla_func::all_reduce_add_norm": 3 + 2}
    assert all(b["ranks"] == world for b in plan["meta"]["kernels"]["piecewise"].values())


FUSED_NEW = 3  # prefill chunks and decodes mixed still; each interpreted step costs seconds


def _fused(rank: int, world: int, out: Path) -> None:
    from mla_func.kernels.plan import KernelOptions

    cfg = CONFIGS["v3-qlora"]
    fused = KernelOptions(fused=True, experts="triton")
    got = mf.generate(cfg, mf.init_params(cfg, seed=1), PROMPTS, FUSED_NEW, mesh=rank_group(),
                      kernels=fused, **KW)
    torch.save({"tokens": got.tokens, "logits": got.logits}, out / f"fused_{rank}.pt")


def test_tensor_parallel_fused_kernels_match_one_device(tmp_path):
    """The Triton kernels (norms, router, the experts of one rank with its slice of the
    shared expert apart) on 2 ranks against one device's, in the interpreter."""
    from mla_func.kernels.plan import KernelOptions

    run_ranks(2, _fused, tmp_path, tmp_path)
    cfg = CONFIGS["v3-qlora"]
    want = mf.generate(cfg, mf.init_params(cfg, seed=1), PROMPTS, FUSED_NEW,
                       kernels=KernelOptions(fused=True, experts="triton"), **KW)
    for rank in range(2):
        got = torch.load(tmp_path / f"fused_{rank}.pt")
        assert got["tokens"] == want.tokens, rank
        for a, b in zip(got["logits"], want.logits, strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


def test_an_nccl_step_group_gets_one_gloo_twin(monkeypatch):
    """The schedule check's CPU group: made once for an NCCL group (engines built again on
    it reuse the one group), one per group, and a gloo group is its own."""
    from mla_func.parallel import schedule

    made = []
    backends = {}

    def new_group(ranks, backend):
        made.append((tuple(ranks), backend))
        backends[id(group := object())] = backend
        return group

    monkeypatch.setattr(schedule.dist, "get_backend", lambda g: backends.get(id(g), "nccl"))
    monkeypatch.setattr(schedule.dist, "get_process_group_ranks", lambda g: [0, 1])
    monkeypatch.setattr(schedule.dist, "new_group", new_group)
    monkeypatch.setattr(schedule, "_CPU_GROUPS", {})
    nccl, other = object(), object()
    twin = schedule.cpu_group(nccl)
    assert schedule.cpu_group(nccl) is twin and made == [((0, 1), "gloo")]
    assert schedule.cpu_group(other) is not twin and len(made) == 2
    assert schedule.cpu_group(twin) is twin and len(made) == 2


def _diverge(rank: int, world: int, out: Path) -> None:
    from mla_func.parallel.schedule import ScheduleError

    prompts = [p[:] for p in PROMPTS]
    if rank == 1:
        prompts[2][3] += 1  # one token differs on one rank
    params = mf.init_params(TINY, seed=1)
    try:
        mf.generate(TINY, params, prompts, 3, mesh=rank_group(), **KW)
    except ScheduleError as err:
        (out / f"raised_{rank}").write_text(str(err))


def test_divergent_schedule_raises_on_every_rank(tmp_path):
    """A rank whose batch differs is caught before the step's collectives: every rank raises
    ScheduleError naming the ranks' digests (no hang: run_ranks' timeout)."""
    run_ranks(2, _diverge, tmp_path, tmp_path, timeout=120)
    for rank in range(2):
        text = (tmp_path / f"raised_{rank}").read_text()
        assert "the ranks scheduled different steps" in text and "rank 1:" in text


def _budget(rank: int, world: int, out: Path) -> None:
    from mla_func.engine import MAX_BATCH_TOKENS

    params = shard_params(mf.init_params(TINY, seed=1), rank_group())
    engine = mf.Engine(TINY, params, num_pages=8, eos_token_id=None)
    given = mf.Engine(TINY, params, num_pages=8, eos_token_id=None, max_batch_tokens=100)
    (out / f"budget_{rank}").write_text(
        f"{engine.max_batch_tokens / MAX_BATCH_TOKENS} {given.max_batch_tokens}")


def test_the_default_step_budget_is_per_rank(tmp_path):
    """Each of N ranks does 1/N of a token's work, so the engine's default budget is
    MAX_BATCH_TOKENS a rank (`engine.default_batch_tokens`); a given budget stays as given."""
    run_ranks(2, _budget, tmp_path, tmp_path, timeout=120)
    assert [(tmp_path / f"budget_{r}").read_text() for r in range(2)] == ["2.0 100"] * 2


def test_shard_params_splits_and_checks():
    cfg = CONFIGS["v3-qlora"]
    params = mf.init_params(cfg, seed=2)
    shards = [shard_params(params, TensorParallel(r, 2)) for r in range(2)]
    a, b = (s.layers[1] for s in shards)
    whole = params.layers[1]
    assert torch.equal(torch.cat((a.attn.w_uk, b.attn.w_uk)), whole.attn.w_uk)
    assert torch.equal(torch.cat((a.attn.o_proj, b.attn.o_proj), 1), whole.attn.o_proj)
    assert torch.equal(torch.cat((a.mlp.gate_up, b.mlp.gate_up)), whole.mlp.gate_up)
    assert torch.equal(a.mlp.router, whole.mlp.router)  # every rank routes every token
    assert torch.equal(torch.cat((a.mlp.shared.down, b.mlp.shared.down), 1),
                       whole.mlp.shared.down)
    assert torch.equal(torch.cat([s.embed for s in shards]), params.embed)
    assert shards[1].tp == TensorParallel(1, 2) and a.attn.q_b_proj.shape[0] == 2
    odd = TINY.with_(n_routed_experts=6)
    # Block FP8: each shard is exactly the shard of the dequantised weights (a cut inside a
    # scale block gets a finer grid); W_UK / W_UV are float (`fp8_params.ABSORBED`).
    fp8 = [shard_params(quantize_fp8(params), TensorParallel(r, 2)) for r in range(2)]
    deq = [shard_params(dequantize_fp8(quantize_fp8(params)), TensorParallel(r, 2))
           for r in range(2)]
    for got, want in zip(fp8, deq, strict=True):
        for x, y in ((got.layers[1].attn, want.layers[1].attn), (got.layers[1].mlp,
                                                                 want.layers[1].mlp)):
            for field in ("w_uk", "w_uv", "o_proj", "q_b_proj", "gate_up", "down"):
                if hasattr(x, field):
                    w = getattr(x, field)
                    assert isinstance(w, Fp8Weight) == (field not in ("w_uk", "w_uv")), field
                    assert torch.equal(dense(w, torch.float32), getattr(y, field)), field
        assert torch.equal(dequantize(got.layers[1].mlp.shared.down),
                           want.layers[1].mlp.shared.down)
    with pytest.raises(ParallelError, match=r"evenly: n_routed_experts = 6 not divisible by 4$"):
        shard_params(mf.init_params(odd, device="meta"), TensorParallel(0, 4))
    with pytest.raises(ParallelError, match="already rank 1's shard of 2"):
        shard_params(shards[1], TensorParallel(0, 2))
    with pytest.raises(ParallelError, match="no process group"):
        mf.forward(shards[0], mf.init_state(cfg, 4, 4),
                   mf.make_batch([mf.SeqWork([3, 4], 0, [1])], 4, 2))


def test_eight_way_shards_tile_the_whole_model():
    """Issue 50's split on the CPU (8 ranks, no process group): every leaf of a V3-shaped tiny
    model (8 heads, 16 experts, q_lora, noaux_tc) is either the same on every rank or cut
    along one axis into 8 shards that concatenate to it; block-FP8 shards (their scales cut
    with them) dequantise to the shards of the dequantised model."""
    from mla_func.params import tensor_leaves

    cfg = CONFIGS["v3-qlora"].with_(num_attention_heads=8, n_routed_experts=16)
    params = mf.init_params(cfg, seed=4)
    whole = dict(tensor_leaves(params))
    shards = [dict(tensor_leaves(shard_params(params, TensorParallel(r, 8)))) for r in range(8)]
    cut = set()
    for name, w in whole.items():
        parts = [s[name] for s in shards]
        if all(x.shape == w.shape for x in parts):
            assert all(torch.equal(x, w) for x in parts), name
            continue
        axes = [d for d in range(w.dim()) if parts[0].shape[d] * 8 == w.shape[d]]
        assert any(torch.equal(torch.cat(parts, d), w) for d in axes), name
        cut.add(name.rsplit(".", 1)[-1])
    assert cut == {"embed", "lm_head", "w_uk", "w_uv", "o_proj", "q_b_proj", "gate_up", "down"}
    q = quantize_fp8(params)
    for rank in range(8):
        got = tensor_leaves(dequantize_fp8(shard_params(q, TensorParallel(rank, 8))))
        want = tensor_leaves(shard_params(dequantize_fp8(q), TensorParallel(rank, 8)))
        assert [n for n, _ in got] == [n for n, _ in want]
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(got, want, strict=True)), rank


@pytest.mark.parametrize("weights", ["bf16", "fp8"])
def test_random_shard_is_the_shard_of_the_whole_draw(weights):
    """`random_shard` (each layer drawn, quantised and cut before the next) gives exactly the
    shard of the whole model's draw (quantised first where FP8)."""
    from mla_func.parallel.shard import random_shard
    from mla_func.params import tensor_leaves

    cfg = CONFIGS["v3-qlora"]
    whole = mf.init_params(cfg, seed=3)
    whole = quantize_fp8(whole) if weights == "fp8" else whole
    for rank in range(2):
        tp = TensorParallel(rank, 2)
        want = tensor_leaves(shard_params(whole, tp))
        got = tensor_leaves(random_shard(cfg, tp, seed=3, weights=weights))
        assert [n for n, _ in got] == [n for n, _ in want]
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(got, want, strict=True))


def test_load_hf_reads_this_ranks_slices(tmp_path):
    """load_hf(mesh=...) on each of 2 ranks equals the slices of the whole parameters."""
    from mla_func.checkpoint import load_hf, save_hf
    from mla_func.params import tensor_leaves

    for name, cfg in CONFIGS.items():
        save_hf(cfg, mf.init_params(cfg, seed=4), tmp_path / name)
        _, whole = load_hf(tmp_path / name)
        for rank in range(2):
            tp = TensorParallel(rank, 2)
            _, mine = load_hf(tmp_path / name, mesh=tp)
            want = dict(tensor_leaves(shard_params(whole, tp)))
            got = dict(tensor_leaves(mine))
            assert got.keys() == want.keys() and mine.tp == tp
            for key, t in got.items():
                assert torch.equal(t, want[key]), (name, rank, key)


def test_torchrun_stops_every_rank_on_one_ranks_error(tmp_path):
    """Under torchrun, a request error on rank 1 alone (its prompt holds an id outside the
    vocabulary) ends the run with that message while rank 0 waits in the step's check."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "tests" / "parallel_helpers.py"), "bad-prompt-on-rank-1"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    assert "prompt 0: token id(s) [999] outside the vocabulary" in proc.stderr + proc.stdout


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         *args], capture_output=True, text=True, timeout=240, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})


def test_scripts_under_torchrun(tmp_path, capsys, monkeypatch):
    """`torchrun --nproc-per-node 2 scripts/generate.py --tp 2` prints once (rank 0) the
    tokens one process prints (here, in this one); `capture.py --tp 2` writes a shard's plan
    once; `--tp 2` without torchrun says how to launch it; `profile_generate --tp 2
    --timeline` prints rank 0's steps by kind once."""
    import scripts.generate as generate

    argv = ["scripts/generate.py", "--preset", "tiny", "--prompts", "3", "--max-new-tokens", "5"]
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert generate.main(argv[1:]) == 0
    one = capsys.readouterr().out
    with pytest.raises(SystemExit) as alone:
        generate.main([*argv[1:], "--tp", "2"])
    assert alone.value.code == 2
    assert "run torchrun --nproc-per-node 2 scripts/generate.py --tp 2" in capsys.readouterr().err
    two = _torchrun(*argv, "--tp", "2")
    assert two.returncode == 0, two.stderr
    prompts = [line for line in two.stdout.splitlines() if line.startswith("  prompt")]
    assert len(prompts) == 3 and prompts == [
        line for line in one.splitlines() if line.startswith("  prompt")]
    assert two.stdout.count("throughput:") == 1 and ", tp 2;" in two.stdout
    cap = _torchrun("scripts/capture.py", "--preset", "tiny", "--tp", "2", "--plan-only",
                    "--out", str(tmp_path / "plan"))
    assert cap.returncode == 0, cap.stderr
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan["tensor_parallel"] == {"rank": 0, "ranks": 2} and cap.stdout.count("plan:") == 1
    prof = _torchrun("-m", "scripts.profile_generate", "--tp", "2", "--preset", "tiny",
                     "--device", "cpu", "--mode", "eager", "--timeline", "--requests", "3",
                     "--prompt", "6", "--new", "3", "--page-size", "4")
    assert prof.returncode == 0, prof.stderr
    table = [line for line in prof.stdout.splitlines() if ", eager" in line]
    assert prof.stdout.count("steps by kind") == 1 and {r.split()[0] for r in table} >= {
        "decode,", "prefill,"}, prof.stdout
