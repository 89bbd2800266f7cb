"""``DistributedOptimizer``: Horovod's, over trainer_core's collectives or parameter servers.

>>> opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
...                            named_parameters=model.named_parameters())
>>> loss.backward(); opt.step(); opt.zero_grad()

The user's optimizer is subclassed on the fly (``isinstance`` and its ``step`` hold). A hook on every
parameter (``register_post_accumulate_grad_hook``) counts its gradient down from
``backward_passes_per_step``; at zero the parameter is ready, and a bucket whose parameters are all
ready starts its exchange at once (``buckets``: in bucket order, the same on every rank), overlapping
the rest of backward. At the end of the step's last backward pass (a callback queued on autograd's
engine) the buckets that never became ready start as well: unused parameters send zeros and receive
the others' gradients, as Horovod's, and every rank has started the same operations in the same
order before ``backward()`` returns. ``step()`` (or ``synchronize()``) waits for every bucket
and then runs the user's optimizer on the reduced gradients (with ``server_optimizer``, on
``comm="ps"``, the servers ran it and the parameters hold their new weights: the local rule does
not run, MXNet's ``update_on_kvstore``).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from trainer_core.train import samemodel

from . import buckets as bucketing
from . import heap
from .adasum_optimizer import adasum_optimizer
from .backend import Backend
from .compression import Compression, Residual, check
from .exchange import Exchange, Pending
from .ops import GROUP_FAILURES, Adasum, Average, HorovodInternalError, Product, Sum, resolve_op
from .process_sets import in_set
from .runtime import Runtime, default
from .tensors import FLOATS, check_dense

#: DDP's bucket size: small enough to start the first exchange early in backward
FUSION_THRESHOLD = 25 * 1024 * 1024
_ids = itertools.count()

TOO_MANY = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)


class _Distributed:
    """The methods mixed into the user's optimizer class (see the module's text)."""

    def _setup(
        self,
        named: list[tuple[str, torch.Tensor]],
        compression: Any,
        bpps: int,
        op: str,
        predivide: float,
        fusion_threshold: int | None,
        comm: str | None,
        server_optimizer: Any,
        sparse_as_dense: bool,
        average_aggregated_gradients: bool,
        scope: Runtime | Backend | None,
    ) -> None:
        backend = scope if isinstance(scope, Backend) else (scope or default).backend()
        if comm is not None and comm != backend.comm and backend.comm != "solo":
            raise ValueError(
                f"comm={comm!r}, but trainer_core.torch was initialized with comm={backend.comm!r}"
            )
        if server_optimizer is not None and backend.comm != "ps":
            raise ValueError("server_optimizer needs comm='ps' (a job with parameter servers: -s 1 or more)")
        if backend.comm == "ps" and isinstance(compression, Residual) and compression.per_parameter:
            raise ValueError(
                "Compression.powersgd needs comm='allreduce' (a job without servers: -s 0): the KV "
                "store's keys are flat and PowerSGD sends arrays of fewer than two dimensions raw, so "
                "through the servers every gradient would travel in 32 bits"
            )
        if op not in (Average, Sum) and (isinstance(compression, Residual) or backend.comm == "ps"):
            raise ValueError(f"op={op!r}: compressed and parameter-server reductions sum or average only")
        if predivide != 1.0 and server_optimizer is not None:
            raise ValueError(
                "gradient_predivide_factor does not apply with server_optimizer (the servers average)"
            )
        #: Horovod's: each parameter's name
        self._parameter_names = {p: n for n, p in named}
        # as Horovod's, only the parameters that require a gradient are exchanged
        named = [(n, p) for n, p in named if p.requires_grad]
        self._params = [p for _, p in named]
        self._names = [n for n, _ in named]
        self._backend = backend
        self._agreed: BaseException | bool = False  # the ranks' models compared (or how they differ)
        for n, p in named:
            if p.dtype not in FLOATS:
                raise ValueError(
                    f"parameter {n!r} is {p.dtype}: gradients must be float16, bfloat16, float32 or float64"
                )
        residual = isinstance(compression, Residual)
        sizes = [(str(p.dtype), p.numel() * p.element_size()) for p in self._params]
        heap.keep_in_heap(sum(n for _, n in sizes))  # (freed by zero_grad, allocated by backward)
        if fusion_threshold is None:  # Horovod's HOROVOD_FUSION_THRESHOLD, where it was set
            given = backend.fusion
            fusion_threshold = given.threshold if given is not None and given.explicit else FUSION_THRESHOLD
        limit = 0 if residual and compression.per_parameter else fusion_threshold
        plan = bucketing.plan(sizes, limit, None if residual else bucketing.ALONE)
        self._tracker = bucketing.Tracker(plan)
        self._exchange = Exchange(
            backend, op, compression, str(next(_ids)), self._params, plan, server_optimizer
        )
        self._bpps = bpps
        self._average_aggregated = average_aggregated_gradients
        self._predivide = predivide
        self._scale = (1.0 / bpps if average_aggregated_gradients else 1.0) / predivide
        self._sparse_as_dense = sparse_as_dense
        self._delay = [bpps] * len(self._params)
        self._passes = 0  # backward passes ended since the last synchronize
        self._in_backward = False
        self._pending: list[Pending] = []
        self._synchronized = False
        self._should_synchronize = True
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(self._params)
        ]

    def _rebind(self, backend: Any) -> None:
        """After an elastic job's workers changed (``hvd.elastic``'s reset): the same buckets over
        ``backend``, the new group's, and nothing pending (the step the change cut short is
        dropped: the state goes back to its last commit); the models are compared again."""
        if backend is not self._backend:
            ex = self._exchange
            self._backend, self._agreed = backend, False
            self._exchange = Exchange(
                backend, ex.op, ex.compression, str(next(_ids)), self._params, ex.buckets, None
            )
        self._pending = []
        self._tracker.reset()
        self._delay = [self._bpps] * len(self._params)
        self._passes, self._in_backward, self._synchronized = 0, False, False

    @property
    def backward_passes_per_step(self) -> int:
        return self._bpps

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Horovod's: change how many backward passes make a step (between steps)."""
        if not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, not {passes!r}")
        if self._pending or self._tracker.pending() or self._passes:
            raise ValueError("set_backward_passes_per_step between steps (after step() or synchronize())")
        self._bpps = passes
        self._scale = (1.0 / passes if self._average_aggregated else 1.0) / self._predivide
        self._delay = [passes] * len(self._params)

    def _make_hook(self, i: int) -> Any:
        def hook(p: torch.Tensor) -> None:
            if self._delay[i] <= 0 or self._passes >= self._bpps:
                raise AssertionError(TOO_MANY)
            if not self._in_backward:  # the first gradient of this pass: see the pass's end
                self._in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._delay[i] -= 1
            if self._delay[i] == 0:
                self._launch(self._tracker.ready(i))

        return hook

    def _end_of_backward(self) -> None:
        """After the last backward pass of a step, the buckets of parameters that got no gradient
        start too (zeros), before anything the caller does next: every rank has started all its
        buckets, in order, when ``backward()`` returns, whichever parameters it used (an allreduce
        of the loss before ``step()`` then comes after them everywhere)."""
        self._in_backward = False
        self._passes += 1
        if self._passes == self._bpps:
            self._launch(self._tracker.rest())

    def _grads(self, bucket: int) -> list[torch.Tensor]:
        """The bucket's gradients, ready to send: zeros for a parameter without one (it receives
        the others'), sparse ones refused or made dense, accumulated ones averaged if asked."""
        out = []
        for i in self._tracker.buckets[bucket]:
            p = self._params[i]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse and self._sparse_as_dense:
                p.grad = p.grad.to_dense()
            check_dense(p.grad, f"the gradient of {self._names[i]!r}")
            if self._scale != 1.0:
                p.grad.mul_(self._scale)
            out.append(p.grad)
        return out

    def _agree(self) -> None:
        """Before the first exchange: every rank's parameters have the same names, shapes and
        dtypes (``samemodel``), else ``ModelMismatch`` on every rank (and at every later step)."""
        if self._agreed is True:
            return
        if self._agreed is False:
            b = self._backend
            if getattr(b, "server_optimizer", False):  # the KV path then sums nothing but gradients
                self._agreed = True
                return
            try:
                mine = samemodel.entries(self._names, self._params)
                samemodel.check("DistributedOptimizer", mine, lambda a: b.allgather_async(a).wait(), b.size)
                self._agreed = True
            except samemodel.ModelMismatch as exc:
                self._agreed = exc
        if isinstance(self._agreed, BaseException):
            raise self._agreed

    def _launch(self, started: list[int]) -> None:
        self._agree()
        self._pending += [self._exchange.start(b, self._grads(b)) for b in started]

    def synchronize(self) -> None:
        """Start what has not started, wait for every bucket and write the results."""
        self._launch(self._tracker.rest())
        pending, self._pending = self._pending, []
        try:
            for p in pending:
                try:
                    self._exchange.finish(p)
                except GROUP_FAILURES as e:
                    raise HorovodInternalError(f"the gradients' exchange failed: {e}") from e
            if self._predivide != 1.0:  # Horovod's: 1/f before the sum, f after the mean
                with torch.no_grad():
                    for param in self._params:
                        if param.grad is not None:
                            param.grad.mul_(self._predivide)
        finally:
            self._tracker.reset()
            self._delay = [self._bpps] * len(self._params)
            self._passes = 0
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside skips its synchronize (call ``synchronize()`` first, e.g. to clip)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:  # Horovod warns, and synchronizes again
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(): the gradients are exchanged a second time (already "
                    "reduced ones, so they change with op=Sum). Use `with optimizer.skip_synchronize(): "
                    "optimizer.step()` after synchronize().",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        if self._exchange.server_optimizer:  # the servers updated the parameters
            return closure() if closure is not None else None
        return super().step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._pending or self._tracker.pending():
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                "or optimizer.synchronize(): the gradients' exchange has started"
            )
        super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]


