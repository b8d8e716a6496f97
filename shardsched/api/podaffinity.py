"""Label selectors, pod (anti-)affinity terms and topology spread constraints of a Pod.

These are the inputs of InterPodAffinity and PodTopologySpread, parsed and validated once (a bad
field raises `InvalidObjectError` with its path, as the API server's validation would refuse it).
Semantics follow apimachinery and kube-scheduler v1.28:

- `LabelSelector` is ``metav1.LabelSelector``: ``matchLabels`` and ``matchExpressions`` ANDed
  (In, NotIn, Exists, DoesNotExist; NotIn and DoesNotExist match a pod without the key). An empty
  selector matches everything; an absent one (None) matches nothing.
- `AffinityTerm` is the scheduler's ``framework.AffinityTerm``: a term's namespaces are its
  ``namespaces`` plus those matched by ``namespaceSelector``; with neither, the namespace of the
  pod that declares it (``getNamespacesFromPodAffinityTerm``).
- `SpreadConstraint` is ``topologySpreadConstraint`` after ``filterTopologySpreadConstraints``:
  ``matchLabelKeys`` already merged into the selector (key In pod's value, for keys the pod has),
  ``nodeAffinityPolicy`` defaulting to Honor and ``nodeTaintsPolicy`` to Ignore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardsched.api.validation import label_value_problem, name_problem, qualified_name_problem
from shardsched.errors import InvalidObjectError

#: the label every namespace carries (kube-apiserver sets it), used by ``namespaceSelector``
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
LABEL_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def namespace_labels_of(obj: Any) -> tuple[str, dict[str, str]]:
    """A Namespace object's (name, labels), with ``kubernetes.io/metadata.name`` set to its name
    as kube-apiserver sets it (v1.21+; an older server's namespaces get it here, so selectors
    behave alike). Labels that are not a mapping count as none.

    Raises: `InvalidObjectError` when ``obj`` has no ``metadata.name``.
    """
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidObjectError("Namespace: metadata.name is required")
    raw = meta.get("labels")
    labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    labels[NAMESPACE_NAME_LABEL] = name
    return name, labels
NODE_INCLUSION_POLICIES = ("Honor", "Ignore")
WHEN_UNSATISFIABLE = ("DoNotSchedule", "ScheduleAnyway")

# A label selector requirement, normalized: (key, operator, sorted values)
LabelRequirement = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A ``metav1.LabelSelector``: all requirements must hold. Hashable (terms are grouped by it).

    Attributes:
        match_labels: ((key, value), ...) sorted; each is ``key In (value)``.
        match_expressions: (key, operator, values) in declaration order.
    """

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[LabelRequirement, ...] = ()

    @property
    def everything(self) -> bool:
        """True for the empty selector, which matches every object."""
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label set satisfies every requirement (apimachinery's ``Selector.Matches``)."""
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        return all(_requirement_matches(r, labels) for r in self.match_expressions)

    def reads(self, key: str) -> bool:
        """Whether the selector's answer can depend on the label ``key``."""
        return any(k == key for k, _ in self.match_labels) or any(r[0] == key for r in self.match_expressions)

    def with_requirements(self, extra: tuple[LabelRequirement, ...]) -> "LabelSelector":
        """This selector with more requirements ANDed (for ``matchLabelKeys``)."""
        return LabelSelector(self.match_labels, self.match_expressions + extra) if extra else self


def _requirement_matches(req: LabelRequirement, labels: Mapping[str, str]) -> bool:
    key, op, values = req
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    return key not in labels  # DoesNotExist


def parse_label_selector(obj: Any, path: str) -> LabelSelector | None:
    """A ``metav1.LabelSelector`` from its dict form; None when ``obj`` is None (matches nothing).

    Raises:
        InvalidObjectError: not an object, a key that is not a qualified name, an unknown operator,
            In/NotIn without values or Exists/DoesNotExist with values (the API server's rules).
    """
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        raise InvalidObjectError("label selector must be an object", path)
    match_labels = obj.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise InvalidObjectError("matchLabels must be a map of strings", f"{path}.matchLabels")
    pairs = []
    for key, value in match_labels.items():
        _check_key(key, f"{path}.matchLabels")
        if isinstance(value, bool) or value is None or not isinstance(value, (str, int, float)):
            raise InvalidObjectError(f"value of {key!r} is not a string", f"{path}.matchLabels.{key}")
        _check_value(str(value), f"{path}.matchLabels.{key}")
        pairs.append((key, str(value)))
    items = obj.get("matchExpressions") or []
    if not isinstance(items, list):
        raise InvalidObjectError("matchExpressions must be a list", f"{path}.matchExpressions")
    exprs = []
    for i, r in enumerate(items):
        p = f"{path}.matchExpressions[{i}]"
        if not isinstance(r, Mapping):
            raise InvalidObjectError("requirement must be an object", p)
        key, op = r.get("key"), r.get("operator")
        _check_key(key, f"{p}.key")
        if op not in LABEL_SELECTOR_OPERATORS:
            raise InvalidObjectError(f"operator {op!r} is not one of {', '.join(LABEL_SELECTOR_OPERATORS)}",
                                     f"{p}.operator")
        values = r.get("values") or []
        if not isinstance(values, list):
            raise InvalidObjectError("values must be a list", f"{p}.values")
        if op in ("In", "NotIn") and not values:
            raise InvalidObjectError(f"{op} needs at least one value", f"{p}.values")
        if op in ("Exists", "DoesNotExist") and values:
            raise InvalidObjectError(f"{op} takes no values", f"{p}.values")
        for j, v in enumerate(values):
            _check_value(str(v), f"{p}.values[{j}]")
        exprs.append((key, op, tuple(sorted(str(v) for v in values))))
    return LabelSelector(tuple(sorted(pairs)), tuple(exprs))


def _check_value(value: str, path: str) -> None:
    problem = label_value_problem(value)
    if problem:
        raise InvalidObjectError(problem, path)


def _int32(value: Any, field: str, path: str) -> int:
    """``value`` as a positive int32 (maxSkew, minDomains), or InvalidObjectError naming the field."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidObjectError(f"{field} {value!r} must be an integer greater than zero", path)
    if not 1 <= value <= 2**31 - 1:
        raise InvalidObjectError(f"{field} {value} must be greater than zero and fit in 32 bits", path)
    return value


def _check_key(key: Any, path: str) -> None:
    if not isinstance(key, str) or not key:
        raise InvalidObjectError("key is missing", path)
    problem = qualified_name_problem(key)
    if problem:
        raise InvalidObjectError(f"key {key!r}: {problem}", path)


@dataclass(frozen=True, slots=True)
class AffinityTerm:
    """One pod (anti-)affinity term, namespaces resolved against the declaring pod.

    Attributes:
        selector: which pods the term is about (None: no pod).
        namespaces: namespaces named by the term, or the declaring pod's when the term names none
            and has no ``namespaceSelector``.
        namespace_selector: namespaces selected by their labels (None: none; empty: all).
        topology_key: the node label whose value defines the term's topology domain.
    """

    selector: LabelSelector | None
    namespaces: frozenset[str]
    namespace_selector: LabelSelector | None
    topology_key: str

    @property
    def key(self) -> tuple:
        """A deterministic, JSON-friendly form (for pod signatures; sets are sorted)."""
        return (repr(self.selector), sorted(self.namespaces), repr(self.namespace_selector), self.topology_key)

    def matches(self, namespace: str, labels: Mapping[str, str], namespace_labels: Mapping[str, str]) -> bool:
        """Whether a pod (its namespace, labels, and its namespace's labels) is one this term is about
        (upstream ``AffinityTerm.Matches``)."""
        if self.selector is None:
            return False
        if namespace not in self.namespaces and (
                self.namespace_selector is None or not self.namespace_selector.matches(namespace_labels)):
            return False
        return self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class PodAffinity:
    """A pod's ``spec.affinity.podAffinity`` and ``podAntiAffinity`` terms.

    Attributes:
        required_affinity / required_anti_affinity: ``requiredDuringSchedulingIgnoredDuringExecution``.
        preferred_affinity / preferred_anti_affinity: ((weight in 1..100, term), ...) of
            ``preferredDuringSchedulingIgnoredDuringExecution``.
    """

    required_affinity: tuple[AffinityTerm, ...] = ()
    required_anti_affinity: tuple[AffinityTerm, ...] = ()
    preferred_affinity: tuple[tuple[int, AffinityTerm], ...] = ()
    preferred_anti_affinity: tuple[tuple[int, AffinityTerm], ...] = ()

    @property
    def key(self) -> tuple:
        """A deterministic, JSON-friendly form (for pod signatures)."""
        return ([t.key for t in self.required_affinity], [t.key for t in self.required_anti_affinity],
                [(w, t.key) for w, t in self.preferred_affinity], [(w, t.key) for w, t in self.preferred_anti_affinity])

    @property
    def empty(self) -> bool:
        return not (self.required_affinity or self.required_anti_affinity
                    or self.preferred_affinity or self.preferred_anti_affinity)

    def reads_label(self, key: str) -> bool:
        """Whether any term's labelSelector reads the pod label ``key``."""
        terms = (*self.required_affinity, *self.required_anti_affinity,
                 *(t for _, t in self.preferred_affinity), *(t for _, t in self.preferred_anti_affinity))
        return any(t.selector is not None and t.selector.reads(key) for t in terms)


NO_POD_AFFINITY = PodAffinity()


def _topology_key(obj: Mapping[str, Any], path: str) -> str:
    """``obj.topologyKey``: required, a qualified name (the API server's rule)."""
    key = obj.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise InvalidObjectError("can not be empty", f"{path}.topologyKey")
    problem = qualified_name_problem(key)
    if problem:
        raise InvalidObjectError(f"{key!r}: {problem}", f"{path}.topologyKey")
    return key


#: a pod affinity term's key lists merged into its labelSelector, and the operator each adds
_TERM_LABEL_KEYS = (("matchLabelKeys", "In"), ("mismatchLabelKeys", "NotIn"))


def _affinity_term(obj: Any, path: str, namespace: str, labels: Mapping[str, str]) -> AffinityTerm:
    """One term; its ``matchLabelKeys`` / ``mismatchLabelKeys`` are merged into its labelSelector
    as ``key In (the pod's value)`` / ``key NotIn (...)`` for the keys the pod has, as the API
    server does on create (MatchLabelKeysInPodAffinity, on by default since v1.31); merging a term
    the API server already merged adds the same requirements again, which changes nothing."""
    if not isinstance(obj, Mapping):
        raise InvalidObjectError("term must be an object", path)
    key = _topology_key(obj, path)
    names = obj.get("namespaces") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidObjectError("namespaces must be a list of names", f"{path}.namespaces")
    for i, n in enumerate(names):
        problem = name_problem(n, label=True)  # namespace names are DNS-1123 labels
        if problem:
            raise InvalidObjectError(problem, f"{path}.namespaces[{i}]")
    ns_selector = parse_label_selector(obj.get("namespaceSelector"), f"{path}.namespaceSelector")
    namespaces = frozenset(names) if names or ns_selector is not None else frozenset((namespace,))
    selector = parse_label_selector(obj.get("labelSelector"), f"{path}.labelSelector")
    extra = []
    for field, operator in _TERM_LABEL_KEYS:
        keys = obj.get(field) or []
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise InvalidObjectError(f"{field} must be a list of label keys", f"{path}.{field}")
        for j, k in enumerate(keys):
            _check_key(k, f"{path}.{field}[{j}]")
            if k in labels:
                extra.append((k, operator, (labels[k],)))
    if selector is not None:
        selector = selector.with_requirements(tuple(extra))
    return AffinityTerm(selector, namespaces, ns_selector, key)


def _terms(kind_obj: Mapping[str, Any], base: str, namespace: str, labels: Mapping[str, str]) -> tuple[tuple, tuple]:
    req_path = f"{base}.requiredDuringSchedulingIgnoredDuringExecution"
    required = kind_obj.get("requiredDuringSchedulingIgnoredDuringExecution")
    required = [] if required is None else required
    if not isinstance(required, list):
        raise InvalidObjectError("must be a list", req_path)
    pref_path = f"{base}.preferredDuringSchedulingIgnoredDuringExecution"
    preferred = kind_obj.get("preferredDuringSchedulingIgnoredDuringExecution")
    preferred = [] if preferred is None else preferred
    if not isinstance(preferred, list):
        raise InvalidObjectError("must be a list", pref_path)
    weighted = []
    for i, p in enumerate(preferred):
        if not isinstance(p, Mapping):
            raise InvalidObjectError("must be an object", f"{pref_path}[{i}]")
        w = p.get("weight")
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 100:
            raise InvalidObjectError(f"weight {w!r} must be an integer in 1..100", f"{pref_path}[{i}].weight")
        weighted.append((w, _affinity_term(p.get("podAffinityTerm"), f"{pref_path}[{i}].podAffinityTerm", namespace,
                                           labels)))
    return (tuple(_affinity_term(t, f"{req_path}[{i}]", namespace, labels) for i, t in enumerate(required)),
            tuple(weighted))


def parse_pod_affinity(affinity: Mapping[str, Any], namespace: str,
                       labels: Mapping[str, str] | None = None) -> PodAffinity:
    """The pod (anti-)affinity of ``spec.affinity`` (a mapping, possibly empty) for a pod in
    ``namespace`` with ``labels`` (what the terms' ``matchLabelKeys`` and ``mismatchLabelKeys`` read).

    Raises:
        InvalidObjectError: a malformed term (an empty ``topologyKey``, a bad selector, a weight
            outside 1..100), with its path under ``spec.affinity``.
    """
    parts: dict[str, tuple[tuple, tuple]] = {}
    for kind in ("podAffinity", "podAntiAffinity"):
        obj = affinity.get(kind)
        if obj is None:
            parts[kind] = ((), ())
            continue
        if not isinstance(obj, Mapping):
            raise InvalidObjectError(f"{kind} must be an object", f"spec.affinity.{kind}")
        parts[kind] = _terms(obj, f"spec.affinity.{kind}", namespace, labels or {})
    out = PodAffinity(parts["podAffinity"][0], parts["podAntiAffinity"][0],
                      parts["podAffinity"][1], parts["podAntiAffinity"][1])
    return NO_POD_AFFINITY if out.empty else out


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """One ``spec.topologySpreadConstraints`` entry, ready to evaluate (module docstring).

    Attributes:
        max_skew: > 0.
        topology_key: the node label that defines the domains.
        when_unsatisfiable: DoNotSchedule (Filter) or ScheduleAnyway (Score).
        selector: the pods counted (same namespace as the pod), ``matchLabelKeys`` merged in.
        min_domains: None, or > 0 (DoNotSchedule only): fewer eligible domains count the global
            minimum as 0.
        node_affinity_policy / node_taints_policy: Honor or Ignore; whether the pod's node
            affinity / its tolerations of NoSchedule and NoExecute taints decide which nodes count.
    """

    max_skew: int
    topology_key: str
    when_unsatisfiable: str
    selector: LabelSelector | None
    min_domains: int | None = None
    node_affinity_policy: str = "Honor"
    node_taints_policy: str = "Ignore"


def _merge_match_label_keys(selector: LabelSelector, keys: list[str], labels: Mapping[str, str],
                            path: str) -> LabelSelector:
    """A constraint's selector with its ``matchLabelKeys`` merged as the API server merges them on
    create (MatchLabelKeysInPodTopologySpreadSelectorMerge, on by default since v1.34): ``key In
    (the pod's value)`` appended for each key the pod has, unless the selector holds that very
    requirement already (a pod the API server merged); then validated as the API server validates
    the merged constraint (``ValidateMatchLabelKeysAndMismatchLabelKeys``): a key of
    ``matchLabelKeys`` may occur once in the selector, as a matchExpression.

    Raises: `InvalidObjectError` at ``path[j]``: a key that is not a qualified name, or a key of
        ``matchLabelKeys`` in matchLabels and matchExpressions, or twice in matchExpressions.
    """
    index: dict[str, int] = {}
    extra: list[LabelRequirement] = []
    for j, k in enumerate(keys):
        _check_key(k, f"{path}[{j}]")
        index[k] = j
        req = (k, "In", (labels[k],)) if k in labels else None
        if req is not None and req not in selector.match_expressions and req not in extra:
            extra.append(req)
    merged = selector.with_requirements(tuple(extra))
    seen = {k for k, _ in merged.match_labels}
    for k, _, _ in merged.match_expressions:
        if k in index and k in seen:
            raise InvalidObjectError(f"{k!r} exists in both matchLabelKeys and labelSelector", f"{path}[{index[k]}]")
        seen.add(k)
    return merged


def parse_spread_constraints(items: Any, labels: Mapping[str, str]) -> tuple[SpreadConstraint, ...]:
    """``spec.topologySpreadConstraints`` of a pod with ``labels``, validated as the API server does.

    Raises:
        InvalidObjectError: maxSkew < 1, an empty or invalid topologyKey, an unknown
            whenUnsatisfiable or node inclusion policy, minDomains < 1 or with ScheduleAnyway,
            matchLabelKeys without a labelSelector or naming a key the selector has, two
            constraints with the same topologyKey and whenUnsatisfiable (``matchLabelKeys``: see
            `_merge_match_label_keys`).
    """
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InvalidObjectError("topologySpreadConstraints must be a list", "spec.topologySpreadConstraints")
    out: list[SpreadConstraint] = []
    seen: set[tuple[str, str]] = set()
    for i, c in enumerate(items):
        path = f"spec.topologySpreadConstraints[{i}]"
        if not isinstance(c, Mapping):
            raise InvalidObjectError("constraint must be an object", path)
        when = c.get("whenUnsatisfiable")
        if when not in WHEN_UNSATISFIABLE:
            raise InvalidObjectError(f"whenUnsatisfiable {when!r} is not one of {', '.join(WHEN_UNSATISFIABLE)}",
                                     f"{path}.whenUnsatisfiable")
        skew = _int32(c.get("maxSkew"), "maxSkew", f"{path}.maxSkew")
        key = _topology_key(c, path)
        if (key, when) in seen:
            raise InvalidObjectError(f"duplicate constraint for topologyKey {key!r} and whenUnsatisfiable {when}",
                                     path)
        seen.add((key, when))
        min_domains = c.get("minDomains")
        if min_domains is not None:
            _int32(min_domains, "minDomains", f"{path}.minDomains")
            if when != "DoNotSchedule":
                raise InvalidObjectError("can only be set when whenUnsatisfiable is DoNotSchedule",
                                         f"{path}.minDomains")
        policies = []
        for field in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
            value = c.get(field)
            if value is not None and value not in NODE_INCLUSION_POLICIES:
                raise InvalidObjectError(f"{value!r} is not one of {', '.join(NODE_INCLUSION_POLICIES)}",
                                         f"{path}.{field}")
            policies.append(value)
        selector = parse_label_selector(c.get("labelSelector"), f"{path}.labelSelector")
        keys = c.get("matchLabelKeys") or []
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise InvalidObjectError("matchLabelKeys must be a list of label keys", f"{path}.matchLabelKeys")
        if keys and selector is None:
            raise InvalidObjectError("must not be specified when labelSelector is not set", f"{path}.matchLabelKeys")
        if selector is not None:
            selector = _merge_match_label_keys(selector, keys, labels, f"{path}.matchLabelKeys")
        out.append(SpreadConstraint(skew, key, when, selector, min_domains,
                                    policies[0] or "Honor", policies[1] or "Ignore"))
    return tuple(out)
