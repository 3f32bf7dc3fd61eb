"""Activation files → layers readable in row chunks (``simkit.engine.arrays`` turns them into a source).

One reader per format, each returning ``{name: LayerArray}`` plus the entries that are not layers
(``ids``, ``attention_mask``), never reading a whole layer into memory where the format allows:

- ``.npy``: one layer named after the file, memory-mapped;
- a directory of ``.npy`` files (as thingsvision writes them): one layer per file, memory-mapped, named
  after the file (``ids.npy``, ``ids.txt`` or thingsvision's ``file_names.txt`` beside them: the sample IDs);
- ``.npz``: a layer per key, each member read in row chunks from the archive (never unpickled);
- ``.safetensors``: a layer per key, read in row chunks (``get_slice``);
- ``.pt``: a dict of tensors, read with ``torch.load(weights_only=True)`` (memory-mapped); a file that
  needs unpickling code is refused unless ``trust``;
- ``.h5``/``.hdf5``: every dataset a layer, its group path a dotted prefix (``encoder/0/out`` →
  ``encoder.0.out``), read in row chunks through h5py (the ``[h5]`` extra, imported only here).

Object arrays are never unpickled: NumPy files are read with ``allow_pickle=False``.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simkit.errors import SimkitError

#: file suffixes read as activations (a directory of .npy files too)
ARRAY_SUFFIXES = (".npy", ".npz", ".safetensors", ".pt", ".h5", ".hdf5")
#: entries of a file that are not layers: the sample IDs and the token mask of 3-D layers
IDS, MASK = "ids", "attention_mask"
RESERVED = (IDS, MASK)
#: text files beside a directory's .npy files that list its sample IDs, one per line (``file_names.txt``:
#: thingsvision's list of the images, in the order of the rows)
ID_LISTS = ("ids.txt", "file_names.txt")

#: rows (an index range or an index array, in the order wanted) → a tensor of those rows
Rows = slice | np.ndarray


class LayerArray:
    """One layer of ``n`` samples: ``shape`` (n, ...), ``dtype`` (a numpy dtype, or a torch dtype) and
    :meth:`rows`, which reads only the rows asked for."""

    shape: tuple[int, ...]
    dtype: Any

    def rows(self, index: Rows) -> torch.Tensor:
        """The rows ``index`` (a slice of rows, or an array of row numbers in the order wanted)."""
        raise NotImplementedError


class InMemory(LayerArray):
    """A NumPy array (memory-mapped or not) or a torch tensor held as it is."""

    def __init__(self, array: np.ndarray | torch.Tensor):
        self.array = array
        self.shape = tuple(array.shape)
        self.dtype = array.dtype

    def rows(self, index: Rows) -> torch.Tensor:
        if isinstance(self.array, torch.Tensor):
            where = index if isinstance(index, slice) else torch.as_tensor(index, device=self.array.device)
            return self.array[where]
        return _tensor(self.array[index])


class Chunked(LayerArray):
    """A layer read through ``read(start, stop)`` only (safetensors, HDF5, an ``.npz`` member); an index
    array is read as runs of consecutive rows, then put in the order asked for."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, read: Callable[[int, int], Any]):
        self.shape, self.dtype, self.read = shape, dtype, read

    def rows(self, index: Rows) -> torch.Tensor:
        if isinstance(index, slice):
            start, stop, _ = index.indices(self.shape[0])
            return _tensor(self.read(start, max(start, stop)))
        order = np.argsort(index, kind="stable")
        wanted = np.asarray(index)[order]
        breaks = np.flatnonzero(np.diff(wanted) != 1) + 1
        parts = [_tensor(self.read(int(run[0]), int(run[-1]) + 1)) for run in np.split(wanted, breaks)]
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return out[torch.as_tensor(np.argsort(order, kind="stable"))]


def _tensor(value: Any) -> torch.Tensor:
    """Rows read as a tensor (a read-only or strided NumPy array copied, as torch needs)."""
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.require(value, requirements=("C", "W")))


@dataclass
class FileContents:
    """What a file holds: its layers in file order, the entries that are not layers, the format's name and
    whatever must be closed when done."""

    layers: dict[str, LayerArray]
    extra: dict[str, Any] = field(default_factory=dict)
    format: str = ""
    closers: list[Callable[[], None]] = field(default_factory=list)


