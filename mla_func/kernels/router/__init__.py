"""The fused MoE router: logits, scoring, group mask, top-k and normalisation in one launch.

- `route`: `route_fused` (the custom op) and the split-K kernel.
- `plan`: `launch_config`, token block and hidden split from the static shapes (a cost model).
- `select`: scoring and selection, shared by both kernels.
- `rows`: the form for one to four rows: one program an expert, the last one selects.
"""
