"""Model specs → modules, and saving models so they reload without pickle.

=====================================  ==================================================================
``torchvision:NAME[:k=v,...]``         random init seeded by ``seed``; ``:weights=DEFAULT`` (or another
                                       name of the model's weights enum, e.g. ``IMAGENET1K_V1``) loads
                                       the pretrained file from the local torch hub cache
                                       (``torch.hub.get_dir()/checkpoints/<file of the enum's url>``),
                                       never downloading it
``timm:NAME[:k=v,...]``                when timm is installed, ``pretrained=False``
``hf:DIR``                             a local Hugging Face model directory (needs transformers), wrapped
                                       in :class:`HFModel` (forward(input_ids, attention_mask))
``file:PATH``                          TorchScript (``.pt``/``.ts``); ``.safetensors`` with the sidecar
                                       ``PATH.json`` written by :func:`save_model`; a state dict with
                                       ``,arch=SPEC``; a pickled module only with ``trust=True``
``python:pkg.mod:callable[:k=v,...]``  any callable returning an ``nn.Module``
``simkit:NAME[:k=v,...]``              the built-in zoo (:mod:`simkit.models.zoo`)
=====================================  ==================================================================
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from simkit.errors import SimkitError, unknown_name_error
from simkit.io import atomic_write, write_json
from simkit.models.zoo import ZOO, build_zoo, parse_kwargs, resolve
from simkit.seeding import pair_seeds
from simkit.settings.compare import DTYPES

MODEL_SPEC_KINDS = ("torchvision:NAME", "timm:NAME", "hf:DIR", "file:PATH", "python:pkg.mod:callable", "simkit:NAME")
SIDECAR_FORMAT = "simkit-model-1"
PAIR_SIDES = ("model_a", "model_b")  # the models of a pair (simkit.seeding.pair_seeds)


def load_model(spec: str, *, seed: int = 0, trust: bool = False, weights: str | None = None,
               num_classes: int | None = None, dtype: str | torch.dtype | None = None) -> nn.Module:
    """The module named by ``spec``, in eval mode on the CPU (see the module docstring).

    Random initialisation is seeded by ``seed`` without disturbing the global torch generator. The
    module remembers ``spec`` as ``model.simkit_spec`` (what ``simkit.compare`` names it by default), the
    seed as ``model.simkit_seed`` and where its weights came from as ``model.simkit_weights``.
    ``dtype`` (``float32``, ``bfloat16`` or ``float16``; None: the dtype of its file) casts its floating-point
    weights after loading, whatever the loader, and is remembered as ``model.simkit_dtype``.
    """
    cast = model_dtype(dtype)
    if not isinstance(spec, str) or ":" not in spec:
        raise SimkitError(f"model spec {spec!r} has no kind; valid kinds: {', '.join(MODEL_SPEC_KINDS)}")
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    builders = {"torchvision": _torchvision, "timm": _timm, "hf": _hf, "file": _file, "python": _python,
                "simkit": _zoo}
    if kind not in builders:
        raise SimkitError(f"unknown model kind {kind!r} in {spec!r}; valid kinds: {', '.join(MODEL_SPEC_KINDS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = builders[kind](spec=spec, rest=rest.strip(), seed=seed, trust=trust, num_classes=num_classes)
    if not isinstance(model, nn.Module):
        raise SimkitError(f"model spec {spec!r} gave a {type(model).__name__}, not a torch nn.Module")
    if weights is not None:
        load_weights(model, weights, spec)
    pretrained = getattr(model, "simkit_weights", None) if kind == "torchvision" else None
    provenance = {"simkit_spec": spec, "simkit_seed": seed,
                  "simkit_weights": str(weights) if weights is not None else pretrained or _weights_of(kind)}
    if cast is not None:
        model.to(cast)
        provenance["simkit_dtype"] = str(cast).replace("torch.", "")
    with contextlib.suppress(AttributeError, RuntimeError):  # a TorchScript module may refuse new attributes
        for name, value in provenance.items():
            object.__setattr__(model, name, value)  # plain attributes, not submodules or buffers
    return model.eval()


def model_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``dtype`` (a name of :data:`~simkit.settings.compare.DTYPES` or a torch dtype) as a torch dtype."""
    if dtype is None:
        return None
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise unknown_name_error("`dtype`", name, DTYPES, "valid: " + ", ".join(DTYPES))
    return getattr(torch, name)


