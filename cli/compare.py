"""`simkit compare`: two models (or two activation caches, or a list of caches) → similarity report."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simkit.catalog import DEFAULT_METRICS, metric_help
from simkit.cli.common import (
    LIST,
    DataSeedOpt,
    DeviceOpt,
    NOpt,
    NoReportOpt,
    SeedOpt,
    TrustOpt,
    command,
    finish,
    split_list,
)
from simkit.errors import SimkitError

if TYPE_CHECKING:
    from simkit.results import CompareResult, StudyResult


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
        "--metric", metavar="A,B,...", help=f"Repeatable, comma lists: {metric_help()}. The measures beyond CKA are always "
        "full-data, in either --mode.", show_default=",".join(DEFAULT_METRICS))] = None,
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
    ci: Annotated[float | None, typer.Option(
        "--ci", help="Confidence of a bootstrap interval per cell (ci_low, ci_high in similarity.csv), e.g. 0.95; "
        "minibatch CKA: a Poisson bootstrap over batches, nearly free.", show_default="none")] = None,
    ci_resamples: Annotated[int, typer.Option("--ci-resamples", help="Bootstrap replicates behind --ci.")] = 200,
    pairing: Annotated[str, typer.Option(
        "--pairing", help="Study of three or more caches: each cache's layer. last, first, depth[:F] (the layer at "
        "relative depth F of each cache's layers, 0 = first, 1 = last; default 0.5), a name for all, one per cache "
        "(A,B,C), or names of one layer across architectures (LAYER_A=LAYER_B: each cache uses the one it "
        "holds).")] = "last",
    output_index: Annotated[str | None, typer.Option(
        "--output-index", help="For tuple/dict outputs: which element to capture (index or key).")] = None,
    weights_a: Annotated[Path | None, typer.Option("--weights-a", help="Local weights file for A.")] = None,
    weights_b: Annotated[Path | None, typer.Option("--weights-b", help="Local weights file for B.")] = None,
    name_a: Annotated[str | None, typer.Option(
        "--name-a", help="Name of A in the report and summary (default: its spec or the cache's model).",
        show_default=False)] = None,
    name_b: Annotated[str | None, typer.Option(
        "--name-b", help="Name of B in the report and summary (default: its spec or the cache's model).",
        show_default=False)] = None,
    names: Annotated[list[str] | None, typer.Option(
        "--names", metavar=LIST, help="Study of caches: one name per cache, in order (default: the cache "
        "folders' names).", show_default=False)] = None,
    seed: SeedOpt = 0,
    data_seed: DataSeedOpt = 0,
    device: DeviceOpt = "cpu",
    trust: TrustOpt = False,
    no_report: NoReportOpt = False,
) -> None:
    """`simkit compare`: similarity of two models' layers (or of two caches, or a study), into --out."""
    from simkit.engine import CompareSettings, compare, compare_caches, study
    from simkit.engine.loading import classify_sources, load_pair

    settings = CompareSettings(
        metrics=split_list(metric) or DEFAULT_METRICS, mode=mode.value, batch_size=batch_size, n=n, null=null,
        seed=seed, rbf_factor=rbf_factor, knn_k=knn_k, shape_alpha=shape_alpha, cca_eps=cca_eps,
        svcca_keep=svcca_keep, ridge_lambda=ridge_lambda, ridge_folds=ridge_folds,
        rsa_distance=rsa_distance.value, rsa_compare=rsa_compare.value, ci=ci,
        ci_resamples=ci_resamples).validate()
    result: CompareResult | StudyResult
    kind = classify_sources(models)
    pair_names = _pair_names(models, kind, name_a, name_b, names)
    if kind == "caches":
        if len(models) == 2:
            result = compare_caches(models[0], models[1], settings, layers_a=layers_a, layers_b=layers_b,
                                    device=device, names=pair_names)
        else:
            result = study(models, settings, pairing=pairing, device=device, names=split_list(names) or None)
        finish(result, out, no_report)
        return
    if data is None:
        raise SimkitError("--data is required when comparing models, e.g. --data synthetic:3x64x64")
    pair = load_pair(models[0], models[1], data, seed=seed, data_seed=data_seed, n=n, trust=trust,
                     weights_a=weights_a, weights_b=weights_b)
    index = int(output_index) if output_index is not None and output_index.isdigit() else output_index
    result = compare(pair.model_a, pair.model_b, pair.data, settings, layers_a=layers_a, layers_b=layers_b,
                     reduce=reduce.value, device=device, output_index=index,
                     names=pair_names or (models[0], models[1]), data_name=data, data_b=pair.data_b)
    finish(result, out, no_report)


def _pair_names(models: list[str], kind: str, name_a: str | None, name_b: str | None,
                names: list[str] | None) -> tuple[str, str] | None:
    """The names of A and B from --name-a/--name-b (each defaults to what names it without them), or
    None when neither is given; --names belongs to a study and --name-a/--name-b to a pair."""
    study = kind == "caches" and len(models) > 2
    if study and (name_a or name_b):
        raise SimkitError("--name-a and --name-b name the two models of a comparison; name the caches of a "
                          "study with --names NAME,NAME,...")
    if names and not study:
        raise SimkitError("--names names the caches of a study (three or more); name the two models of a "
                          "comparison with --name-a and --name-b")
    if not (name_a or name_b):
        return None
    if kind == "caches":
        from simkit.engine.sources import read_manifest

        defaults = [str(read_manifest(path)["model"]) for path in models]
    else:
        defaults = models
    return name_a or defaults[0], name_b or defaults[1]
