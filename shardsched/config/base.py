"""What every config model shares: YAML camelCase / Python snake_case, strict types, unknown fields
rejected, and field paths written the way a YAML author reads them.

kube-scheduler decodes its configuration strictly (unknown or duplicate fields are errors, a string
where a number belongs is an error) and treats an explicit ``null`` as "not set"; `ConfigModel`
does the same.
"""

from __future__ import annotations

import difflib
import types
from typing import Annotated, Any, Iterable, NoReturn, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

#: pydantic error type of the errors raised by `fail`
ERROR_TYPE = "shardsched_config"

Loc = tuple[str | int, ...]


class ConfigModel(BaseModel):
    """Base of the config models: camelCase aliases, strict types, ``extra="forbid"``, frozen.

    Python code may construct models with snake_case names; YAML is validated by alias only
    (``model_validate(data, by_name=False)``), so a snake_case key in a file is an unknown field.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=True,
        extra="forbid",
        strict=True,
        frozen=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        """An explicit ``null`` means "not set" (as a nil pointer after JSON decoding upstream)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


def fail(message: str, *subpath: str | int) -> NoReturn:
    """Raise a validation error from inside a validator.

    Args:
        message: what is wrong, phrased to follow the path ("must be 1", "duplicate of ...").
        subpath: field names and list indexes below the validated value that the error is about
            (``"resources", 0, "weight"``), or a tail already written as a path
            (``".nodeSelectorTerms[0].key"``); `error_lines` appends them to pydantic's location.
    """
    raise PydanticCustomError(ERROR_TYPE, "{message}", {"message": message, "subpath": tuple(subpath)})


def fail_from(exc: ValidationError) -> NoReturn:
    """Raise the first error of a nested validation (of a value that is kept as a plain dict)."""
    err = exc.errors()[0]
    fail(_message(err), *err["loc"], *(err.get("ctx") or {}).get("subpath", ()))


def render_path(loc: Iterable[str | int]) -> str:
    """A location as YAML readers write it: ``("profiles", 0, "pluginConfig")`` -> ``profiles[0].pluginConfig``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part[:1] in (".", "["):  # a tail already written as a path (``.terms[0].key``)
            out += part
        else:
            out += f".{part}" if out else part
    return out


def _message(err: Any) -> str:
    kind, msg, ctx = err["type"], err["msg"], err.get("ctx") or {}
    if kind == ERROR_TYPE:
        return ctx["message"]
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required"
    if kind == "literal_error":
        choices = [c.strip().strip("'") for c in ctx["expected"].replace(" or ", ", ").split(", ")]
        return f"must be one of {', '.join(choices)} (got {err['input']!r})"
    if msg.startswith("Input should be "):
        return "must be " + msg[len("Input should be "):]
    return msg[:1].lower() + msg[1:]


def _unwrap(tp: Any) -> Any:
    """The type an annotation validates to: ``Optional[X]``/``X | None`` and ``Annotated[X, ...]`` give X."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def field_names(model: Any, loc: Loc) -> list[str]:
    """YAML names of the fields of the model found at ``loc`` below ``model`` (through fields,
    list items and dict values), or [] when there is no model there."""
    tp = model
    for part in loc:
        tp = _unwrap(tp)
        origin, args = get_origin(tp), get_args(tp)
        if isinstance(part, int) and origin in (list, tuple) and args:
            tp = args[0]
        elif origin is dict and len(args) == 2:
            tp = args[1]
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            info = next((f for n, f in tp.model_fields.items() if (f.alias or n) == part), None)
            if info is None:
                return []
            tp = info.annotation
        else:
            return []
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [f.alias or n for n, f in tp.model_fields.items()]
    return []


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the closest of ``choices`` to a misspelt ``name`` (difflib), or ""."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def error_lines(exc: ValidationError, prefix: Loc = (), model: Any = None) -> list[tuple[str, str]]:
    """pydantic's errors as ``(field path, message)`` pairs, the path under ``prefix``; an
    unknown field of ``model`` (the validated model class) says which known field is closest."""
    out = []
    for err in exc.errors():
        loc = prefix + tuple(err["loc"]) + tuple((err.get("ctx") or {}).get("subpath", ()))
        message = _message(err)
        if err["type"] == "extra_forbidden" and model is not None and err["loc"]:
            message += did_you_mean(str(err["loc"][-1]), field_names(model, tuple(err["loc"][:-1])))
        out.append((render_path(loc), message))
    return out