def seeded_model_factory(spec: str, *, seed: int, trust: bool = False, weights: str | None = None,
                         side: str | None = None) -> Callable[[int], nn.Module]:
    """A model factory ``run seed -> nn.Module`` for the runners' ``seeds > 1`` (what
    ``simkit.forward.ModelSource`` accepts): each run seed builds ``spec`` with :func:`load_model` at its
    own model seed, so zoo, torchvision and timm specs get their own initialisation, while ``file:``,
    ``hf:`` and a ``weights`` file load the same weights for every seed.

    The model seed of run seed ``s`` is ``s``, or with ``side`` (``"model_a"``/``"model_b"``, the two
    models of stitch and compare) ``simkit.seeding.pair_seeds(s)[side]`` (A: ``s``, B: ``s + 1``). The
    model of ``seed`` (the run's first seed) is loaded now, so a bad spec or weights file fails before a
    run starts, and that same module is returned whenever the factory is called with ``seed``.
    """
    if side not in (None, *PAIR_SIDES):
        raise unknown_name_error("`side`", str(side), PAIR_SIDES, "or None for one model")

    def model_seed(run_seed: int) -> int:
        return run_seed if side is None else pair_seeds(run_seed)[side]

    def load(run_seed: int) -> nn.Module:
        return load_model(spec, seed=model_seed(run_seed), trust=trust, weights=weights)

    first = load(seed)
    return lambda run_seed: first if run_seed == seed else load(run_seed)


def _weights_of(kind: str) -> str:
    """Where a model's weights come from when no ``weights`` file is given: its own files for ``file:``,
    ``hf:`` and ``python:`` (whatever the callable builds), else random initialisation."""
    return {"file": "the model file", "hf": "pretrained (the hf: directory)",
            "python": "as the callable builds it"}.get(kind, "random init")


def local_paths(spec: str) -> list[Path]:
    """The local files and directories ``spec`` reads, as :func:`load_model` splits it: ``file:PATH``
    (with the sidecar of a ``.safetensors`` and the paths of its ``arch=SPEC``), ``hf:DIR``, and the
    working directory's ``MODULE.py`` of ``python:MODULE:callable``; none for the builder kinds."""
    if not isinstance(spec, str) or ":" not in spec:
        return []
    kind, _, rest = spec.partition(":")
    kind, rest = kind.strip().lower(), rest.strip()
    if kind == "hf":
        return [Path(rest).expanduser()]
    if kind == "python":
        module = Path(rest.partition(":")[0].replace(".", "/") + ".py")
        return [module] if module.is_file() else []
    if kind == "torchvision":
        return _torchvision_paths(spec, rest)
    if kind != "file":
        return []
    path_text, _, arch = rest.partition(",arch=")
    path = Path(path_text.strip()).expanduser()
    sidecar = [sidecar_path(path)] if path.suffix == ".safetensors" and not arch.strip() else []
    return [path, *sidecar, *local_paths(arch.strip())]


def _name_and_kwargs(spec: str, rest: str, num_classes: int | None) -> tuple[str, dict[str, Any]]:
    name, _, options = rest.partition(":")
    if not name:
        raise SimkitError(f"model spec {spec!r} needs a name after the colon")
    kwargs = parse_kwargs(options, spec)
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    return name.strip(), kwargs


def _missing(package: str, spec: str, pip: str | None = None) -> SimkitError:
    return SimkitError(f"model spec {spec!r} needs {package}, which is not installed: "
                       f"pip install {pip or package}")


def _torchvision(*, spec, rest, seed, trust, num_classes) -> nn.Module:
    try:
        import torchvision
    except ImportError:
        raise _missing("torchvision", spec) from None
    name, kwargs = _name_and_kwargs(spec, rest, num_classes)
    available = torchvision.models.list_models()
    if name not in available:
        raise unknown_name_error("torchvision model", name, available)
    if kwargs.get("weights") is not None:
        return _torchvision_pretrained(torchvision, spec, name, kwargs)
    kwargs["weights"] = None
    try:
        return torchvision.models.get_model(name, **kwargs)
    except TypeError as exc:
        raise SimkitError(f"model spec {spec!r}: {exc}") from None


