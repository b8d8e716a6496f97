"""What every config model shares: YAML camelCase / Python snake_case, strict types, unknown fields
rejected, and field paths written the way a YAML author reads them.

kube-scheduler decodes its configuration strictly (unknown or duplicate fields are errors, a string
where a number belongs is an error) and treats an explicit ``null`` as "not set"; `ConfigModel`
does the same.
"""

from __future__ import annotations

from typing import Any, Iterable, NoReturn

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


def error_lines(exc: ValidationError, prefix: Loc = ()) -> list[tuple[str, str]]:
    """pydantic's errors as ``(field path, message)`` pairs, the path under ``prefix``."""
    out = []
    for err in exc.errors():
        loc = prefix + tuple(err["loc"]) + tuple((err.get("ctx") or {}).get("subpath", ()))
        out.append((render_path(loc), _message(err)))
    return out
