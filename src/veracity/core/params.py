"""Submitted parameters against a workflow's signature (pure: no I/O).

A submission's ``params`` are the workflow's positional arguments after its context
(``await fn(ctx, *params)``). :class:`ParamsShape` is read once from the function's
signature; :meth:`ParamsShape.problem` says what is wrong with a list of params, or
None: too few (naming the ones missing), too many (naming how many it takes), or a
keyword-only parameter without a default, which no submission can give.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True, slots=True)
class ParamsShape:
    """What a workflow takes after its context."""

    names: tuple[str, ...]
    """Its positional parameters, in order."""
    required: int
    """How many of them have no default."""
    star_args: bool
    """It takes ``*args``: any number beyond ``names``."""
    keyword_only: tuple[str, ...] = ()
    """Keyword-only parameters without a default: no submission can give them."""
    text: str = ""
    """The parameters as written (after the context), for messages."""

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> ParamsShape | None:
        """The shape of ``fn(ctx, ...)``; None if its signature cannot be read."""
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            return None
        params = [p.replace(annotation=inspect.Parameter.empty)
                  for p in signature.parameters.values()]
        signature = signature.replace(return_annotation=inspect.Signature.empty)
        if params and params[0].kind in _POSITIONAL:
            params = params[1:]  # the context
        elif params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
            # fn(*args): the context is args[0], everything else is accepted
            return cls((), 0, True, (), str(signature.replace(parameters=params)))
        positional = [p for p in params if p.kind in _POSITIONAL]
        return cls(
            names=tuple(p.name for p in positional),
            required=sum(1 for p in positional if p.default is inspect.Parameter.empty),
            star_args=any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params),
            keyword_only=tuple(p.name for p in params
                               if p.kind is inspect.Parameter.KEYWORD_ONLY
                               and p.default is inspect.Parameter.empty),
            text=str(signature.replace(parameters=params)),
        )

    def expects(self) -> str:
        """How many params it takes, in words."""
        if self.star_args:
            return f"at least {self.required}"
        if self.required == len(self.names):
            return f"exactly {self.required}"
        return f"{self.required} to {len(self.names)}"

    def problem(self, params: Sequence[Any]) -> str | None:
        """Why ``params`` cannot be passed to the workflow, or None."""
        if self.keyword_only:
            names = ", ".join(self.keyword_only)
            return (f"it requires keyword-only parameter(s) {names} without a default, "
                    f"which params (positional) cannot give; its parameters: {self.text}")
        given = len(params)
        if given < self.required:
            missing = ", ".join(self.names[given:self.required])
            return (f"it takes {self.expects()} params {self.text}; got {given}: "
                    f"missing {missing}")
        if not self.star_args and given > len(self.names):
            return f"it takes {self.expects()} params {self.text}; got {given}"
        return None


def shapes_of_functions(fns: Mapping[str, Callable[..., Any]]) -> dict[str, ParamsShape]:
    """The shape of each workflow function by its name (those whose signature can be
    read)."""
    out: dict[str, ParamsShape] = {}
    for ffqn, fn in fns.items():
        shape = ParamsShape.of(fn)
        if shape is not None:
            out[ffqn] = shape
    return out