def _torchvision_paths(spec: str, rest: str) -> list[Path]:
    """The hub-cache file a ``torchvision:NAME:weights=CHOICE`` spec reads (none without weights)."""
    name, kwargs = _name_and_kwargs(spec, rest, None)
    if kwargs.get("weights") is None:
        return []
    try:
        return [torchvision_hub_file(spec, name, str(kwargs["weights"]))[1]]
    except ImportError:  # no torchvision: loading the spec says so
        return []


def torchvision_hub_file(spec: str, name: str, choice: str) -> tuple[Any, Path]:
    """(the weights enum member, the file in the torch hub cache it loads from) of torchvision model
    ``name`` with weights ``choice`` (``DEFAULT``, ``IMAGENET1K_V1``, ...; ``spec`` for messages):
    ``torch.hub.get_dir()/checkpoints/`` plus the file name of the member's ``url``, the file
    ``torch.hub`` itself would download there."""
    import os
    from urllib.parse import urlparse

    import torchvision

    try:
        enum = torchvision.models.get_model_weights(name)
    except (KeyError, ValueError):
        raise SimkitError(f"model spec {spec!r}: torchvision has no pretrained weights for {name!r}; drop "
                          ":weights=... for a random init") from None
    if choice not in enum.__members__:
        raise unknown_name_error(f"{name} weights", choice, list(enum.__members__),
                                 "valid: " + ", ".join(enum.__members__))
    member = enum[choice]
    return member, Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(member.url).path)


def _torchvision_pretrained(torchvision: Any, spec: str, name: str, kwargs: dict[str, Any]) -> nn.Module:
    """A torchvision model with pretrained weights read (weights only) from the local torch hub cache;
    a file that is not there is one line naming the path to place it at and where to get it."""
    from unittest import mock

    choice = str(kwargs["weights"])
    member, path = torchvision_hub_file(spec, name, choice)
    if not path.is_file():
        raise SimkitError(f"model spec {spec!r}: the {name} {choice} weights are not in the torch hub "
                          f"cache; place the file {member.url} at {path} (simkit never downloads; TORCH_HOME "
                          "moves the cache)")
    state = read_state_dict(path, spec)
    kwargs["weights"] = member
    try:  # torchvision's own builder (it sets num_classes and the like from the weights), fed our state dict
        with mock.patch.object(type(member), "get_state_dict", lambda self, *args, **kw: state):
            model = torchvision.models.get_model(name, **kwargs)
    except (TypeError, ValueError) as exc:
        raise SimkitError(f"model spec {spec!r}: {exc}") from None
    except RuntimeError as exc:
        detail = " ".join(line.strip() for line in str(exc).strip().splitlines()[:3])[:300]
        raise SimkitError(f"model spec {spec!r}: {str(path)!r} does not fit {name} ({detail}); place the file "
                          f"{member.url} there") from None
    object.__setattr__(model, "simkit_weights", f"pretrained (torchvision {choice}: {path.name})")
    return model


def _timm(*, spec, rest, seed, trust, num_classes) -> nn.Module:
    try:
        import timm
    except ImportError:
        raise _missing("timm", spec) from None
    name, kwargs = _name_and_kwargs(spec, rest, num_classes)
    if kwargs.pop("pretrained", False):
        raise SimkitError(f"model spec {spec!r}: pretrained timm weights would be downloaded; "
                          "pass a local weights file as `weights` instead")
    available = timm.list_models()
    if name not in available:
        raise unknown_name_error("timm model", name, available)
    return timm.create_model(name, pretrained=False, **kwargs)


def _zoo(*, spec, rest, seed, trust, num_classes) -> nn.Module:
    name, kwargs = _name_and_kwargs(spec, rest, num_classes)
    if name.lower() not in ZOO:
        raise unknown_name_error("zoo model", name, ZOO, "valid: " + ", ".join(f"simkit:{k}" for k in ZOO))
    return build_zoo(name.lower(), kwargs, spec)


