"""Load a ``KubeSchedulerConfiguration`` file into a `SchedulerConfiguration`.

Stages, as kube-scheduler's loader: strict YAML decoding (syntax errors and duplicate keys name the
line), type metadata (``apiVersion``/``kind``), field shapes and defaults (`shardsched.config.schema`),
then the checks of ``ValidateKubeSchedulerConfiguration`` (pkg/scheduler/apis/config/validation)
and of the framework's plugin setup (``NewFramework``): plugin names, the points they implement,
duplicates, plugin args, one queueSort plugin and at least one bind plugin per profile. Every
problem becomes one line of a `ConfigError`: ``<source>: <field path>: <what is wrong>``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from shardsched.config.args import ARGS_TYPES, PluginArgs, validate_plugin_args
from shardsched.config.base import Loc, error_lines, render_path
from shardsched.config.merge import PluginSet, guarded_plugins, resolve_plugins
from shardsched.config.registry import (
    API_VERSION, DEFAULT_SCHEDULER_NAME, DEPRECATED_API_VERSIONS, KIND,
    MULTI_POINT, PLUGIN_POINTS, UNIMPLEMENTED_PLUGINS, PluginRef, unsupported_plugin_message,
)
from shardsched.config.schema import FileSpec, PluginConfigSpec, PluginEntry, PluginsSpec, ProfileSpec
from shardsched.config.types import Profile, SchedulerConfiguration
from shardsched.errors import ConfigError

log = logging.getLogger(__name__)

Problems = list[tuple[str, str]]


def load_config(source: str | os.PathLike[str] | None = None) -> SchedulerConfiguration:
    """Load the scheduler configuration.

    Args:
        source: a path (``str`` or ``PathLike``), YAML text (a ``str`` containing a newline), or
            None. None, and text that is ``""`` or only comments, give the default configuration:
            one profile ``default-scheduler`` with kube's default plugins.

    Raises:
        ConfigError: the file cannot be read, holds no document (empty or only comments:
            kube-scheduler cannot decode it either), or the configuration is invalid; one line per
            problem, ``<file>: <field path>: <message>`` (``<file>: line N, column M: ...`` for
            YAML syntax).
    """
    if source is None:
        return parse_config("", "<defaults>")
    if isinstance(source, str) and ("\n" in source or not source.strip()):
        return parse_config(source, "<string>")
    path = os.fspath(source)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: cannot read: not UTF-8 text") from None
    return parse_config(text, path, empty_is_default=False)


def parse_config(text: str, source: str = "<string>", empty_is_default: bool = True) -> SchedulerConfiguration:
    """Parse YAML ``text``; ``source`` names it in error messages. See `load_config`.

    ``empty_is_default``: text without a document gives the default configuration; when False
    (a file) it is a `ConfigError`, as kube-scheduler's ``--config`` decoding.
    """
    data = _read_yaml(text, source)
    if data is None:
        if not empty_is_default:
            raise ConfigError(f"{source}: no {KIND} document (the file is empty or only comments); "
                              f"leave out the configuration file for kube's defaults")
        data = {"apiVersion": API_VERSION, "kind": KIND}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a {KIND} object, got {type(data).__name__}")
    _raise(source, _check_type_meta(data, source))
    try:
        spec = FileSpec.model_validate(data, by_name=False)
    except ValidationError as exc:
        problems = error_lines(exc, model=FileSpec)
        flagged = {path for path, _ in problems}
        problems += [p for p in _plugin_name_problems(data) if p[0] not in flagged]
        raise _error(source, problems) from None
    profiles, problems = _profiles(spec)
    _raise(source, problems)
    return SchedulerConfiguration(
        profiles=profiles,
        percentage_of_nodes_to_score=spec.percentage_of_nodes_to_score,
        pod_initial_backoff_s=spec.pod_initial_backoff_seconds,
        pod_max_backoff_s=spec.pod_max_backoff_seconds,
        pod_max_in_unschedulable_s=spec.pod_max_in_unschedulable_pods_duration_seconds,
        max_scheduling_attempts=spec.shardsched.max_scheduling_attempts,
        parallelism=spec.parallelism,
        client_connection=spec.client_connection,
        leader_election=spec.leader_election,
        api_version=spec.api_version,
        source=source,
    )


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader that rejects a key given twice in one mapping (kube decodes strictly)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first_node = first.setdefault(key, key_node)
            except TypeError:  # an unhashable key; the base class reports it
                continue
            if first_node is not key_node:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first_node.start_mark.line + 1})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(text: str, source: str) -> Any:
    """The one document of ``text`` (None if there is none), or ConfigError naming the line."""
    try:
        docs = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        context = f" ({exc.context})" if exc.context else ""
        raise ConfigError(f"{source}:{where} invalid YAML: {exc.problem}{context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from None
    if len(docs) > 1:
        raise ConfigError(f"{source}: expected one {KIND} document, found {len(docs)}")
    return docs[0] if docs else None


def _check_type_meta(data: dict[str, Any], source: str) -> Problems:
    problems = []
    version = data.get("apiVersion")
    if version in DEPRECATED_API_VERSIONS:
        log.warning("%s: apiVersion %s is deprecated (removed in kube-scheduler v1.29); use %s",
                    source, version, API_VERSION)
    elif version != API_VERSION:
        got = "missing" if version is None else f"got {version!r}"
        problems.append(("apiVersion", f"must be {API_VERSION} ({got})"))
    kind = data.get("kind")
    if kind != KIND:
        problems.append(("kind", f"must be {KIND} ({'missing' if kind is None else f'got {kind!r}'})"))
    return problems


def _profiles(spec: FileSpec) -> tuple[list[Profile], Problems]:
    """Resolve every profile; upstream: a missing profile list is one default profile, whose name
    defaults to ``default-scheduler`` only when it is the only one; names are unique."""
    specs = spec.profiles or [ProfileSpec()]
    problems: Problems = []
    profiles: list[Profile] = []
    first_with: dict[str, int] = {}
    for i, profile_spec in enumerate(specs):
        loc: Loc = ("profiles", i)
        name = profile_spec.scheduler_name
        if name is None and len(specs) == 1:
            name = DEFAULT_SCHEDULER_NAME
        name_path = render_path(loc + ("schedulerName",))
        if not name:
            problems.append((name_path, "required (each of several profiles needs its own name)"
                             if name is None else "must not be empty"))
        elif name in first_with:
            problems.append((name_path, f"{name!r} is already the name of profiles[{first_with[name]}]"))
        else:
            first_with[name] = i
        profile, profile_problems = _profile(profile_spec, name or "", loc, spec.percentage_of_nodes_to_score)
        problems += profile_problems
        if profile is not None:
            if profiles and profile.plugins.get("queueSort") != profiles[0].plugins.get("queueSort"):
                # upstream's validateCommonQueueSort: one queue orders the pods of every profile
                problems.append((render_path(loc + ("plugins", "queueSort")),
                                 "queueSort must be the same for all profiles (profiles[0]'s: "
                                 f"{', '.join(r.name for r in profiles[0].plugins.get('queueSort', ()))})"))
            profiles.append(profile)
    return profiles, problems


def _profile(spec: ProfileSpec, name: str, loc: Loc, percentage: int | None) -> tuple[Profile | None, Problems]:
    problems: Problems = []
    sets: dict[str, PluginSet] = {}
    for point, set_spec in spec.plugins.by_point().items():
        point_loc = loc + ("plugins", point)
        problems += _check_enabled(point, set_spec.enabled, point_loc + ("enabled",))
        problems += _check_disabled(set_spec.disabled, point_loc + ("disabled",))
        sets[point] = PluginSet(tuple(PluginRef(e.name, e.weight) for e in set_spec.enabled),
                                tuple(e.name for e in set_spec.disabled))
    plugin_args, args_problems = _plugin_config(spec.plugin_config, loc + ("pluginConfig",))
    problems += args_problems
    if problems:
        return None, problems

    plugins = resolve_plugins(sets)
    if "queueSort" not in plugins:
        problems.append((render_path(loc + ("plugins", "queueSort")),
                         "exactly one queueSort plugin is required (PrioritySort); all are disabled"))
    elif len(plugins["queueSort"]) > 1:
        problems.append((render_path(loc + ("plugins", "queueSort")),
                         "exactly one queueSort plugin is required; enabled: "
                         + ", ".join(r.name for r in plugins["queueSort"])))
    if "bind" not in plugins:
        problems.append((render_path(loc + ("plugins", "bind")),
                         "at least one bind plugin is required (DefaultBinder); all are disabled"))
    enabled = {ref.name for refs in plugins.values() for ref in refs}
    for plugin, args_type in ARGS_TYPES.items():
        if plugin in enabled and plugin not in plugin_args:
            plugin_args[plugin] = args_type()
    if spec.percentage_of_nodes_to_score is not None:
        percentage = spec.percentage_of_nodes_to_score
    return Profile(name, plugins, plugin_args, percentage, guarded_plugins(sets)), problems


def _check_enabled(point: str, entries: list[PluginEntry], loc: Loc) -> Problems:
    """Enabled names: supported, implementing ``point`` (upstream ``updatePluginList``), not twice."""
    return _check_enabled_names(point, [e.name for e in entries], loc)


def _check_enabled_names(point: str, names: list[str | None], loc: Loc) -> Problems:
    """`_check_enabled` over the names (None: an entry without a usable name, skipped)."""
    problems: Problems = []
    first_at: dict[str, int] = {}
    for j, name in enumerate(names):
        path = render_path(loc + (j, "name"))
        if name is None:
            continue
        if name == "*":
            problems.append((path, '"*" is only allowed in disabled lists'))
        elif name not in PLUGIN_POINTS:
            problems.append((path, unsupported_plugin_message(name)))
        elif point != MULTI_POINT and point not in PLUGIN_POINTS[name]:
            problems.append((path, f"{name} does not implement {point} (it implements "
                                   f"{', '.join(PLUGIN_POINTS[name])})"))
        elif name in first_at:
            problems.append((path, f"{name} is already enabled at {render_path(loc + (first_at[name],))}"))
        else:
            first_at[name] = j
    return problems


def _check_disabled(entries: list[PluginEntry], loc: Loc) -> Problems:
    """Disabled names: ``"*"``, a supported plugin, or a kube plugin shardsched does not implement."""
    return _check_disabled_names([e.name for e in entries], loc)


def _check_disabled_names(names: list[str | None], loc: Loc) -> Problems:
    """`_check_disabled` over the names (None: skipped)."""
    return [(render_path(loc + (j, "name")), unsupported_plugin_message(name) + '; "*" disables all')
            for j, name in enumerate(names)
            if name is not None and name != "*" and name not in PLUGIN_POINTS and name not in UNIMPLEMENTED_PLUGINS]


def _plugin_name_problems(data: dict[str, Any]) -> Problems:
    """The plugin name problems of a document whose shape is invalid elsewhere, read from the raw
    data where it has the expected shape, so that one run names every mistake (a misspelt field and
    a misspelt plugin): `_check_enabled` and `_check_disabled` of every set, and unsupported
    ``pluginConfig`` names."""
    def names(items: Any) -> list[str | None]:
        items = items if isinstance(items, list) else []
        return [i.get("name") if isinstance(i, dict) and isinstance(i.get("name"), str) else None for i in items]

    problems: Problems = []
    points = PluginsSpec.model_fields
    aliases = {info.alias for info in points.values()}
    profiles = data.get("profiles")
    for i, profile in enumerate(profiles if isinstance(profiles, list) else ()):
        if not isinstance(profile, dict):
            continue
        loc: Loc = ("profiles", i)
        plugins = profile.get("plugins")
        for point, sets in (plugins.items() if isinstance(plugins, dict) else ()):
            if point in aliases and isinstance(sets, dict):
                problems += _check_enabled_names(point, names(sets.get("enabled")), loc + ("plugins", point, "enabled"))
                problems += _check_disabled_names(names(sets.get("disabled")), loc + ("plugins", point, "disabled"))
        for j, name in enumerate(names(profile.get("pluginConfig"))):
            if name is not None and name not in PLUGIN_POINTS:
                problems.append((render_path(loc + ("pluginConfig", j, "name")), unsupported_plugin_message(name)))
    return problems


def _plugin_config(entries: list[PluginConfigSpec], loc: Loc) -> tuple[dict[str, PluginArgs], Problems]:
    """Args by plugin name for the plugins that have an args type; names supported and given once
    (upstream ``validatePluginConfig``)."""
    problems: Problems = []
    args: dict[str, PluginArgs] = {}
    first_at: dict[str, int] = {}
    for j, entry in enumerate(entries):
        path = render_path(loc + (j, "name"))
        if entry.name not in PLUGIN_POINTS:
            problems.append((path, unsupported_plugin_message(entry.name)))
            continue
        if entry.name in first_at:
            problems.append((path, f"{entry.name} is already configured at {render_path(loc + (first_at[entry.name],))}"))
            continue
        first_at[entry.name] = j
        parsed, args_problems = validate_plugin_args(entry.name, entry.args, loc + (j, "args"))
        problems += args_problems
        if parsed is not None and entry.name in ARGS_TYPES:
            args[entry.name] = parsed
    return args, problems


def _error(source: str, problems: Problems) -> ConfigError:
    return ConfigError("\n".join(f"{source}: {path}: {message}" for path, message in problems))


def _raise(source: str, problems: Problems) -> None:
    if problems:
        raise _error(source, problems)
