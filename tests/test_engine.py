"""mla_func.engine: continuous batching gives one-prompt-at-a-time results; eos, logits, bad input.

Tiny preset, page_size 4 so sequences span pages. Every run is compared with a reference run of
each prompt alone (a fresh engine, default chunk budget: a 70-token prompt takes the MHA form
there and the absorbed form when chunked)."""

import pytest
import torch

import mla_func as mf
from mla_func import engine as eng
from mla_func import generation as gen
from mla_func.dims import TOKENS_MAX_CAPTURED

NEW = 5
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 23)), [3], list(range(30, 100))]


@pytest.fixture(scope="module")
def model():
    cfg = mf.MLAConfig.preset("tiny")
    return cfg, mf.init_params(cfg, seed=0)


@pytest.fixture(scope="module")
def reference(model):
    cfg, params = model
    outs = [mf.generate(cfg, params, [p], NEW, return_logits=True, page_size=4,
                        eos_token_id=None) for p in PROMPTS]
    return [o.tokens[0] for o in outs], [o.logits[0] for o in outs]


@pytest.fixture
def count_steps(monkeypatch):
    calls = []
    real = eng.model.forward

    def counting(params, state, batch):
        calls.append(batch.num_tokens)
        return real(params, state, batch)

    monkeypatch.setattr(eng.model, "forward", counting)
    return calls


def check_same(out, order, reference, n=NEW):
    tokens, logits = reference
    for got, i in enumerate(order):
        assert out.tokens[got] == tokens[i][:n], f"prompt {i}"
        if out.logits is not None:
            torch.testing.assert_close(out.logits[got], logits[i][:n], atol=1e-4, rtol=1e-4)


def test_reference_is_sane(model, reference):
    cfg, _ = model
    tokens, logits = reference
    for toks, lg in zip(tokens, logits, strict=True):
        assert len(toks) == NEW and lg.shape == (NEW, cfg.vocab_size)
        assert lg.dtype == torch.float32
        assert lg.argmax(-1).tolist() == toks
    assert len({tuple(t) for t in tokens}) == len(tokens)  # not a degenerate model


@pytest.mark.parametrize("order,kw", [
    ([0, 1, 2, 3], dict(max_batch_tokens=16, max_seqs=2, page_size=4)),
    ([3, 2, 1, 0], dict(max_batch_tokens=13, max_seqs=3, page_size=8)),
    ([2, 0, 3, 1], dict(max_batch_tokens=512, max_seqs=8, page_size=4)),
])
def test_same_tokens_whatever_the_batch(model, reference, count_steps, order, kw):
    cfg, params = model
    out = mf.generate(cfg, params, [PROMPTS[i] for i in order], NEW, return_logits=True,
                      eos_token_id=None, **kw)
    check_same(out, order, reference)
    assert out.status == ["length"] * 4 and out.errors == [None] * 4
    assert out.steps == len(count_steps) and max(count_steps) <= kw["max_batch_tokens"]
    assert out.output_tokens == 4 * NEW and out.tokens_per_s > 0
    assert out.prompt_tokens == sum(map(len, PROMPTS))


def test_requests_wait_for_pages(model, reference, count_steps):
    cfg, params = model
    # 5 usable pages of 4 tokens; the requests need 3, 5 and 2 pages: no two fit together,
    # and the third waits behind the second (arrival order is kept).
    out = mf.generate(cfg, params, PROMPTS[:3], NEW, return_logits=True, page_size=4,
                      num_pages=6, eos_token_id=None)
    check_same(out, [0, 1, 2], reference)
    assert out.steps == 3 * NEW  # nothing overlapped


def test_default_budget_takes_a_long_prompt_in_one_step(model, count_steps):
    """The default token budget (`engine.MAX_BATCH_TOKENS`) prefills a 1000-token prompt in
    one step: the GPU-bound size of run 117, not 512-token chunks."""
    from mla_func.engine import MAX_BATCH_TOKENS

    cfg, params = model
    prompt = torch.randint(2, cfg.vocab_size, (1000,), generator=torch.Generator().manual_seed(5))
    out = mf.generate(cfg, params, [prompt.tolist()], 2, eos_token_id=None)
    assert MAX_BATCH_TOKENS >= 1000 and count_steps == [1000, 1] and out.steps == 2