def _python(*, spec, rest, seed, trust, num_classes) -> nn.Module:
    module_name, _, tail = rest.partition(":")
    attr, _, options = tail.partition(":")
    if not module_name or not attr:
        raise SimkitError(f"model spec {spec!r}: write python:package.module:callable")
    try:
        with _cwd_on_path():  # `python:mymodels:build` finds mymodels.py in the working directory
            factory = resolve(f"{module_name}:{attr}")
    except ImportError as exc:
        raise SimkitError(f"model spec {spec!r}: cannot import {module_name!r} ({exc})") from None
    except AttributeError:
        raise SimkitError(f"model spec {spec!r}: {module_name!r} has no attribute {attr!r}") from None
    if not callable(factory):
        raise SimkitError(f"model spec {spec!r}: {attr!r} is not callable")
    kwargs = parse_kwargs(options, spec)
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    import inspect

    try:
        inspect.signature(factory).bind(**kwargs)  # the call fits: else one line, not a TypeError inside
    except ValueError:  # no signature to read (some builtins): call it and see
        pass
    except TypeError as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no arguments"
        raise SimkitError(f"model spec {spec!r}: {module_name}:{attr} cannot be called with {given} ({exc}); "
                          "name a callable that builds an nn.Module from keyword options "
                          "(python:pkg.mod:fn:key=value,...)") from None
    return factory(**kwargs)


@contextlib.contextmanager
def _cwd_on_path():
    import os
    import sys

    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


# ----------------------------------------------------------------------------------------- Hugging Face

def _hf_dir(spec: str, rest: str) -> Path:
    path = Path(rest).expanduser()
    if not path.is_dir():
        raise SimkitError(f"hf spec {spec!r}: {rest!r} is not a local directory; simkit never downloads: "
                          "save the model with save_pretrained(DIR) (or huggingface-cli download) "
                          "and pass hf:DIR")
    return path


def _transformers(spec: str):
    try:
        import transformers
    except ImportError:
        raise _missing("transformers", spec) from None
    return transformers


class HFModel(nn.Module):
    """A local Hugging Face model behind a plain forward, with the model's own layer names.

    ``forward(input_ids (b, L), attention_mask (b, L) | None)`` → last hidden state (b, L, d). The
    wrapped model's children (and its own parameters and buffers) are this module's, so
    ``named_modules()`` gives the names the user's ``hf_model.named_modules()`` gives
    (``encoder.layer.0``, no prefix) and ``state_dict()`` its keys; the model itself is
    ``self.hf_model``, not a registered submodule. ``spec``: the ``hf:DIR`` it was loaded from, whose
    tokenizer reads text data for it (``simkit.data.load_data(..., tokenizer=model.spec)``). During a
    forward the mask is kept as ``self.simkit_attention_mask`` so the ``mean`` and ``last`` reductions
    skip padding.
    """

    def __init__(self, model: nn.Module, spec: str | None = None):
        super().__init__()
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, param in model.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buffer in model.named_buffers(recurse=False):
            self.register_buffer(name, buffer)
        self.hf_model: nn.Module
        object.__setattr__(self, "hf_model", model)  # not a submodule: the names stay the model's own
        self.spec = spec
        self.simkit_attention_mask: torch.Tensor | None = None

    def train(self, mode: bool = True) -> HFModel:
        super().train(mode)
        self.hf_model.training = mode
        return self

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for name in list(self.hf_model._buffers):  # its own buffers were replaced here: share them again
            if name in self._buffers:
                self.hf_model._buffers[name] = self._buffers[name]
        return self

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        if isinstance(input_ids, dict):
            kwargs = {**input_ids, **kwargs}
            input_ids = kwargs.pop("input_ids", None)
            attention_mask = kwargs.pop("attention_mask", attention_mask)
        self.simkit_attention_mask = attention_mask
        out = self.hf_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


