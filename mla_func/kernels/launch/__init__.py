"""What every kernel family shares at launch.

- `pdl`: where programmatic dependent launch (sm90+) is available, and its rules.
- `counters`: the last-program arrival and its counters.
- `l2_prefetch`: bulk L2 prefetches issued by kernels launched early, before they wait.
- `runtime`: the `Runtime` a state owns: the counters, side streams and workspaces.
"""
