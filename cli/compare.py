"""`simkit compare`: two models (or two activation caches, or a list of caches) → similarity report."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from simkit.cli.common import (
    DeviceOpt,
    NOpt,
    NoReportOpt,
    SeedOpt,
    TrustOpt,
    command,
    finish,
    load_cli_model,
    split_list,
)
from simkit.errors import SimkitError


class Mode(str, Enum):
    exact = "exact"
    minibatch = "minibatch"


class RsaDistance(str, Enum):
    correlation = "correlation"
    euclidean = "euclidean"
    cosine = "cosine"


class RsaCompare(str, Enum):
    spearman = "spearman"
    pearson = "pearson"
    kendall_tau_a = "kendall_tau_a"


class Reduce(str, Enum):
    auto = "auto"
    flatten = "flatten"
    mean = "mean"
    cls = "cls"
    last = "last"


@command("compare", arg_flags={"metrics": "metric", "paths": "models"}, help=(
    "Compare every chosen layer of model A with every chosen layer of model B.\n\n"
    "MODELS are two model specs (torchvision:resnet18, timm:NAME, hf:DIR, file:PATH, "
    "python:pkg.mod:fn, simkit:cnn1d), two cache directories written by `simkit capture`, or three "
    "or more caches for a model × model study. Writes similarity.csv, result.json and report.html "
    "to --out."))
def compare_command(
    models: Annotated[list[str], typer.Argument(help="Two model specs, or two or more cache dirs.")],
    out: Annotated[Path, typer.Option("--out", help="Run directory to write (created if missing).")],
    data: Annotated[str | None, typer.Option("--data", help="Data spec (needed for models, not caches).")] = None,
    n: NOpt = None,
    layers_a: Annotated[str, typer.Option("--layers-a", help="Layers of A: names, globs, type:Class, blocks.")] = "blocks",
    layers_b: Annotated[str, typer.Option("--layers-b", help="Layers of B: names, globs, type:Class, blocks.")] = "blocks",
    metric: Annotated[list[str] | None, typer.Option(
        "--metric", help="Repeatable, comma lists: linear_cka, unbiased_cka, rbf_cka, mutual_knn, procrustes, "
        "procrustes_angle, cca, svcca, pwcca, shape_metric, rsa, ridge_r2, jaccard_knn. The measures beyond "
        "CKA are always full-data, in either --mode.", show_default="unbiased_cka, linear_cka")] = None,
    mode: Annotated[Mode, typer.Option("--mode", help="exact (the full-data estimate) or minibatch (per-batch HSIC "
        "averaged over batches, Nguyen et al.; linear_cka there is biased by the batch size, unbiased_cka is "
        "not).")] = Mode.minibatch,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Samples per batch.")] = 64,
    reduce: Annotated[Reduce, typer.Option("--reduce", help="How a layer's output becomes a vector per sample: "
        "auto = the mask-aware mean over the tokens of a sequence, flatten for everything else.")] = Reduce.auto,
    null: Annotated[int | None, typer.Option(
        "--null", help="Permutations of B's samples for a null band (0 = none). Default: 10 when every metric is "
        "a minibatch CKA (about 1 % of the run there), else 0.", show_default="10 or 0")] = None,
    rbf_factor: Annotated[float, typer.Option(
        "--rbf-factor", help="rbf_cka bandwidth: this factor times the median pairwise distance.")] = 1.0,
    knn_k: Annotated[int, typer.Option("--knn-k", help="Neighbours per sample for mutual_knn and jaccard_knn.")] = 10,
    shape_alpha: Annotated[float, typer.Option(
        "--shape-alpha", help="shape_metric regularisation in [0, 1]: 0 = CCA, 1 = Procrustes (netrep's alpha).")] = 0.5,
    cca_eps: Annotated[float, typer.Option(
        "--cca-eps", help="Ridge for cca, svcca, pwcca, shape_metric, relative to the mean covariance eigenvalue; "
        "0 = none (NaN when a layer has >= n-1 dimensions).")] = 0.0,
    svcca_keep: Annotated[float, typer.Option(
        "--svcca-keep", help="svcca: keep the top principal components explaining this fraction of variance.")] = 0.99,
    ridge_lambda: Annotated[float, typer.Option(
        "--ridge-lambda", help="ridge_r2 ridge, relative to the mean eigenvalue of A's training covariance "
        "(0 = least squares).")] = 0.01,
    ridge_folds: Annotated[int, typer.Option(
        "--ridge-folds", help="ridge_r2 cross-validation folds (sample i in fold i mod k). ridge_r2 is "
        "directional: rows (A) predict columns (B).")] = 5,
    rsa_distance: Annotated[RsaDistance, typer.Option(
        "--rsa-distance", help="rsa: dissimilarity between two samples' activations.")] = RsaDistance.correlation,
    rsa_compare: Annotated[RsaCompare, typer.Option(
        "--rsa-compare", help="rsa: how two RDMs' upper triangles are compared.")] = RsaCompare.spearman,
    pairing: Annotated[str, typer.Option(
        "--pairing", help="Study of caches: which layers to pair (last, or LAYER_A=LAYER_B).")] = "last",
    output_index: Annotated[str | None, typer.Option(
        "--output-index", help="For tuple/dict outputs: which element to capture (index or key).")] = None,
    weights_a: Annotated[Path | None, typer.Option("--weights-a", help="Local weights file for A.")] = None,
    weights_b: Annotated[Path | None, typer.Option("--weights-b", help="Local weights file for B.")] = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    trust: TrustOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    from simkit.engine import DEFAULT_METRICS, compare, compare_caches, is_cache, study
    from simkit.results import CompareResult, StudyResult

    metrics = split_list(metric) or list(DEFAULT_METRICS)
    caches = [m for m in models if is_cache(m)]
    if caches and len(caches) != len(models):
        raise SimkitError("mix of cache directories and model specs; pass two model specs or only caches")
    if len(models) < 2:
        raise SimkitError(f"compare needs two models (or two or more caches), got {len(models)}")
    common = dict(metrics=metrics, mode=mode.value, batch_size=batch_size, n=n, null=null, seed=seed,
                  rbf_factor=rbf_factor, knn_k=knn_k, device=device, shape_alpha=shape_alpha, cca_eps=cca_eps,
                  svcca_keep=svcca_keep, ridge_lambda=ridge_lambda, ridge_folds=ridge_folds,
                  rsa_distance=rsa_distance.value, rsa_compare=rsa_compare.value, progress=True)
    if caches:
        result: CompareResult | StudyResult
        if len(caches) == 2:
            result = compare_caches(caches[0], caches[1], layers_a=layers_a, layers_b=layers_b, **common)
        else:
            result = study(caches, pairing=pairing, **common)
        finish(result, out, no_report)
        return
    if len(models) != 2:
        raise SimkitError(f"compare takes exactly two model specs, got {len(models)}; a study needs caches "
                          "(write them with `simkit capture`)")
    if data is None:
        raise SimkitError("--data is required when comparing models, e.g. --data synthetic:3x64x64")
    from simkit.data import load_data

    # B is seeded with seed + 1 (README: "A gets seed, B seed + 1"), so `simkit capture --seed 1` of B
    # gives the activations this comparison sees
    seeds = {"model_a": seed, "model_b": seed + 1, "data": seed}
    tokenizers = text_tokenizers(data, models)
    dataset = load_data(data, n=n, seed=seeds["data"], tokenizer=tokenizers[0])
    dataset_b = None if tokenizers[1] == tokenizers[0] else \
        load_data(data, n=n, seed=seeds["data"], tokenizer=tokenizers[1])
    model_a = load_cli_model(models[0], seed=seeds["model_a"], trust=trust, weights=weights_a)
    model_b = load_cli_model(models[1], seed=seeds["model_b"], trust=trust, weights=weights_b)
    index = int(output_index) if output_index is not None and output_index.isdigit() else output_index
    result = compare(model_a, model_b, dataset, layers_a=layers_a, layers_b=layers_b, reduce=reduce.value,
                     output_index=index, names=(models[0], models[1]), data_name=data, seeds=seeds,
                     data_b=dataset_b, **common)
    finish(result, out, no_report)


def text_tokenizers(data: str, models: list[str]) -> tuple[str | None, str | None]:
    """Which tokenizer reads ``text:FILE`` data for each model: its own for an ``hf:`` model, the other
    model's for one that is not (None when neither is, or when the spec names ``tokenizer=``)."""
    if not data.startswith("text:") or "tokenizer=" in data:
        return None, None
    own = [spec if spec.startswith("hf:") else None for spec in models]
    return own[0] or own[1], own[1] or own[0]