@contextmanager
def _quiet_transformers(transformers) -> Iterator[None]:
    """No "Loading weights" bars or info lines from transformers while simkit loads (restored after)."""
    logging = getattr(getattr(transformers, "utils", None), "logging", None)
    if logging is None:
        yield
        return
    bars, level = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def _hf(*, spec, rest, seed, trust, num_classes) -> nn.Module:
    path = _hf_dir(spec, rest)
    transformers = _transformers(spec)
    try:
        with _quiet_transformers(transformers):
            model = transformers.AutoModel.from_pretrained(str(path), local_files_only=True,
                                                           trust_remote_code=trust)
    except Exception as exc:
        raise SimkitError(f"hf spec {spec!r}: cannot load the model from {str(path)!r} ({exc})") from None
    return HFModel(model, spec=spec)


def hf_tokenizer(spec: str):
    """The tokenizer of a local Hugging Face directory given as ``hf:DIR`` (or a plain DIR)."""
    rest = spec[3:] if spec.startswith("hf:") else spec
    path = _hf_dir(spec, rest)
    transformers = _transformers(spec)
    try:
        with _quiet_transformers(transformers):
            return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise SimkitError(f"tokenizer {spec!r}: cannot load it from {str(path)!r} ({exc})") from None


# ------------------------------------------------------------------------------------------ files

def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.split("/")[1:2] == ["code"] for name in archive.namelist())


def read_state_dict(path: Path, spec: str) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors`` or a ``torch.save`` file, never unpickling code."""
    if not path.exists():
        raise SimkitError(f"model spec {spec!r}: weights file {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:  # SafetensorError, OSError: a truncated or foreign file
            raise SimkitError(f"model spec {spec!r}: cannot read {str(path)!r} as safetensors "
                              f"({str(exc).strip()[:160]}); write it with simkit.models.save_model") from None
    state, needs_code = _load_weights_only(path, spec)
    if needs_code:
        if getattr(needs_code, "calls_code", False):
            raise _holds_code(spec, path, needs_code)
        raise SimkitError(f"model spec {spec!r}: {str(path)!r} is not a plain state dict (it needs "
                          f"unpickling {needs_code}); save model.state_dict() or use save_model")
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SimkitError(f"model spec {spec!r}: {str(path)!r} is not a state dict of tensors")
    return state



def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:160]}" if lines else type(exc).__name__


# the pickle stream of torch.save's legacy format starts with a protocol opcode and torch's magic number
_LEGACY_MAGIC = b"\x8a\nl\xfc\x9cF\xf9 j\xa8"


def _sniff_torch_file(path: Path, spec: str) -> None:
    """Refuse, with one line, a file that is no ``torch.save`` file at all: random bytes, a zip archive
    of something else, or a truncated or corrupt zip (what ``torch.load`` would meet halfway)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError as exc:
        raise SimkitError(f"model spec {spec!r}: cannot read {str(path)!r} ({exc.strerror})") from None
    if head.startswith(b"PK"):
        if not zipfile.is_zipfile(path):
            raise SimkitError(f"model spec {spec!r}: {str(path)!r} is a truncated or corrupt torch file (its zip "
                              "directory cannot be read); save or copy it again")
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
        if not any(name.endswith("/data.pkl") for name in names):
            raise SimkitError(f"model spec {spec!r}: {str(path)!r} is a zip archive but not a torch.save file "
                              "(no data.pkl); give a .safetensors, TorchScript or torch.save file")
        return
    if head[:1] == b"\x80" and head[2:12] == _LEGACY_MAGIC:
        return
    raise SimkitError(f"model spec {spec!r}: {str(path)!r} is not a model file simkit can read (neither "
                      "safetensors, TorchScript nor a torch.save file); save the model with "
                      "simkit.models.save_model")


# the global a weights-only unpickling refused: "Unsupported global: GLOBAL torch.nn...Linear was not an
# allowed global" (a class or function outside the allow-list) or "unsupported GLOBAL posix.system whose
# module posix is blocked" (a module torch never lets a weights-only load touch)
_REFUSED_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)( whose module [\w.]+ is blocked)?")
# modules whose functions run commands, code or I/O when a pickle calls them
_CODE_MODULES = ("os", "posix", "nt", "subprocess", "sys", "shutil", "socket", "builtins", "runpy", "importlib",
                 "pty", "commands", "webbrowser", "ctypes", "pickle", "marshal", "code", "codeop", "operator")
