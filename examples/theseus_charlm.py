"""Network of Theseus on text: a small causal transformer LM converted into an RNN (``attention-to-rnn``).

Text available offline: the docstrings of Python's standard library, collected with ``inspect`` (no
download), tokenised by characters (the most frequent characters, the rest mapped to one "unknown"
id). A TinyLlama guide (``simkit:llama``) is trained on it, then each transformer block becomes a GRU
layer with the block's residual, aligned stage by stage, and the RNN is fine-tuned. Reported:
perplexity of the guide, of the converted RNN and of the same RNN trained from scratch (and logit
distillation) with the same budget.

    .venv/bin/python examples/theseus_charlm.py --out runs/theseus_charlm
    .venv/bin/python examples/theseus_charlm.py --sequences 1500 --guide-epochs 2 --steps-per-stage 100 \\
        --finetune-epochs 2 --out /tmp/charlm_quick                                      # reduced
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import time
from collections import Counter
from pathlib import Path

import torch

import simkit
from simkit.data import Dataset
from simkit.models import load_model

MODULES = ("os", "re", "json", "collections", "functools", "itertools", "string", "textwrap", "pathlib",
           "typing", "inspect", "argparse", "logging", "statistics", "fractions", "decimal", "datetime",
           "calendar", "heapq", "bisect", "shutil", "tempfile", "csv", "difflib", "enum", "dataclasses",
           "contextlib", "abc", "random", "math", "unittest", "pprint", "subprocess", "threading", "queue")


def docstrings(modules=MODULES) -> str:
    """Every docstring of the listed standard-library modules and their public members, joined."""
    parts, seen = [], set()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        objects = [module] + [getattr(module, a) for a in sorted(dir(module)) if not a.startswith("_")]
        for obj in objects:
            members = [obj]
            if inspect.isclass(obj):
                members += [m for a, m in sorted(vars(obj).items()) if not a.startswith("_") and callable(m)]
            for m in members:
                doc = inspect.getdoc(m)
                if doc and doc not in seen:
                    seen.add(doc)
                    parts.append(doc)
    return "\n\n".join(parts)


def encode(text: str, vocab_size: int) -> tuple[torch.Tensor, list[str]]:
    """Character ids (len(text),) over the vocab_size − 1 most frequent characters plus an unknown id 0."""
    chars = [c for c, _ in Counter(text).most_common(vocab_size - 1)]
    index = {c: i + 1 for i, c in enumerate(chars)}
    return torch.tensor([index.get(c, 0) for c in text], dtype=torch.long), ["<unk>"] + chars


def windows(ids: torch.Tensor, length: int, count: int, seed: int) -> torch.Tensor:
    """``count`` random windows (count, length) of the id stream."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - length, (count,), generator=g)
    return torch.stack([ids[s:s + length] for s in starts.tolist()])


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/theseus_charlm"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--sequences", type=int, default=6000, help="training windows (test: a quarter as many)")
    p.add_argument("--d", type=int, default=96)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--guide-epochs", type=float, default=10)
    p.add_argument("--steps-per-stage", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--finetune-epochs", type=float, default=8)
    p.add_argument("--metric", default="cka")
    p.add_argument("--schedule", default="progressive")
    p.add_argument("--baselines", default="scratch,kd")
    p.add_argument("--resume", action="store_true")
    return p.parse_args()


def main() -> None:
    args = parse()
    torch.set_flush_denormal(True)  # a script of its own: the whole process may flush
    text = docstrings()
    ids, vocab = encode(text, args.vocab)
    cut = int(len(ids) * 0.9)  # train on the first 90 % of the text, test on the rest
    train = windows(ids[:cut], args.length, args.sequences, args.seed)
    test = windows(ids[cut:], args.length, max(args.sequences // 4, 8), args.seed + 1)
    print(f"{len(text):,} characters of stdlib docstrings, vocabulary {len(vocab)}; "
          f"{len(train)} train / {len(test)} test windows of {args.length}")
    data = Dataset(train, None, "stdlib-docstrings", test=Dataset(test, None, "stdlib-docstrings"),
                   info={"vocab": len(vocab)})
    guide = load_model(f"simkit:llama:vocab={len(vocab)},d={args.d},heads=4,blocks={args.blocks},"
                       f"max_len={args.length}", seed=args.seed)
    started = time.perf_counter()
    settings = simkit.ConvertSettings(
        recipe="attention-to-rnn", schedule=args.schedule.split(","), metric=args.metric.split(","),
        baselines=[b for b in args.baselines.split(",") if b and b != "none"],
        steps_per_stage=args.steps_per_stage, batch_size=args.batch_size, finetune_epochs=args.finetune_epochs,
        finetune_batch_size=args.batch_size, train_guide=args.guide_epochs, seed=args.seed, eval_samples=256)
    result = simkit.convert(guide, data, settings, run_dir=args.out, resume=args.resume)
    simkit.save_run(result, args.out)
    print(result.tables["runs"].T.to_string())
    print(f"wall time {time.perf_counter() - started:.0f} s; report: {args.out / 'report.html'}")


if __name__ == "__main__":
    main()