def test_eos_stops_and_frees(model, reference):
    cfg, params = model
    tokens, _ = reference
    eos = tokens[0][2]
    engine = eng.Engine(cfg, params, num_pages=16, page_size=4, eos_token_id=eos)
    rids = [engine.submit(p, NEW) for p in PROMPTS[:2]]
    engine.run()
    for rid, toks in zip(rids, tokens[:2], strict=True):
        req = engine.result(rid)
        want = toks[: toks.index(eos) + 1] if eos in toks else toks
        assert req.tokens == want
        assert req.status == ("eos" if eos in toks else "length")
    assert engine.result(rids[0]).status == "eos"
    assert engine.state.allocator.free_pages == 15 and not engine.state.allocator.pages


def test_one_step_in_flight(model, reference):
    """`step` launches a step, then reads the previous one: decodes take their input token
    from the previous step's device argmax, and nothing is scheduled past max_new_tokens."""
    cfg, params = model
    engine = eng.Engine(cfg, params, num_pages=16, page_size=4, eos_token_id=None)
    rids = [engine.submit(p, 3) for p in PROMPTS[:2]]
    assert engine.step() == 0  # the prefill is launched; nothing has been read yet
    assert [engine.result(r).in_flight for r in rids] == [1, 1]
    assert not any(engine.result(r).tokens for r in rids)
    assert [engine.step() for _ in range(3)] == [2, 2, 2]  # the last one launches nothing
    assert not engine.has_work and engine.steps == 3
    tokens, _ = reference
    for rid, want in zip(rids, tokens, strict=False):
        assert engine.result(rid).tokens == want[:3] and engine.result(rid).in_flight == 0


def test_config_eos_and_none(model):
    cfg, params = model
    assert eng.Engine(cfg, params, num_pages=4).eos == cfg.eos_token_ids == (cfg.eos_token_id,)
    assert eng.Engine(cfg, params, num_pages=4, eos_token_id=None).eos == ()
    assert eng.Engine(cfg, params, num_pages=4, eos_token_id=[3, 4]).eos == (3, 4)
    with pytest.raises(ValueError, match="eos_token_id must be"):
        eng.Engine(cfg, params, num_pages=4, eos_token_id=cfg.vocab_size)
    with pytest.raises(ValueError, match="max_graph_tokens must be an int >= 1, got 0"):
        eng.Engine(cfg, params, num_pages=4, max_graph_tokens=0)
    for bad in ("eos", [3, -1], True):  # what the type checks (off outside tests) let through
        with pytest.raises(ValueError, match="eos_token_id must be"):
            eng.eos_ids(bad, cfg)


def test_every_eos_of_a_config_list_stops(model, reference):
    """A config.json eos list [a, b]: a request stops at b too (the first id alone did not)."""
    import dataclasses

    cfg, params = model
    full = reference[0][0]  # PROMPTS[0]'s tokens, eos off
    stop = full[2]
    other = next(t for t in range(2, cfg.vocab_size) if t not in full)
    listed = cfg.with_(eos_token_id=other, extra_eos_token_ids=(stop,))
    params = dataclasses.replace(params, cfg=listed)
    out = mf.generate(listed, params, [PROMPTS[0]], len(full), page_size=4)
    assert full.index(stop) == 2 and out.tokens[0] == full[:3] and out.status[0] == "eos"


@pytest.mark.parametrize("prompt,error,words", [
    ([1, 2, 256], eng.TokenIdError, "256"),
    ([1, -1], eng.TokenIdError, "-1"),
    ([1, 2.0], eng.TokenIdError, r"token ids must be ints; got 2.0 \(float\)"),
    ([True, 2], eng.TokenIdError, r"got True \(bool\)"),
    ([], eng.EmptyPromptError, "empty"),
    (list(range(2, 40)), eng.PromptTooLongError, "cache of 5 pages of 4 .* at most 16"),
])
def test_bad_prompt_raises_before_anything_runs(model, count_steps, prompt, error, words):
    cfg, params = model
    with pytest.raises(error, match=words) as info:
        mf.generate(cfg, params, [[4, 5], prompt], 3, page_size=4, num_pages=5)
    assert isinstance(info.value, ValueError) and "prompt 1" in str(info.value)
    assert count_steps == []


@pytest.mark.parametrize("kw", [dict(max_new_tokens=0), dict(max_new_tokens=-2),
                                dict(max_new_tokens=True),
                                dict(mode="bogus"), dict(max_batch_tokens=0),
                                dict(num_pages=1), dict(on_error="ignore")])