def _named(
    optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]] | None
) -> list[tuple[str, torch.Tensor]]:
    """The optimizer's parameters in its order, with the names given (Horovod's checks)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if named_parameters is None:
        return [
            (f"allreduce.noname.{i}.{j}", p)
            for i, g in enumerate(optimizer.param_groups)
            for j, p in enumerate(g["params"])
        ]
    named = list(named_parameters)
    if any(not isinstance(t, tuple) or len(t) != 2 for t in named):
        raise ValueError("named_parameters must be (name, parameter) pairs, e.g. model.named_parameters()")
    names = [n for n, _ in named]
    if len(set(names)) < len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"named_parameters has duplicate names: {dup}")
    by_id = {id(p): n for n, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in by_id]
    if unnamed:
        raise ValueError(
            f"named_parameters was specified, but {len(unnamed)} of the optimizer's parameters are not named "
            f"in it (indices {unnamed[:5]}): pass the model's named_parameters()"
        )
    return [(by_id[id(p)], p) for p in params]


def DistributedOptimizer(  # Horovod's name
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: str | None = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
    *,
    fusion_threshold: int | None = None,
    comm: str | None = None,
    server_optimizer: Any = None,
    average_aggregated_gradients: bool = False,
    runtime: Runtime | None = None,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that its ``step`` applies the gradients reduced over every worker
    (see the module's text). ``comm``: ``"allreduce"`` or ``"ps"``, as ``init`` chose (a check);
    ``server_optimizer`` (``comm="ps"``): a ``trainer_core.optim.server.SGD``/``Adam`` or a spec the
    servers apply; ``fusion_threshold``: bytes per bucket (default: ``HOROVOD_FUSION_THRESHOLD`` where
    it was set at ``init()``, else ``FUSION_THRESHOLD``). ``gradient_predivide_factor`` (with
    ``op=Average``) divides the gradients by it before the sum and multiplies the mean by it, as
    Horovod's; ``groups``/``num_groups`` are checked as Horovod checks them and kept (``groups``),
    but the gradients are fused by ``fusion_threshold``'s buckets (the results are the same);
    ``process_set``: the gradients are reduced among the set's ranks (Horovod's; with
    ``op=Adasum`` the updates are combined among them, which Horovod refuses)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(
            f"DistributedOptimizer wraps a torch.optim.Optimizer, not {type(optimizer).__name__}"
        )
    if isinstance(optimizer, _Distributed):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("LBFGS is not supported (its step runs the closure many times)")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an int >= 1, not {backward_passes_per_step!r}")
    if fusion_threshold is not None and (not isinstance(fusion_threshold, int) or fusion_threshold < 0):
        raise ValueError(f"fusion_threshold must be a number of bytes >= 0, not {fusion_threshold!r}")
    how = resolve_op(None, op)
    if how == Product:
        raise ValueError("DistributedOptimizer reduces with op=Average, Sum, Min, Max or Adasum, not Product")
    scope = in_set(process_set, "DistributedOptimizer", runtime)
    if how == Adasum:
        if isinstance(check(compression), Residual):
            raise ValueError(
                "DistributedOptimizer(op=Adasum) sends the updates with Compression.none or .fp16, "
                "not a trainer_core compressor"
            )
        return adasum_optimizer(optimizer, backward_passes_per_step, compression, runtime, process_set)
    if isinstance(gradient_predivide_factor, bool) or not isinstance(gradient_predivide_factor, int | float):
        raise ValueError(f"gradient_predivide_factor must be a number, not {gradient_predivide_factor!r}")
    if gradient_predivide_factor != 1.0 and how != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, not {gradient_predivide_factor}")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` (as in Horovod)",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    _check_groups(groups)
    comp = check(compression)
    named = _named(optimizer, named_parameters)
    cls = type(optimizer.__class__.__name__, (_Distributed, optimizer.__class__), {})
    dist: Any = object.__new__(cls)
    dist.__dict__.update(optimizer.__dict__)  # the same param_groups, state and hooks: no copy
    dist._setup(
        named,
        comp,
        backward_passes_per_step,
        how,
        float(gradient_predivide_factor),
        fusion_threshold,
        comm,
        server_optimizer,
        sparse_as_dense,
        average_aggregated_gradients,
        scope,
    )
    dist.op = how
    dist.gradient_predivide_factor = gradient_predivide_factor
    dist.sparse_as_dense = sparse_as_dense
    dist.process_set = process_set
    dist._groups = groups
    return dist


def _check_groups(groups: Any) -> None:
    """Horovod's checks of ``groups``: a number > 0 or lists of distinct tensors."""
    if groups is None:
        return
    if isinstance(groups, list):
        seen: set[int] = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
        return
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
