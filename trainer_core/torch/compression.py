"""Gradient compression choices: Horovod's (``Compression.none``, ``Compression.fp16``) beside
trainer_core's compressors with error feedback (1-bit, 2-bit, top-k, PowerSGD).

Horovod's are tensor transforms around a plain reduction: ``compress(tensor) -> (tensor, ctx)``
before, ``decompress(tensor, ctx)`` after (a user's own class with these two static methods works
too). trainer_core's are ``Residual`` descriptors: they name ``trainer_core.compression`` params,
and the reduction itself changes (``Group.compressed_allreduce``: compressed reduce-scatter and
allgather, a residual per bucket on every rank; ``powersgd``: the low-rank factors are allreduced,
one bucket per parameter so that each keeps its matrix shape; with ``comm="ps"`` the KV store's
``set_gradient_compression``).

>>> DistributedOptimizer(opt, compression=Compression.fp16)
>>> DistributedOptimizer(opt, compression=Compression.onebit)
>>> DistributedOptimizer(opt, compression=Compression.topk(ratio=0.01))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainer_core.compression import get_compressor


class Compressor:
    """Horovod's interface: a transform before and after the reduction."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class NoneCompressor(Compressor):
    """Sends the tensor as it is."""


class FP16Compressor(Compressor):
    """Floating tensors travel as float16 (half the bytes), and come back in their own dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


@dataclass(frozen=True)
class Residual:
    """A trainer_core compressor with error feedback, by its params (``{"type": "1bit", ...}``)."""

    params: dict[str, Any] = field(hash=False)

    def __post_init__(self) -> None:
        get_compressor(dict(self.params))  # refuses unknown types and bad parameters now

    @property
    def type(self) -> str:
        return str(self.params["type"])

    @property
    def per_parameter(self) -> bool:
        """Whether each parameter needs its own bucket (PowerSGD works on the matrix's shape)."""
        return self.type == "powersgd"


class Compression:
    """The choices, under Horovod's names and trainer_core's."""

    none: type[Compressor] = NoneCompressor
    fp16: type[Compressor] = FP16Compressor
    onebit = Residual({"type": "1bit"})

    @staticmethod
    def twobit(threshold: float = 0.5) -> Residual:
        """MXNet's 2-bit quantizer: values beyond +-threshold are sent as +-threshold."""
        return Residual({"type": "2bit", "threshold": threshold})

    @staticmethod
    def topk(ratio: float = 0.01) -> Residual:
        """The largest ``ratio`` of the values (by magnitude) are sent."""
        return Residual({"type": "topk", "ratio": ratio})

    @staticmethod
    def powersgd(rank: int = 1, seed: int = 0) -> Residual:
        """PowerSGD's rank-``rank`` approximation of each matrix (Vogels et al.)."""
        return Residual({"type": "powersgd", "rank": rank, "seed": seed})

    @staticmethod
    def from_params(params: dict[str, Any]) -> Residual:
        """Any ``trainer_core.compression`` params (``{"type": "1bit", "block_size": 512}``)."""
        return Residual(dict(params))


def check(compression: Any) -> Any:
    """``compression`` if it is one of the choices; a clear error otherwise."""
    if isinstance(compression, Residual):
        return compression
    if callable(getattr(compression, "compress", None)) and callable(
        getattr(compression, "decompress", None)
    ):
        return compression
    raise ValueError(
        f"compression must be Compression.none, Compression.fp16, a trainer_core compressor "
        f"(Compression.onebit, .twobit(), .topk(), .powersgd(), .from_params()) or a class with "
        f"compress/decompress, not {compression!r}"
    )