def test_bad_arguments_raise(model, count_steps, kw):
    cfg, params = model
    with pytest.raises(ValueError, match=next(iter(kw))):
        mf.generate(cfg, params, [[4, 5]], **kw)
    assert count_steps == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error")
def test_triton_backend_on_cpu_needs_the_interpreter(model, count_steps, monkeypatch):
    """Without the interpreter, the triton backend fails at construction, naming the fix, not
    inside a step after pages were reserved; unknown names list the lazy backend too."""
    cfg, params = model
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="'triton' cannot run on cpu.*TRITON_INTERPRET=1"):
        mf.generate(cfg, params, [[4, 5]], 2, attention_backend="triton")
    with pytest.raises(ValueError, match=r"backend 'flash'; known: \[.*'triton'"):
        mf.generate(cfg, params, [[4, 5]], 2, attention_backend="flash")
    assert count_steps == []


def test_config_mismatch_names_the_fields(model, count_steps):
    cfg, params = model
    with pytest.raises(ValueError, match="fields that differ: rope_theta"):
        mf.generate(cfg.with_(rope_theta=5.0), params, [[4, 5]], 2)
    assert count_steps == []


def test_prompt_longer_than_positions(model):
    cfg, params = model
    with pytest.raises(eng.PromptTooLongError, match="max_position_embeddings"):
        mf.generate(cfg, params, [[4] * cfg.max_position_embeddings], 2)


def test_recorded_errors_let_the_others_complete(model, reference):
    cfg, params = model
    prompts = [PROMPTS[0], [7, 999], PROMPTS[2], [], list(range(2, 40))]
    out = mf.generate(cfg, params, prompts, 3, return_logits=True, page_size=4, num_pages=8,
                      eos_token_id=None, on_error="record")
    assert out.status == ["length", "error", "length", "error", "error"]
    assert [type(e) for e in out.errors] == [type(None), eng.TokenIdError, type(None),
                                             eng.EmptyPromptError, eng.PromptTooLongError]
    assert out.tokens[1] == out.tokens[3] == out.tokens[4] == []
    assert out.logits[1].shape == (0, cfg.vocab_size)
    tokens, _ = reference
    assert out.tokens[0] == tokens[0][:3] and out.tokens[2] == tokens[2][:3]


