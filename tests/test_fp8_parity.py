"""Block-FP8 params against HF transformers: an FP8 model's logits (the reference ops
dequantising on the fly) match an HF float32 model built from the dequantised weights, over
prefills and decodes, on tiny configs with q_lora and noaux_tc routing."""

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_helpers import Runner, assert_logits_close, hf_last_logits, hf_model, save  # noqa: E402

from mla_func.checkpoint import load_hf, save_hf  # noqa: E402
from mla_func.quantize import dequantize, quantize_fp8  # noqa: E402

CASES = {
    "v2-group-qlora": dict(version=2, q_lora_rank=12, topk_method="group_limited_greedy",
                           n_group=2, topk_group=1, norm_topk_prob=True,
                           routed_scaling_factor=1.5),
    "v3-noaux-qlora": dict(version=3, q_lora_rank=12, n_group=4, topk_group=2,
                           norm_topk_prob=True, routed_scaling_factor=2.5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fp8_logits_match_hf_on_dequantized_weights(name, tmp_path):
    from transformers import AutoModelForCausalLM

    _, params = load_hf(save(hf_model(**CASES[name]), tmp_path / "hf"))
    cfg = params.cfg
    fp8 = quantize_fp8(params, block=16)  # blocks cut by heads and q rows: refined grids
    save_hf(cfg, dequantize(fp8), tmp_path / "dequantized")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "dequantized",
                                              attn_implementation="eager").eval()
    runner = Runner(fp8, page_size=4)
    gen = torch.Generator().manual_seed(1)
    seqs = {s: torch.randint(2, cfg.vocab_size, (n,), generator=gen).tolist()
            for s, n in ((0, 5), (1, 9))}
    work = [(s, list(t)) for s, t in seqs.items()]
    for step in range(3):
        ours = runner.step(work)
        work = []
        for s, logits in ours.items():
            ref = hf_last_logits(hf, seqs[s])
            assert_logits_close(logits, ref, f"{name} step {step} seq {s}")
            seqs[s].append(int(ref.argmax()))
            work.append((s, [seqs[s][-1]]))