_CODE_BUILTINS = ("eval", "exec", "compile", "__import__", "getattr", "setattr", "open", "input", "breakpoint")


class _NeedsCode(str):
    """What ``_load_weights_only`` returns for a file that needs unpickling code: the global it names
    (truthy); ``calls_code``: that global is a function that runs commands or code (``os.system``)."""

    calls_code: bool = False


def _refused_global(message: str) -> _NeedsCode | None:
    found = _REFUSED_GLOBAL.search(message)
    if found is None:
        return None
    name = _NeedsCode(found.group(1))
    module = name.rpartition(".")[0]
    name.calls_code = bool(found.group(2)) or module.split(".")[0] in _CODE_MODULES or name in _CODE_BUILTINS
    return name


def _load_weights_only(path: Path, spec: str) -> tuple[Any, Any]:
    """``(object, "")`` from ``torch.load(weights_only=True)``, or ``(None, needs)`` when the file is a
    valid torch file that needs unpickling code (``needs``: a truthy :class:`_NeedsCode`, the global it
    names); a corrupt file is a one-line SimkitError, and so is a file whose pickle would call a function
    that runs commands or code (``os.system``, ``eval``) when ``trust`` is off."""
    _sniff_torch_file(path, spec)
    try:
        return torch.load(path, map_location="cpu", weights_only=True), ""
    except Exception as exc:
        refused = _refused_global(str(exc))
        if refused is not None:
            return None, refused
        if "Unsupported operand" in str(exc):
            return None, _NeedsCode("an unsupported pickle operation")
        raise SimkitError(f"model spec {spec!r}: {str(path)!r} is a corrupt or truncated torch file "
                          f"({_first_line(exc)}); save or copy it again") from None


def _holds_code(spec: str, path: Path, name: str) -> SimkitError:
    module, _, function = name.rpartition(".")
    if module in ("posix", "nt"):  # how os names its functions inside a pickle
        name = f"{name} (os.{function})"
    return SimkitError(f"model spec {spec!r}: {str(path)!r} holds code: unpickling it would call {name}, so "
                       "simkit will not load it; `trust` would run that code (only for a file you made "
                       "yourself), and a model saved with simkit.models.save_model needs none")


def load_weights(model: nn.Module, weights: str | Path, spec: str) -> None:
    """Load a local state dict into ``model`` (strict: every key must match)."""
    state = read_state_dict(Path(weights).expanduser(), spec)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])[:300]
        raise SimkitError(f"model spec {spec!r}: weights {str(weights)!r} do not fit the architecture "
                          f"({detail})") from None


