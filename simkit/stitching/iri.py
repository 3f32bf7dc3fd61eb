"""Identically represented inputs (IRIs, spec §2): for each input x an x′ with a(x′) ≈ a(x).

x′ minimises the relative error r(x′) = ‖a(x′) − a(x)‖ / ‖a(x)‖ (norms over all features of A's
activation at the stitch layer), starting from a seed: another training input (default) or uniform
noise over the data range. Two update rules:

* ``adam`` (the default): Adam on x with learning rate ``lr`` (0.1, in data units), then a clamp to the
  data range; it reaches the tolerance on most inputs within a few dozen steps where
* ``sgd`` (the spec's): x ← clamp(x − step_size · ∇r, lo, hi), step_size 0.5, often stalls far above
  it at deep layers (0.8 % of inputs reached it at the deepest ``cnn2d`` block in 1000 steps).

Some inputs stall in a local minimum whatever the step rule (dead ReLUs, max-pool switches: 5–20 % at
the pooled layers of a small digits CNN). Each sample still above the tolerance after ``steps`` updates
is restarted, up to ``restarts`` times, from a fresh seed (another random training input, or new
noise), and its best iterate over all attempts is kept (3 restarts took the fraction that reached
the tolerance from 82 % to 98 % there).

Bounded search (``radius`` set): every IRI stays in the ball ‖x′ − s‖ ≤ radius (``norm`` linf or l2, data
units) around the training input s it starts from. Each update is followed by the projection onto the
data range and then onto the ball (exact for L∞; for L2 the radial shrink, which keeps a point of the
data range inside it since s is), and rounding that would land a value outside the ball is moved one
ulp towards s. The step is a fraction ``radius_step`` of the radius (Adam's learning rate; for ``sgd``
the steepest-descent step of that length in the ball's norm: sign(∇) for L∞, ∇/‖∇‖ for L2), the same
rule for every front. An IRI still above the tolerance is kept where it is, inside its ball, and counted
as not reached; a restart draws a new seed and optimises inside the ball around that seed.

Samples are optimised in batches; each stops once r ≤ tol (its best iterate is kept and no longer
updated) and the batch stops when all have. Each sample's best iterate over the run is returned with
its exact error. Results are cached as safetensors under a key hashing the model's weights, the
layer, the data and every setting, and partial progress is saved batch by batch for resume.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from simkit.distributed import is_main_process
from simkit.errors import SimkitError
from simkit.io import atomic_write
from simkit.progress import progress_bar
from simkit.seeding import generator as seeded_generator
from simkit.settings.stitch import IRISettings

ALGORITHM = 2  # part of the cache key: bump when the optimisation changes
L2_MARGIN = 1e-12  # an L2 ball's projection aims this fraction inside the radius (float64 rounding of norms)


@dataclass
class IRISet:
    """IRIs of ``n`` inputs: ``iris (n, ...)``, ``rel_error (n,)`` float64 (exact error of each returned
    IRI), ``steps (n,)`` updates until each sample's best iterate, ``seed_index (n,)`` the training input
    each started from (-1 for noise), ``reached (n,)`` bool rel_error ≤ tol. ``radius``/``norm``: the
    ball of a bounded search (None: unbounded); ``distance (n,)`` float64: each IRI's distance from its
    seed in ``norm`` (NaN for noise seeds; None when not computed)."""

    iris: Tensor
    rel_error: Tensor
    steps: Tensor
    seed_index: Tensor
    tol: float
    radius: float | None = None
    norm: str = "linf"
    distance: Tensor | None = None

    @property
    def reached(self) -> Tensor:
        return self.rel_error <= self.tol

    @property
    def search(self) -> str:
        """How the IRIs were searched, for reports: ``unbounded`` or ``linf ≤ 0.1`` (the ball)."""
        return "unbounded" if self.radius is None else f"{self.norm} ≤ {self.radius:g}"

    def summary(self) -> dict[str, float]:
        r = self.rel_error
        out = {"n": len(r), "median": float(r.median()), "mean": float(r.mean()), "max": float(r.max()),
               "reached_fraction": float(self.reached.double().mean()), "mean_steps": float(self.steps.double().mean())}
        return out if self.radius is None else {**out, **self.bounded_summary()}

    def bounded_summary(self) -> dict[str, float]:
        """A bounded search's record: its radius, the fraction of IRIs that reached the tolerance inside
        their ball and the median distance from their seeds (in the ball's norm)."""
        if self.radius is None or self.distance is None:
            raise SimkitError("this IRI set was searched unbounded; pass `radius` to `generate_iris` for a ball")
        inside = self.distance <= self.radius
        return {"radius": float(self.radius), "reached_inside_radius_fraction": float((self.reached & inside).double().mean()),
                "distance_median": float(self.distance.nanmedian())}


def relative_error(front: nn.Module, x: Tensor, target: Tensor) -> Tensor:
    """r = ‖a(x) − target‖ / ‖target‖ per sample: ``x (b, ...)``, ``target (b, ...)`` → ``(b,)``."""
    diff = (front(x) - target).flatten(1).norm(dim=1)
    return diff / target.flatten(1).norm(dim=1).clamp_min(1e-12)


def seed_indices(n: int, generator: torch.Generator) -> Tensor:
    """A random derangement of 0..n-1: sample i starts from training input seed_indices[i] ≠ i."""
    if n < 2:
        raise SimkitError("IRIs seeded from other training inputs need at least 2 inputs; use `iri_seed` noise")
    perm = torch.randperm(n, generator=generator)
    shift = int(torch.randint(1, n, (1,), generator=generator))
    out = torch.empty(n, dtype=torch.long)
    out[perm] = perm.roll(shift)  # a cycle through perm: never a fixed point
    return out


def optimise_batch(front: nn.Module, x: Tensor, start: Tensor, settings: IRISettings,
                   value_range: tuple[float, float]) -> tuple[Tensor, Tensor, Tensor]:
    """IRIs for one batch: ``x (b, ...)`` targets, ``start (b, ...)`` seeds → (iris, rel_error (b,), steps (b,)).
    With ``settings.radius`` every iterate stays in the ball of that radius around its seed."""
    lo, hi = value_range
    device = next((p.device for p in front.parameters()), torch.device("cpu"))
    x, start = x.to(device), start.to(device)
    with torch.no_grad():
        target = front(x)
    radius = settings.radius
    centre = start.detach().clone() if radius is not None else None
    current = start.detach().clone().clamp(lo, hi)
    if centre is not None and radius is not None:
        current = project_to_ball(current, centre, radius, settings.norm)
    current.requires_grad_(True)
    best = current.detach().clone()
    best_err = torch.full((len(x),), float("inf"), dtype=torch.float64, device=device)
    best_step = torch.zeros(len(x), dtype=torch.long, device=device)
    active = torch.ones(len(x), dtype=torch.bool, device=device)
    adam = torch.optim.Adam([current], lr=_step_length(settings)) if settings.optimizer == "adam" else None
    for step in range(settings.steps + 1):
        idx = active.nonzero().squeeze(1)  # only samples still above the tolerance are computed
        err = relative_error(front, current[idx], target[idx])
        with torch.no_grad():
            e64 = err.detach().to(torch.float64)
            better = e64 < best_err[idx]
            chosen = idx[better]
            best[chosen] = current.detach()[chosen]
            best_err[chosen] = e64[better]
            best_step[chosen] = step
            active[idx] = best_err[idx] > settings.tol
        if step == settings.steps or not active.any():
            break
        (grad,) = torch.autograd.grad(err.sum(), current)
        with torch.no_grad():
            _update(current, grad, adam, settings)
            current.clamp_(lo, hi)
            if centre is not None and radius is not None:
                current.copy_(project_to_ball(current, centre, radius, settings.norm))
    return best.cpu(), best_err.cpu(), best_step.cpu()


def _step_length(settings: IRISettings) -> float:
    """Adam's learning rate: ``lr`` unbounded, ``radius_step × radius`` in a ball."""
    return settings.lr if settings.radius is None else settings.radius_step * settings.radius


def _update(current: Tensor, grad: Tensor, adam: torch.optim.Optimizer | None, settings: IRISettings) -> None:
    """One step on ``current (b, ...)`` in place: Adam's, or sgd's (``step_size · ∇`` unbounded; in a ball
    the steepest-descent step of length ``radius_step × radius`` in its norm)."""
    if adam is not None:
        current.grad = grad
        adam.step()
    elif settings.radius is None:
        current -= settings.step_size * grad
    elif settings.norm == "linf":
        current -= settings.radius_step * settings.radius * grad.sign()
    else:
        norms = grad.flatten(1).norm(dim=1).clamp_min(1e-30).view(-1, *[1] * (grad.dim() - 1))
        current -= settings.radius_step * settings.radius * grad / norms


def ball_distance(x: Tensor, centre: Tensor, norm: str) -> Tensor:
    """‖x − centre‖ per sample in ``norm`` (linf or l2), float64: ``x, centre (b, ...)`` → ``(b,)``."""
    diff = (x.double() - centre.double()).flatten(1)
    return diff.abs().amax(dim=1) if norm == "linf" else diff.norm(dim=1)


def project_to_ball(x: Tensor, centre: Tensor, radius: float, norm: str, max_nudges: int = 8) -> Tensor:
    """``x (b, ...)`` projected onto the ball ‖x − centre‖ ≤ radius (per sample; ``norm`` linf: a clamp
    around ``centre``, l2: the radial shrink), computed in float64 and returned in ``x``'s dtype. A sample
    that rounding leaves outside is moved one ulp towards ``centre`` per value until it is inside (at most
    ``max_nudges`` times), so :func:`ball_distance` of the result never exceeds ``radius`` (for L2, the
    projection aims at ``radius × (1 − L2_MARGIN)``, so another float64 sum of squares agrees)."""
    x64, c64 = x.double(), centre.double()
    if norm == "linf":
        out = torch.minimum(torch.maximum(x64, c64 - radius), c64 + radius)
    else:  # a hair inside, so that no way of summing the squares in float64 puts it outside
        radius = radius * (1 - L2_MARGIN)
        diff = (x64 - c64).flatten(1)
        scale = (radius / diff.norm(dim=1).clamp_min(1e-300)).clamp(max=1.0)
        out = c64 + (diff * scale[:, None]).view_as(x64)
    out = out.to(x.dtype)
    centre = centre.to(x.dtype)
    for _ in range(max_nudges):
        outside = ball_distance(out, centre, norm) > radius
        if not bool(outside.any()):
            break
        out[outside] = torch.nextafter(out[outside], centre[outside])
    return out


def _restart(front: nn.Module, x: Tensor, start: int, stop: int, state: tuple[Tensor, Tensor, Tensor, Tensor],
             settings: IRISettings, value_range: tuple[float, float], seed: int) -> None:
    """Restart the samples of batch ``x[start:stop]`` still above the tolerance from fresh seeds, up to
    ``settings.restarts`` times, updating ``state = (iris, rel_error, steps, seed_index)`` (batch-sized)
    in place where an attempt does better. Each attempt's seeds come from a generator keyed by the batch
    and the attempt, so a resumed run makes the same IRIs."""
    best, err, used, used_seeds = state
    lo, hi = value_range
    n = len(x)
    for attempt in range(1, settings.restarts + 1):
        missed = (err > settings.tol).nonzero().squeeze(1)
        if not len(missed):
            return
        gen = seeded_generator(seed, "iri-restart", start, attempt)
        if settings.seed == "data":  # another random training input, never the input itself
            own = start + missed
            picked = torch.randint(0, n - 1, (len(missed),), generator=gen)
            picked = picked + (picked >= own).long()
            begin = x[picked]
        else:
            picked = torch.full((len(missed),), -1, dtype=torch.long)
            begin = lo + (hi - lo) * torch.rand((len(missed), *x.shape[1:]), generator=gen, dtype=x.dtype)
        b2, e2, u2 = optimise_batch(front, x[start:stop][missed], begin, settings, value_range)
        better = e2 < err[missed]
        chosen = missed[better]
        best[chosen], err[chosen] = b2[better], e2[better]
        used[chosen] = u2[better] + attempt * settings.steps
        used_seeds[chosen] = picked[better]


def fingerprint(model: nn.Module) -> str:
    """sha256 of the model's state dict (names, dtypes, shapes and bytes)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def tensor_digest(x: Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes."""
    t = x.detach().cpu().contiguous()
    return hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode()
                          + t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def cache_key(model_fingerprint: str, layer: str, data_key: str, settings: IRISettings, seed: int,
              value_range: tuple[float, float]) -> str:
    """The cache key: sha256 of model weights, layer, data, settings, seed and value range."""
    blob = json.dumps({"model": model_fingerprint, "layer": layer, "data": data_key, "seed": seed,
                       "algorithm": ALGORITHM,
                       "range": list(value_range), "settings": _key_settings(settings)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _key_settings(settings: IRISettings) -> dict[str, object]:
    """The settings part of the cache key: every field; an unbounded search leaves out the ball's fields
    (``radius``, ``norm``, ``radius_step``), so its key is the one it had before they existed."""
    fields = asdict(settings)
    if settings.radius is None:
        for name in ("radius", "norm", "radius_step"):
            fields.pop(name)
    return fields


def _save(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
    """Write one cache file (rank 0 only under torchrun: every rank computed the same IRIs)."""
    if not is_main_process():
        return
    atomic_write(path, lambda p: save_file({k: v.contiguous() for k, v in tensors.items()}, str(p),
                                           metadata=metadata))


def _load(path: Path) -> dict[str, Tensor]:
    return load_file(str(path))


def generate_iris(front: nn.Module, x: Tensor, settings: IRISettings, *, value_range: tuple[float, float],
                  seed: int = 0, cache_dir: str | Path | None = None, key_parts: dict[str, str] | None = None,
                  progress: bool = True, description: str = "IRIs") -> tuple[IRISet, dict[str, object]]:
    """IRIs of every row of ``x (n, ...)`` under ``front`` (a module mapping inputs to A's activation).

    value_range: (lo, hi) clamp of the inputs. ``settings.radius``: a bounded search (module docstring); the
    IRISet then carries the ball and every IRI's distance from its seed. cache_dir: reuse/save ``<key>.safetensors`` there (None:
    no cache); ``key_parts`` must then hold ``model`` (fingerprint of A), ``layer`` and ``data``.
    Returns the IRISet and a dict ``{"cache": "hit" | "miss" | "off", "path": ...}``.
    """
    settings = settings.validate()
    if isinstance(x, dict):
        raise SimkitError("IRIs need tensor inputs; tokenised text has no continuous input to optimise")
    n = len(x)
    path = partial = None
    if cache_dir is not None:
        if not key_parts:
            raise SimkitError("an IRI cache (`cache_dir`) needs `key_parts` (model, layer, data)")
        key = cache_key(key_parts["model"], key_parts["layer"], key_parts["data"], settings, seed, value_range)
        path = Path(cache_dir) / f"iri-{key}.safetensors"
        partial = Path(cache_dir) / f"iri-{key}.partial.safetensors"
        if path.is_file():
            saved = _load(path)
            return _iri_set(saved["iris"], saved["rel_error"], saved["steps"], saved["seed_index"], settings,
                            x), {"cache": "hit", "path": str(path)}
    generator = seeded_generator(seed)
    if settings.seed == "data":
        seeds = seed_indices(n, generator)
        starts = None
    else:
        seeds = torch.full((n,), -1, dtype=torch.long)
        lo, hi = value_range
        starts = lo + (hi - lo) * torch.rand(x.shape, generator=generator, dtype=x.dtype)
    iris = torch.empty_like(x)
    errors = torch.empty(n, dtype=torch.float64)
    steps = torch.empty(n, dtype=torch.long)
    done = 0
    if partial is not None and partial.is_file():
        saved = _load(partial)
        done = int(saved["done"])
        iris[:done], errors[:done], steps[:done] = saved["iris"][:done], saved["rel_error"][:done], saved["steps"][:done]
        if "seed_index" in saved:
            seeds[:done] = saved["seed_index"][:done]
    bar = progress_bar(progress)
    with bar:
        task = bar.add_task(description, total=n, completed=done)
        for start in range(done, n, settings.batch_size):
            stop = min(start + settings.batch_size, n)
            begin = x[seeds[start:stop]] if starts is None else starts[start:stop]
            best, err, used = optimise_batch(front, x[start:stop], begin, settings, value_range)
            used_seeds = seeds[start:stop].clone()
            _restart(front, x, start, stop, (best, err, used, used_seeds), settings, value_range, seed)
            iris[start:stop], errors[start:stop], steps[start:stop] = best, err, used
            seeds[start:stop] = used_seeds
            done = stop
            if partial is not None and done < n:
                _save(partial, {"iris": iris[:done], "rel_error": errors[:done], "steps": steps[:done],
                                "seed_index": seeds[:done], "done": torch.tensor(done)}, {})
            bar.update(task, completed=done)
    result = _iri_set(iris, errors, steps, seeds, settings, x)
    if path is None or key_parts is None:
        return result, {"cache": "off", "path": None}
    _save(path, {"iris": iris, "rel_error": errors, "steps": steps, "seed_index": seeds},
          {"settings": json.dumps(asdict(settings)), **{k: str(v) for k, v in key_parts.items()}})
    if partial is not None:
        partial.unlink(missing_ok=True)
    return result, {"cache": "miss", "path": str(path)}


def _iri_set(iris: Tensor, errors: Tensor, steps: Tensor, seeds: Tensor, settings: IRISettings, x: Tensor) -> IRISet:
    """The :class:`IRISet` of a run, with each IRI's distance from its seed in ``settings.norm``."""
    out = IRISet(iris, errors, steps, seeds, settings.tol, radius=settings.radius, norm=settings.norm)
    linf, l2 = seed_distances(out, x)
    out.distance = linf if settings.norm == "linf" else l2
    return out


def seed_distances(iris: IRISet, x: Tensor) -> tuple[Tensor, Tensor]:
    """How far each IRI moved from the input it started from, in input units: ``(linf (n,), l2 (n,))``
    float64, the L∞ and L2 norms of ``iris.iris[i] − x[iris.seed_index[i]]`` over all input values;
    NaN for an IRI started from noise (``seed_index`` −1). ``x (n, ...)``: the inputs the IRIs were
    made from (their seeds index into it)."""
    n = len(iris.iris)
    linf = torch.full((n,), float("nan"), dtype=torch.float64)
    l2 = torch.full((n,), float("nan"), dtype=torch.float64)
    seeded = (iris.seed_index >= 0).nonzero().squeeze(1)
    if len(seeded):
        diff = (iris.iris[seeded].double() - x[iris.seed_index[seeded]].double()).flatten(1)
        linf[seeded] = diff.abs().amax(dim=1)
        l2[seeded] = diff.norm(dim=1)
    return linf, l2