def is_array_path(path: str | Path) -> bool:
    """Whether ``path`` names activations: a file with one of :data:`ARRAY_SUFFIXES` (existing or not), or
    an existing directory (a directory of ``.npy`` files, or an activation cache)."""
    path = Path(path)
    return path.suffix.lower() in ARRAY_SUFFIXES or path.is_dir()


def read_file(path: Path, *, trust: bool = False) -> FileContents:
    """The layers of the activation file or directory ``path`` (see the module docstring)."""
    if not path.exists():
        raise SimkitError(f"activation file {str(path)!r} does not exist; give a .npy, .npz, .safetensors, .pt, "
                          ".h5 file or a directory of .npy files")
    if path.is_dir():
        return _npy_directory(path)
    readers: dict[str, Callable[[Path], FileContents]] = {
        ".npy": _npy, ".npz": _npz, ".safetensors": _safetensors, ".h5": _hdf5, ".hdf5": _hdf5,
        ".pt": lambda p: _torch_file(p, trust)}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise SimkitError(f"{str(path)!r} is not an activation file simkit reads; give a "
                          f"{', '.join(ARRAY_SUFFIXES)} file or a directory of .npy files")
    return reader(path)


def damaged(path: Path, what: str, exc: BaseException) -> SimkitError:
    """The one-line error of a file that cannot be read as ``what``."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    return SimkitError(f"cannot read {str(path)!r} as {what} ({first}); the file is truncated, damaged or not "
                       f"{what}: write it again")


# ------------------------------------------------------------------------------------------ NumPy


def _load_npy(path: Path) -> np.ndarray:
    """An ``.npy`` file memory-mapped (never unpickled: an object array is refused)."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" in str(exc) or "Python objects" in str(exc):
            raise object_array(path.stem, path) from None
        raise damaged(path, "a .npy file", exc) from None
    except OSError as exc:
        raise damaged(path, "a .npy file", exc) from None


def object_array(name: str, path: Path) -> SimkitError:
    """The error of an object (ragged) array, which simkit never unpickles."""
    return SimkitError(f"layer {name!r} of {str(path)!r} is an object array (ragged rows, or Python objects), which "
                       "simkit never unpickles; save one numeric array of shape (samples, features...) per layer")


def _npy_layer(path: Path, closers: list[Callable[[], None]]) -> LayerArray:
    """An ``.npy`` layer read row range by row range with ``os.pread`` (:class:`Chunked`), so a file larger
    than memory costs one batch of rows, not its pages held by a memory map (which count in the process's
    resident memory); a Fortran-ordered array, whose rows are not contiguous, is memory-mapped."""
    array = _load_npy(path)  # the header's checks: object arrays refused, a short file is damaged
    if not isinstance(array, np.memmap) or not array.flags.c_contiguous or array.ndim == 0 or array.size == 0:
        return InMemory(array)
    offset, dtype, shape = int(array.offset), array.dtype, tuple(array.shape)
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    del array
    fd = os.open(path, os.O_RDONLY)
    closers.append(lambda: os.close(fd))

    def read(start: int, stop: int) -> np.ndarray:
        data = os.pread(fd, (stop - start) * row_bytes, offset + start * row_bytes)
        return np.frombuffer(bytearray(data), dtype=dtype).reshape((stop - start, *shape[1:]))

    return Chunked(shape, dtype, read)


def _npy(path: Path) -> FileContents:
    contents = FileContents({}, format="npy")
    contents.layers[path.stem] = _npy_layer(path, contents.closers)
    return contents


def natural_key(name: str) -> list[Any]:
    """Sort key that orders ``layer2`` before ``layer10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _npy_directory(path: Path) -> FileContents:
    files = sorted((p for p in path.iterdir() if p.suffix.lower() == ".npy" and p.is_file()),
                   key=lambda p: natural_key(p.stem))
    closers: list[Callable[[], None]] = []
    layers: dict[str, LayerArray] = {p.stem: _npy_layer(p, closers) for p in files if p.stem not in RESERVED}
    if not layers:
        raise SimkitError(f"directory {str(path)!r} holds no .npy arrays (and is no simkit cache); give a "
                          "directory with one .npy file per layer, or an activation file")
    extra: dict[str, Any] = {p.stem: np.asarray(_load_npy(p)) for p in files if p.stem in RESERVED}
    listed = [path / name for name in ID_LISTS if (path / name).is_file()]
    if IDS not in extra and listed:
        extra[IDS] = read_id_lines(listed[0])
    return FileContents(layers, extra, format="npy directory", closers=closers)


def read_id_lines(path: Path) -> list[str]:
    """One ID per line (a trailing empty line ignored)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SimkitError(f"cannot read the sample IDs in {str(path)!r} ({type(exc).__name__}); give a UTF-8 "
                          "text file with one ID per line") from None
    return lines[:-1] if lines and not lines[-1] else lines