def _file(*, spec, rest, seed, trust, num_classes) -> nn.Module:  # noqa: C901
    path_text, _, arch = rest.partition(",arch=")
    if not path_text:
        raise SimkitError(f"model spec {spec!r} needs a path: file:PATH")
    path = Path(path_text.strip()).expanduser()
    if not path.exists():
        raise SimkitError(f"model spec {spec!r}: file {str(path)!r} does not exist")
    arch = arch.strip()
    if path.suffix == ".safetensors":
        if not arch:
            sidecar = sidecar_path(path)
            if not sidecar.exists():
                raise SimkitError(f"model spec {spec!r}: {str(sidecar)!r} is missing; give the "
                                  "architecture as file:PATH,arch=SPEC")
            arch = _sidecar_spec(sidecar, spec)
            if arch.startswith("python:") and not trust:
                raise SimkitError(f"model spec {spec!r}: {str(sidecar)!r} names the architecture {arch!r}, "
                                  "which imports and runs Python code; pass `trust` if you trust "
                                  "it, or give file:PATH,arch=SPEC yourself")
        return _with_state(arch, path, spec, seed, num_classes)
    if _is_torchscript(path):
        with warnings.catch_warnings():  # torch marks TorchScript deprecated; the file is still valid
            warnings.filterwarnings("ignore", message=".*torch.jit.load.* is deprecated", category=FutureWarning)
            try:
                return torch.jit.load(str(path), map_location="cpu")
            except Exception as exc:  # a truncated or corrupt archive, or a foreign one with code/
                raise SimkitError(f"model spec {spec!r}: cannot load {str(path)!r} as TorchScript "
                                  f"({_first_line(exc)}); save or copy it again") from None
    if arch:
        return _with_state(arch, path, spec, seed, num_classes)
    obj, needs_code = _load_weights_only(path, spec)
    if needs_code:
        if not trust and getattr(needs_code, "calls_code", False):
            raise _holds_code(spec, path, needs_code)
        if not trust:
            raise SimkitError(f"model spec {spec!r}: {str(path)!r} is a pickled object and loading it "
                              "executes code from the file; pass `trust` if you trust it, "
                              f"or save with simkit.models.save_model (it names {needs_code})")
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # the file's own code, or a class it names that is not importable here
            raise SimkitError(f"model spec {spec!r}: cannot unpickle {str(path)!r} ({_first_line(exc)}); "
                              "save the model with simkit.models.save_model, or check that the code its "
                              "classes come from is importable") from None
    if isinstance(obj, dict):
        raise SimkitError(f"model spec {spec!r}: {str(path)!r} is a state dict; name its architecture "
                          "with file:PATH,arch=SPEC (e.g. arch=torchvision:resnet18)")
    return obj


def _sidecar_spec(sidecar: Path, spec: str) -> str:
    try:
        arch = json.loads(sidecar.read_text(encoding="utf-8"))["spec"]
    except (ValueError, KeyError, TypeError):
        raise SimkitError(f"model spec {spec!r}: {str(sidecar)!r} is not a simkit model sidecar "
                          "(JSON with a 'spec'); give file:PATH,arch=SPEC") from None
    if not isinstance(arch, str):
        raise SimkitError(f"model spec {spec!r}: {str(sidecar)!r} has no architecture spec string")
    return arch


def _with_state(arch: str, path: Path, spec: str, seed: int, num_classes: int | None) -> nn.Module:
    if arch.startswith("file:"):
        raise SimkitError(f"model spec {spec!r}: arch must be a builder spec, not another file")
    model = load_model(arch, seed=seed, num_classes=num_classes)
    load_weights(model, path, spec)
    return model


def _check_rebuilds(model: nn.Module, spec: str) -> None:
    """Fail at save time, not at load time, when ``spec`` does not rebuild ``model``'s state dict."""
    rebuilt = {k: tuple(v.shape) for k, v in load_model(spec, trust=True).state_dict().items()}
    mine = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if rebuilt != mine:
        differ = sorted(set(rebuilt) ^ set(mine)) or sorted(k for k in mine if rebuilt[k] != mine[k])
        raise SimkitError(f"save_model: spec {spec!r} does not rebuild this model (first difference: "
                          f"{differ[0]!r}); give the full spec, options such as num_classes included")


def sidecar_path(path: str | Path) -> Path:
    """``model.safetensors`` → ``model.safetensors.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def save_model(model: nn.Module, path: str | Path, spec: str) -> Path:
    """Write ``model``'s state dict as safetensors plus ``PATH.json`` = {"spec": spec, ...}, atomically.

    ``spec`` names the architecture (e.g. ``simkit:cnn1d:channels=16``) and is checked to rebuild the
    same state-dict keys and shapes; the file reloads with ``load_model("file:PATH")`` without
    unpickling. Returns the ``.safetensors`` path.
    """
    from safetensors.torch import save_file

    if isinstance(spec, str) and spec.startswith("file:"):
        raise SimkitError("save_model: spec must name the architecture (e.g. simkit:cnn1d), not a file")
    _check_rebuilds(model, spec)
    path = Path(path)
    if path.suffix != ".safetensors":
        path = path.with_name(path.name + ".safetensors")
    # clone: safetensors refuses tensors that share memory (tied weights); loading restores both keys.
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata={"spec": spec}))
    write_json(sidecar_path(path), {"spec": spec, "format": SIDECAR_FORMAT})
    return path