def test_engine_submit_rejects_one_and_keeps_serving(model, reference):
    cfg, params = model
    engine = eng.Engine(cfg, params, num_pages=6, page_size=4, eos_token_id=None)
    good = engine.submit(PROMPTS[0], 3)
    engine.step()  # the good request is running when the bad ones arrive
    free = engine.state.allocator.free_pages
    cache = engine.state.cache.clone()
    for bad, err in (([1, 300], eng.TokenIdError), ([], eng.EmptyPromptError),
                     ([2] * 30, eng.PromptTooLongError)):
        with pytest.raises(err):
            engine.submit(bad, 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.submit([2, 3], 0)
    assert engine.state.allocator.free_pages == free
    assert torch.equal(engine.state.cache, cache)
    other = engine.submit(PROMPTS[2], 3)
    engine.run()
    tokens, _ = reference
    assert engine.result(good).tokens == tokens[0][:3]
    assert engine.result(other).tokens == tokens[2][:3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.parametrize("mode", ["piecewise", "full", "full_and_piecewise"])
def test_graph_mode_without_cuda_raises_clearly(model, count_steps, mode):
    cfg, params = model
    from mla_func.capture import CudaRequiredError

    with pytest.raises(CudaRequiredError, match="CUDA is not available") as info:
        mf.generate(cfg, params, [[4, 5]], 2, mode=mode)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)
    assert count_steps == []


def emulated_steps(monkeypatch) -> list:
    """compile_step with emulated graphs (no CUDA: `emulate=True`) and the graph-mode checks
    off; the returned list collects each compiled step, whose `counts` say which paths ran."""
    import mla_func.compile_step as cs

    real, steps = cs.compile_step, []

    def emulated(*args, **kwargs):
        steps.append(real(*args, emulate=True, **kwargs))
        return steps[-1]
    monkeypatch.setattr(cs, "compile_step", emulated)
    monkeypatch.setattr(eng, "check_mode", lambda mode, params: None)
    monkeypatch.setattr(gen, "check_mode", lambda mode, params: None)
    return steps


def test_graph_mode_step_emulated_on_cpu(model, reference, monkeypatch):
    """The engine's batches through compile_step's capture/dispatch machinery (emulated),
    mixed prefill+decode steps and pure decodes, against the reference; both graph paths ran
    and no step fell back to eager."""
    steps = emulated_steps(monkeypatch)
    cfg, params = model
    out = mf.generate(cfg, params, PROMPTS[:3], 4, mode="full_and_piecewise",
                      return_logits=True, page_size=4, max_batch_tokens=16, max_seqs=4,
                      eos_token_id=None, progress=False)
    check_same(out, [0, 1, 2], reference, n=4)
    assert [dict(s.counts) for s in steps] == [{"eager": 0, "piecewise": 2, "full": 3}]


@pytest.mark.parametrize("kw, prompts, counts", [
    (dict(max_seqs=1), [0, 1], {"eager": 0, "piecewise": 2, "full": 6}),
    (dict(max_batch_tokens=2), [0, 1], {"eager": 0, "piecewise": 7, "full": 7}),
    (dict(max_graph_tokens=1), [2], {"eager": 0, "piecewise": 1, "full": 3})])
def test_graph_modes_with_the_smallest_ranges(model, reference, monkeypatch, kw, prompts,
                                              counts):
    """A batch-1 engine, or graphs of 1–2 tokens, in a graph mode (emulated): it builds (the
    tracer had refused ranges this small), its graphs run every step, and it gives the
    reference's tokens."""
    steps = emulated_steps(monkeypatch)
    cfg, params = model
    out = mf.generate(cfg, params, [PROMPTS[i] for i in prompts], 4,
                      mode="full_and_piecewise", page_size=4, eos_token_id=None,
                      progress=False, return_logits=True, **kw)
    check_same(out, prompts, reference, n=4)
    assert [dict(s.counts) for s in steps] == [counts]


def test_graph_range_stops_at_max_graph_tokens(model, reference, monkeypatch):
    """A scheduling budget above the graphs' range (dims.TOKENS_MAX_CAPTURED by default,
    `max_graph_tokens` when given): the graphs stop there, a larger step runs eagerly, and the
    tokens are the reference's (emulated graphs, as above)."""
    import functools

    import mla_func.compile_step as cs

    monkeypatch.setattr(cs, "compile_step", functools.partial(cs.compile_step, emulate=True))
    monkeypatch.setattr(eng, "check_mode", lambda mode, params: None)
    cfg, params = model
    default = eng.Engine(cfg, params, num_pages=800, page_size=4, mode="piecewise",
                         max_batch_tokens=4096, max_seqs=4)
    assert default._step_fn.plan.buckets["piecewise"][-1] == TOKENS_MAX_CAPTURED < 4096
    # A cache of 31 pages x 4 slots holds no step of more than 124 tokens: the graphs stop there.
    small = eng.Engine(cfg, params, num_pages=32, page_size=4, mode="piecewise",
                       max_batch_tokens=4096, max_seqs=4)
    assert small._step_fn.plan.buckets["piecewise"][-1] == 124
    assert small._step_fn.plan.meta["state_bounds"]["slots"] == 124
    engine = eng.Engine(cfg, params, num_pages=32, page_size=4, mode="piecewise",
                        max_batch_tokens=32, max_seqs=4, eos_token_id=None, max_graph_tokens=8)
    step = engine._step_fn
    assert step.plan.buckets["piecewise"][-1] == 8
    rids = [engine.submit(p, 3) for p in PROMPTS[:3]]  # 19 prompt tokens in the first step
    engine.run()
    assert step.counts["eager"] == 1 and step.counts["piecewise"] == 2
    tokens, _ = reference
    for rid, i in zip(rids, range(3), strict=True):
        assert engine.result(rid).tokens == tokens[i][:3]


def test_progress_without_tqdm(model, monkeypatch, capsys):
    cfg, params = model
    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)
    out = mf.generate(cfg, params, [[4, 5]], 2, page_size=4, progress=True)
    assert len(out.tokens[0]) >= 1
    assert "generate (torch attention): " in capsys.readouterr().err  # names the backend


