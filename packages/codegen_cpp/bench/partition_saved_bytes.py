"""Saved bytes per model from a train1.py log, fusion_aware_saves on against off (ln21).

Run train1.py with ``KILN_LOG=partition --backends eager,kiln,kiln_ab`` and one of the two kilns
given ``fusion_aware_saves=false``; its stderr lists each training graph's partition, the
switched-on one followed by its ``fusion-aware cut`` line. A model's graphs of one kiln come in
one run, so the runs of lines with and without that line alternate model by model:

    python packages/codegen_cpp/bench/partition_saved_bytes.py LOG roberta,gpt_neox,...
"""

from __future__ import annotations

import re
import sys

_SAVED = re.compile(r"min_cut: saved (\d+) bytes \((\d+) of activations, (\d+) written")
_NOTE = re.compile(r"fusion-aware cut (taken|refused)")


def groups(path: str) -> tuple[list[list[list[int]]], list[list[list[int]]]]:
    """The per-model runs of partitions (saved, activation, written bytes, refused), on and off."""
    entries: list[tuple[list[int], bool]] = []
    with open(path) as f:
        for line in f:
            if m := _SAVED.search(line):
                entries.append(([int(m[1]), int(m[2]), int(m[3]), 0], False))
            elif (n := _NOTE.search(line)) and entries:
                entries[-1][0][3] = int(n[1] == "refused")
                entries[-1] = (entries[-1][0], True)
    runs: list[tuple[bool, list[list[int]]]] = []
    for values, on in entries:
        if runs and runs[-1][0] == on:
            runs[-1][1].append(values)
        else:
            runs.append((on, [values]))
    return [r for o, r in runs if o], [r for o, r in runs if not o]


def main() -> None:
    path, models = sys.argv[1], sys.argv[2].split(",")
    ons, offs = groups(path)
    print(
        f"{'model':12} {'off saved':>11} {'on saved':>11} {'ratio':>6} {'off writes':>11} {'on writes':>10} refused"
    )
    for name, on, off in zip(models, ons, offs, strict=False):
        s_on, s_off = sum(e[0] for e in on), sum(e[0] for e in off)
        w_on, w_off = sum(e[2] for e in on), sum(e[2] for e in off)
        refused = sum(e[3] for e in on)
        print(f"{name:12} {s_off:>11} {s_on:>11} {s_on / s_off:>6.4f} {w_off:>11} {w_on:>10} {refused}")


if __name__ == "__main__":
    main()
