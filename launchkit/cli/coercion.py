"""Values taken as typer would take them, without typer's coercion where the result is plain.

typer (0.29) coerces every parameter it processes, given on the command line or not, through a
pydantic adapter it builds for that parameter; the first one imports pydantic. A short command
(``launch --dry-run``, ``ps``) spent about a third of its CPU there: ``launch`` has dozens of
parameters a run seldom gives, and every command has a help option. Every command and
group of the CLI is a ``Command`` or a ``Group``: as it lists its parameters to parse them (the
help option included), each one's processing is wrapped (``spare_coercion``) so that a value
whose coercion is known (``as_typer_would``: nothing given, a word for a text parameter, plain
digits for a number, a default already of its type) is taken as it is; anything else (a path, a
choice, ``-1``, ``2.5x``, an empty word, which ``app.refuse_empty`` refuses) and a required
parameter not given go through typer as before, with its own refusals. The parameter's callback
runs either way. With a typer that coerces otherwise (no ``type_descriptor`` on its parameters)
nothing is spared.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup

_COERCE = object()  # as_typer_would's answer where only typer's coercion knows
_DIGITS = 15  # plain digits up to this many are an int (or float) for pydantic as for int()


class SparesCoercion:
    """A command whose parameters, as it lists them, are processed by ``spare_coercion``."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = list(super().get_params(ctx))  # type: ignore[misc]
        spare_coercion(params)
        return params


class Command(SparesCoercion, TyperCommand):
    """Every command of the CLI (``cls=``)."""


class Group(SparesCoercion, TyperGroup):
    """The root and ``hosts`` (``typer.Typer(cls=...)``)."""


def spare_coercion(params: list[Any]) -> None:
    """Wrap the processing of each of ``params`` (once) to take a plain value as it is."""
    for param in params:
        if getattr(param, "spares_coercion", False):
            continue
        process = param.process_value

        def spared(ctx: Any, value: Any, process: Any = process, param: Any = param) -> Any:
            source = ctx.get_parameter_source(param.name)
            kept = as_typer_would(param, value, default=getattr(source, "name", None) == "DEFAULT")
            if kept is _COERCE or (param.required and param.value_is_missing(kept)):
                return process(ctx, value)
            return kept if param.callback is None else param.callback(ctx, param, kept)

        param.spares_coercion = True
        param.process_value = spared


def as_typer_would(param: Any, value: Any, *, default: bool = False) -> Any:
    """What typer's coercion makes of ``value`` for ``param``, where that is known without it,
    else ``_COERCE``: None (not given) stays None, ``()`` for a multi-value parameter; a list of
    words for ``list[str]`` is a list of them; for a parameter of type str, int or float without
    typer's ``parser``, ``min`` or ``max``: a value of that type is itself, a word for str is
    itself, plain ASCII digits (with a decimal part for float) are the number. An empty word given
    is never taken here (the CLI refuses it, ``app.refuse_empty``, in typer's processing); as a
    ``default`` (``--mpi-args``'s) it is."""
    descriptor: Any = getattr(param, "type_descriptor", None)
    info = getattr(descriptor, "parameter_info", None)
    if info is None or (info.parser, info.min, info.max) != (None, None, None):
        return _COERCE
    kind = descriptor.annotation
    if value is None:
        return () if param.multiple or param.nargs == -1 else None
    if param.multiple or param.nargs == -1:
        if kind == list[str] and isinstance(value, list | tuple) and all(type(v) is str and v for v in value):
            return list(value)
        return _COERCE
    if kind not in (str, int, float) or (value == "" and not default):
        return _COERCE
    if type(value) is kind:
        return value
    if type(value) is str and kind is not str and _plain_number(value, decimal=kind is float):
        return kind(value)
    return _COERCE


def _plain_number(word: str, *, decimal: bool) -> bool:
    whole, dot, part = word.partition(".") if decimal else (word, "", "")
    digits = [whole, part] if dot else [whole]
    return (
        len(word) <= _DIGITS
        and word.isascii()
        and all(d.isdigit() for d in digits)  # (each non-empty: "".isdigit() is False)
    )
