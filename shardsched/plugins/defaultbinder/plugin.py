"""DefaultBinder: binds through the cluster backend (``pods/binding`` on a real API server).

The write itself is done by the runtime in batches; this plugin marks the Bind extension point
in profiles, as kube's DefaultBinder does."""

from __future__ import annotations

from shardsched.framework.interface import BindPlugin

NAME = "DefaultBinder"


class DefaultBinder(BindPlugin):
    name = NAME


def new(args=None) -> DefaultBinder:
    return DefaultBinder()
