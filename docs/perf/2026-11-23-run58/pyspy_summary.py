"""Summarise a py-spy raw profile (`frame;frame;... count` lines): samples by leaf frame
(self) and by frame anywhere on the stack (inclusive), frames shortened to function+file.
`pyspy_summary.py RAW [TEXT]`: only the stacks with a frame containing TEXT (e.g.
"exp_eager_loop.py:25", the timed loop's call)."""

import collections
import re
import sys


def short(frame: str) -> str:
    frame = re.sub(r"\(/[^)]*/(site-packages|main)/", "(", frame)
    return frame[:110]


def main(path: str, within: str = "") -> None:
    leaf, incl, total = collections.Counter(), collections.Counter(), 0
    for line in open(path):
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or within not in stack:
            continue
        n = int(count)
        frames = [short(f) for f in stack.split(";")]
        total += n
        leaf[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    print(f"# {total} samples")
    print("# by leaf frame (self)")
    for f, n in leaf.most_common(30):
        print(f"{100 * n / total:5.1f}%  {f}")
    print("# by frame anywhere on the stack (inclusive)")
    for f, n in incl.most_common(60):
        print(f"{100 * n / total:5.1f}%  {f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