class _Member:
    """One ``.npy`` member of an ``.npz`` archive read in row chunks: the archive member is kept open and
    read forward (a read before the current position reopens it)."""

    def __init__(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo, offset: int, shape: tuple[int, ...],
                 dtype: np.dtype):
        self.archive, self.info, self.offset, self.shape, self.dtype = archive, info, offset, shape, dtype
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        self.handle: Any = None

    def read(self, start: int, stop: int) -> np.ndarray:
        position = self.offset + start * self.row_bytes
        if self.handle is None or self.handle.tell() > position:
            self.close()
            self.handle = self.archive.open(self.info)
        self.handle.seek(position)
        data = self.handle.read((stop - start) * self.row_bytes)
        if len(data) != (stop - start) * self.row_bytes:
            raise SimkitError(f"the archive member {self.info.filename!r} ends early; the .npz file is truncated: "
                              "write it again")
        return np.frombuffer(data, dtype=self.dtype).reshape((stop - start, *self.shape[1:]))

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def _npz(path: Path) -> FileContents:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise damaged(path, "an .npz archive", exc) from None
    contents = FileContents({}, format="npz", closers=[archive.close])
    try:
        for info in archive.infolist():
            if info.filename.endswith(".npy"):
                _npz_member(path, archive, info, contents)
    except BaseException:
        archive.close()
        raise
    return contents


def _npz_member(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, contents: FileContents) -> None:
    """Read one member's header and add it to ``contents`` (IDs and the mask in memory, layers chunked)."""
    name = info.filename[:-4]
    try:
        with archive.open(info) as handle:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(handle)
            offset = handle.tell()
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise damaged(path, "an .npz archive", exc) from None
    if dtype.hasobject:
        raise object_array(name, path)
    if offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize > info.file_size:
        raise SimkitError(f"member {name!r} of {str(path)!r} holds fewer bytes than its shape {shape} needs; the "
                          ".npz file is truncated: write it again")
    if name in RESERVED or fortran or len(shape) == 0:
        try:
            array = np.load(archive.open(info), allow_pickle=False)
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
            raise damaged(path, "an .npz archive", exc) from None
        target: dict[str, Any] = contents.extra if name in RESERVED else contents.layers
        target[name] = array if name in RESERVED else InMemory(array)
        return
    member = _Member(archive, info, offset, tuple(shape), dtype)
    contents.closers.append(member.close)
    contents.layers[name] = Chunked(tuple(shape), dtype, member.read)


# ------------------------------------------------------------------------------------------ safetensors, torch


def _safetensors(path: Path) -> FileContents:
    from safetensors import safe_open

    try:
        handle = safe_open(str(path), framework="pt")
        keys = list(handle.keys())
        slices = {key: handle.get_slice(key) for key in keys}
    except Exception as exc:  # SafetensorError, OSError: a truncated or foreign file
        raise damaged(path, "a .safetensors file", exc) from None
    contents = FileContents({}, format="safetensors")
    for key, part in slices.items():
        shape = tuple(int(s) for s in part.get_shape())
        if key in RESERVED:
            contents.extra[key] = handle.get_tensor(key)
        elif len(shape) == 0:
            contents.layers[key] = InMemory(handle.get_tensor(key))
        else:
            contents.layers[key] = Chunked(shape, _SAFETENSORS_DTYPES.get(part.get_dtype(), part.get_dtype()),
                                           _slice_reader(part))
    return contents


def _slice_reader(sliceable: Any) -> Callable[[int, int], Any]:
    """``read(start, stop)`` of anything that reads rows by slicing (a safetensors slice, an HDF5 dataset)."""
    def read(start: int, stop: int) -> Any:
        return sliceable[start:stop]

    return read


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


# the pickle stream of torch.save's legacy (non-zip) format: a protocol opcode, then torch's magic number
_LEGACY_MAGIC = b"\x8a\nl\xfc\x9cF\xf9 j\xa8"


