"""Python objects as bytes without pickle: ``encode``/``decode`` for ``broadcast_object`` and
``allgather_object`` (and the hyperparameters of ``broadcast_optimizer_state``).

An object is encoded when it is made of ``None``, ``bool``, ``int``, ``float``, ``complex``,
``str``, ``bytes``/``bytearray``, ``list``, ``tuple``, ``set``/``frozenset``, ``dict`` (and
``OrderedDict``) with keys of those kinds, ``torch.Size``, ``torch.dtype``, torch tensors (dense,
any dtype; CUDA tensors come back on the receiver's current CUDA device) and numpy arrays and
scalars of numeric or bool dtypes. Anything else is a ``TypeError`` on the sender naming the
object's type and where it sits. The bytes are a JSON document describing the structure followed
by the tensors' and arrays' raw bytes; ``decode`` builds only those kinds back, so bytes from
another rank never run code.
"""

from __future__ import annotations

import json
import struct
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

MAGIC = b"TCO1"
_HEADER = struct.Struct("<4sQ")

#: torch dtypes an encoded tensor may have (by name)
_TORCH_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    )
}
_NUMPY_KINDS = "biufc"


class _Encoder:
    def __init__(self) -> None:
        self.blobs: list[bytes] = []

    def blob(self, data: bytes) -> int:
        self.blobs.append(data)
        return len(self.blobs) - 1

    def value(self, x: Any, where: str) -> Any:
        t = type(x)
        if x is None or t is bool or t is str:
            return x
        if t is int:
            return {"i": str(x)}
        if t is float:
            return {"f": x.hex()}
        if t is complex:
            return {"c": [x.real.hex(), x.imag.hex()]}
        if t in (bytes, bytearray):
            return {"b": self.blob(bytes(x)), "mutable": t is bytearray}
        if t is torch.Size:
            return {"size": list(x)}
        if t in (list, tuple, set, frozenset):
            items = sorted(x, key=repr) if t in (set, frozenset) else x
            return {t.__name__: [self.value(v, f"{where}[{i}]") for i, v in enumerate(items)]}
        if t in (dict, OrderedDict):
            pairs = [
                [self.value(k, f"{where} key {k!r}"), self.value(v, f"{where}[{k!r}]")] for k, v in x.items()
            ]
            return {t.__name__: pairs}
        if isinstance(x, torch.dtype):
            name = str(x).removeprefix("torch.")
            if name not in _TORCH_DTYPES:
                raise TypeError(f"{where} is {x}, a dtype objects cannot carry")
            return {"dtype": name}
        if isinstance(x, torch.Tensor):
            return self.tensor(x, where)
        if t is np.ndarray or isinstance(x, np.generic):
            a = np.asarray(x)
            if a.dtype.kind not in _NUMPY_KINDS:
                raise TypeError(
                    f"{where} is a numpy {a.dtype} value: objects carry numeric and bool arrays only"
                )
            data = np.ascontiguousarray(a).tobytes()
            return {"np": a.dtype.str, "shape": list(a.shape), "blob": self.blob(data), "scalar": a is not x}
        raise TypeError(
            f"{where} is a {t.__module__}.{t.__qualname__}: broadcast_object and allgather_object carry "
            "None, bool, int, float, complex, str, bytes, lists, tuples, sets, dicts, torch tensors and "
            "numpy arrays (nothing is pickled)"
        )

    def tensor(self, x: torch.Tensor, where: str) -> Any:
        name = str(x.dtype).removeprefix("torch.")
        if name not in _TORCH_DTYPES:
            raise TypeError(f"{where} is a {x.dtype} tensor, a dtype objects cannot carry")
        if x.layout != torch.strided:
            raise TypeError(f"{where} is a {x.layout} tensor: objects carry dense tensors")
        t = x.detach().cpu().contiguous().reshape(-1)
        raw = t.view(torch.uint8).numpy().tobytes()
        return {
            "tensor": name,
            "shape": list(x.shape),
            "blob": self.blob(raw),
            "cuda": x.device.type == "cuda",
            "grad": bool(x.requires_grad),
        }


def encode(obj: Any, what: str = "the object") -> bytes:
    """``obj`` as bytes (see the module's text); ``TypeError`` for what it cannot carry."""
    enc = _Encoder()
    doc = json.dumps(enc.value(obj, what), separators=(",", ":")).encode()
    sizes = [len(b) for b in enc.blobs]
    head = json.dumps({"doc": len(doc), "blobs": sizes}).encode()
    return b"".join([_HEADER.pack(MAGIC, len(head)), head, doc, *enc.blobs])


def decode(data: bytes) -> Any:
    """The object ``encode`` made; ``ValueError`` for bytes it did not make."""
    try:
        magic, n = _HEADER.unpack_from(data, 0)
        if magic != MAGIC:
            raise ValueError("not trainer_core's object encoding")
        at = _HEADER.size
        head = json.loads(bytes(data[at : at + n]))
        at += n
        doc = json.loads(bytes(data[at : at + int(head["doc"])]))
        at += int(head["doc"])
        blobs = []
        for size in head["blobs"]:
            blobs.append(bytes(data[at : at + int(size)]))
            at += int(size)
        return _Decoder(blobs).value(doc)
    except (KeyError, IndexError, TypeError, struct.error, json.JSONDecodeError) as e:
        raise ValueError(f"the received object's bytes are not trainer_core's object encoding: {e}") from None


class _Decoder:
    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def value(self, d: Any) -> Any:
        if d is None or type(d) in (bool, str):
            return d
        if type(d) is not dict or len(d) < 1:
            raise ValueError(f"unexpected {type(d).__name__} in the object's encoding")
        if "i" in d:
            return int(d["i"])
        if "f" in d:
            return float.fromhex(d["f"])
        if "c" in d:
            return complex(float.fromhex(d["c"][0]), float.fromhex(d["c"][1]))
        if "b" in d:
            raw = self.blobs[int(d["b"])]
            return bytearray(raw) if d.get("mutable") else raw
        if "size" in d:
            return torch.Size(int(n) for n in d["size"])
        for name, kind in (("list", list), ("tuple", tuple), ("set", set), ("frozenset", frozenset)):
            if name in d:
                return kind(self.value(v) for v in d[name])
        for name, dkind in (("dict", dict), ("OrderedDict", OrderedDict)):
            if name in d:
                return dkind((self.value(k), self.value(v)) for k, v in d[name])
        if "dtype" in d:
            return _TORCH_DTYPES[d["dtype"]]
        if "tensor" in d:
            return self.tensor(d)
        if "np" in d:
            dt = np.dtype(d["np"])
            if dt.kind not in _NUMPY_KINDS:
                raise ValueError(f"numpy dtype {dt} is not one objects carry")
            a = np.frombuffer(self.blobs[int(d["blob"])], dt).reshape([int(n) for n in d["shape"]]).copy()
            return a[()] if d.get("scalar") else a
        raise ValueError(f"unknown entry {sorted(d)} in the object's encoding")

    def tensor(self, d: dict[str, Any]) -> torch.Tensor:
        dtype = _TORCH_DTYPES[d["tensor"]]
        shape = [int(n) for n in d["shape"]]
        raw = bytearray(self.blobs[int(d["blob"])])
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        t = flat.view(dtype).reshape(shape) if flat.numel() else torch.empty(shape, dtype=dtype)
        if d.get("cuda") and torch.cuda.is_available():  # pragma: no cover - needs a GPU
            t = t.cuda()
        if d.get("grad") and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_(True)
        return t