def run_script(argv, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "generate.py"
    spec = importlib.util.spec_from_file_location("generate_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(argv) == 0
    return capsys.readouterr().out


def test_generate_script_preset(capsys):
    out = run_script(["--preset", "tiny", "--prompts", "2", "--prompt-len", "5",
                      "--max-new-tokens", "3", "--page-size", "4", "--no-eos"], capsys)
    assert "preset tiny (random weights): 2 prompts x 5 tokens" in out
    assert "torch attention" in out and "warm-up (first call: kernel compiles)" in out
    assert "output tokens/s, warm (6 tokens, 10 prompt tokens" in out  # the warm-up apart
    assert out.count("[length]: [") == 2 and "more)" not in out


def test_generate_script_says_more_tokens_exist_and_speaks_cli(capsys):
    from scripts.generate import main

    out = run_script(["--prompts", "1", "--prompt-len", "3", "--max-new-tokens", "15",
                      "--page-size", "4", "--no-eos"], capsys)
    assert "[length]: [" in out and "] ... (3 more)" in out  # 12 shown of 15
    assert main(["--mode", "full", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--mode eager" in err and "mode='eager'" not in err


def test_generate_script_checkpoint(model, tmp_path, capsys):
    from mla_func.checkpoint import save_hf

    cfg, params = model
    save_hf(cfg, params, tmp_path)
    out = run_script(["--checkpoint", str(tmp_path), "--prompts", "1", "--prompt-len", "4",
                      "--max-new-tokens", "2", "--no-eos"], capsys)
    assert f"{tmp_path}: 1 prompts x 4 tokens" in out and "(2 tokens, 4 prompt tokens" in out


@pytest.mark.parametrize("args, words", [
    (["--prompts", "0"], "argument --prompts: must be at least 1"),
    (["--mode", "bogus"], "argument --mode: invalid choice"),
    (["--device", "gpu"], "argument --device"),
])
def test_generate_script_rejects_bad_arguments(args, words, capsys):
    from scripts.generate import main

    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2 and words in capsys.readouterr().err


def test_generate_script_reports_input_errors_in_one_line(tmp_path, capsys):
    from scripts.generate import main

    assert main(["--checkpoint", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_tensor_prompts(model, reference):
    cfg, params = model
    out = mf.generate(cfg, params, torch.tensor([PROMPTS[0]]), 2, page_size=4,
                      eos_token_id=None)
    assert out.tokens == [reference[0][0][:2]]
    with pytest.raises(eng.TokenIdError, match="1-D integer"):
        mf.generate(cfg, params, [torch.tensor([1.0, 2.0])], 2)
    assert out.attention_backend == "torch"  # "auto" on the CPU
    # One prompt's ids where a batch goes: said so, not taken id by id.
    with pytest.raises(eng.RequestError, match="one 1-D Tensor of 3 token ids: pass a list"):
        mf.generate(cfg, params, torch.tensor(PROMPTS[0][:3]), 2)


def test_numpy_prompts(model, reference):
    np = pytest.importorskip("numpy")
    cfg, params = model
    for prompts in (np.array([PROMPTS[0]]), [np.array(PROMPTS[0], dtype=np.uint16)]):
        out = mf.generate(cfg, params, prompts, 2, page_size=4, eos_token_id=None)
        assert out.tokens == [reference[0][0][:2]]
    for bad in (np.array([1.0, 2.0]), np.array([[1, 2]])):
        with pytest.raises(eng.TokenIdError, match="prompt array must be 1-D integer"):
            mf.generate(cfg, params, [bad], 2)


def test_empty_prompt_list(model):
    cfg, params = model
    out = mf.generate(cfg, params, [], 3)
    assert out.tokens == [] and out.steps == 0 and out.status == []


@pytest.mark.cuda
@pytest.mark.parametrize("mode,backend", [("eager", "triton"), ("piecewise", "torch"),
                                          ("full_and_piecewise", "triton")])
def test_cuda_modes_match_eager_torch(mode, backend):
    cfg = mf.MLAConfig.preset("tiny")
    params = mf.init_params(cfg, seed=0, device="cuda")
    kw = dict(page_size=4, max_batch_tokens=16, max_seqs=4, eos_token_id=None,
              return_logits=True)
    want = mf.generate(cfg, params, PROMPTS, NEW, attention_backend="torch", **kw)
    got = mf.generate(cfg, params, PROMPTS, NEW, mode=mode, attention_backend=backend, **kw)
    assert got.tokens == want.tokens
    for a, b in zip(got.logits, want.logits, strict=True):
        # The triton backend's float32 dots run as tf32 on the GPU.
        tol = 1e-2 if backend == "triton" else 2e-3
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