def _torch_file(path: Path, trust: bool) -> FileContents:
    """A ``torch.save`` dict of tensors, memory-mapped and weights-only unless ``trust``."""
    with open(path, "rb") as handle:
        head = handle.read(16)
    legacy = head[:1] == b"\x80" and head[2:12] == _LEGACY_MAGIC
    if not head.startswith(b"PK") and not legacy:  # a bare pickle is refused unread
        raise SimkitError(f"{str(path)!r} is not a torch.save file (a pickle or another format posing as .pt), so "
                          "simkit will not unpickle it; save a dict of tensors with torch.save, or use .npz or "
                          ".safetensors")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=not legacy)
    except Exception as exc:  # a global outside the weights-only allow-list, or a damaged archive
        if "weights_only" not in str(exc) and "Unsupported" not in str(exc):
            raise damaged(path, "a torch.save file", exc) from None
        if not trust:
            raise SimkitError(f"{str(path)!r} needs unpickling code to load (it holds more than tensors); pass "
                              "`trust` only for a file you made yourself, or save a dict of tensors") from None
        obj = _unpickle(path)
    if not isinstance(obj, Mapping):
        raise SimkitError(f"{str(path)!r} holds a {type(obj).__name__}, not a dict of tensors; save "
                          "{layer name: tensor (samples, features...)} with torch.save")
    contents = FileContents({}, format="pt")
    for key, value in flatten_mapping(obj).items():
        if key in RESERVED:
            contents.extra[key] = value
        else:
            contents.layers[key] = as_layer(value, key)
    return contents


def _unpickle(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise damaged(path, "a torch.save file", exc) from None


# ------------------------------------------------------------------------------------------ HDF5


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise SimkitError("reading HDF5 files needs h5py, which is not installed: pip install 'simkit[h5]'") from None
    return h5py


def _hdf5(path: Path) -> FileContents:
    h5py = _h5py()
    try:
        handle = h5py.File(path, "r")
    except (OSError, ValueError) as exc:
        raise damaged(path, "an HDF5 file", exc) from None
    contents = FileContents({}, format="hdf5", closers=[handle.close])
    datasets: list[tuple[str, Any]] = []
    handle.visititems(lambda name, item: datasets.append((name, item)) if isinstance(item, h5py.Dataset) else None)
    for name, dataset in datasets:
        key = name.strip("/").replace("/", ".")
        if key in RESERVED:
            contents.extra[key] = dataset[()]
        elif dataset.shape is None or len(dataset.shape) == 0:
            contents.layers[key] = InMemory(np.asarray(dataset[()]))
        else:
            contents.layers[key] = Chunked(tuple(dataset.shape), dataset.dtype, _slice_reader(dataset))
    return contents


# ------------------------------------------------------------------------------------------ in memory


def flatten_mapping(values: Mapping[str, Any] | Any) -> dict[str, Any]:
    """``{key: value}`` of a mapping or a dict-like (``keys()`` and ``[]``: a TransformerLens
    ``ActivationCache``); a value that is a tuple or list of arrays (Hugging Face ``hidden_states``)
    becomes ``key.0``, ``key.1``, ...; ``None`` values are dropped."""
    out: dict[str, Any] = {}
    for key in list(values.keys()):
        value = values[key]
        if value is None:
            continue
        if isinstance(value, list | tuple) and value and all(_array_like(v) for v in value):
            out.update({f"{key}.{i}": v for i, v in enumerate(value)})
        else:
            out[str(key)] = value
    return out


def _array_like(value: Any) -> bool:
    return isinstance(value, torch.Tensor | np.ndarray) or hasattr(value, "__array__")


def as_layer(value: Any, name: str) -> LayerArray:
    """A value of an activation mapping as a layer: a torch tensor or a NumPy array as it is, anything with
    ``__array__`` through ``np.asarray``, an nnsight-style proxy through its ``.value``; a ragged or object
    array is a SimkitError (never unpickled)."""
    if not _array_like(value) and _array_like(getattr(value, "value", None)):
        value = value.value
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            raise SimkitError(f"layer {name!r} is a tensor on the meta device (a shape without values); give the "
                              "activations themselves (samples, features...)")
        return InMemory(value.detach())
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        array = np.empty(0, dtype=object)
    if array.dtype.hasobject:
        raise SimkitError(f"layer {name!r} is a ragged or object array ({type(value).__name__}); give one numeric "
                          "array of shape (samples, features...) per layer")
    return InMemory(array)
