"""Leader election on a ``coordination.k8s.io/v1`` Lease, with the kubernetes client's own support
(``kubernetes.leaderelection``: `LeaderElection` and its `LeaseLock`), as kube-scheduler's
``--leader-elect`` does with client-go's: candidates race to create or take over the Lease; the
holder renews it every ``retry_period_s``; a candidate takes over once the holder has not renewed
for ``lease_duration_s``. Two ``serve`` processes therefore give one active coordinator.

What this module adds around the client's elector, and why:

- `_SafeLeaseLock`: the client's lock only catches ``ApiException``; a connection error would
  escape and end the renew loop without calling ``onstopped_leading`` (a leader that no longer
  renews but keeps scheduling). The wrapper turns every failure into a failed attempt, which the
  elector already handles (retry, and give up leading after ``renew_deadline_s``).
- `LeaderElector.release`: client-go's ``ReleaseOnCancel``. On a graceful stop the leader empties
  ``holderIdentity`` so the standby takes over at its next retry instead of waiting out the lease.
- Losing the lease calls ``on_stopped``; `shardsched serve` then stops scheduling and exits
  non-zero, as kube-scheduler does ("leaderelection lost"), and its supervisor restarts it as a
  candidate.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Callable

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger(__name__)


class _SafeLeaseLock(LeaseLock):
    """`LeaseLock` whose operations report every failure as a failed attempt (module docstring),
    and which refuses to write once released."""

    def __init__(self, name: str, namespace: str, identity: str, api_client: k8s.ApiClient) -> None:
        super().__init__(name, namespace, identity)
        self.api_instance = k8s.CoordinationV1Api(api_client)
        self.released = False

    def get(self, name, namespace):
        try:
            return super().get(name, namespace)
        except Exception as e:  # noqa: BLE001 - any failure is a failed attempt
            log.warning("leader election: reading Lease %s/%s failed: %s", namespace, name, e)
            return False, ApiException(status=0, reason=f"{type(e).__name__}: {e}")

    def create(self, name, namespace, election_record):
        if self.released:
            return False
        try:
            return super().create(name, namespace, election_record)
        except Exception as e:  # noqa: BLE001
            log.warning("leader election: creating Lease %s/%s failed: %s", namespace, name, e)
            return False

    def get_lease_spec(self, leader_election_record, current_spec=None):
        """The client's spec plus ``leaseTransitions``, which it leaves unset: 0 when the Lease is
        created, one more each time the holder changes to a new one (client-go's
        ``LeaderTransitions`` rule); an emptied holder (a release) keeps the count."""
        previous = getattr(current_spec, "holder_identity", None) if current_spec is not None else None
        count = getattr(current_spec, "lease_transitions", None) if current_spec is not None else None
        spec = super().get_lease_spec(leader_election_record, current_spec)
        holder = leader_election_record.holder_identity
        if current_spec is None:
            spec.lease_transitions = 0
        elif holder and holder != previous:
            spec.lease_transitions = (count or 0) + 1
        else:
            spec.lease_transitions = count or 0
        return spec

    def update(self, name, namespace, updated_record):
        if self.released:
            return False
        try:
            return super().update(name, namespace, updated_record)
        except Exception as e:  # noqa: BLE001
            log.warning("leader election: updating Lease %s/%s failed: %s", namespace, name, e)
            return False


class LeaderElector:
    """Runs the client's `LeaderElection` in a daemon thread.

    Args:
        api_client: client whose credentials are used for the Lease.
        name / namespace: the Lease (``--leader-elect-lease-name``/``--leader-elect-lease-namespace``).
        identity: this candidate's holderIdentity (kube-scheduler: ``<hostname>_<uuid>``).
        on_started: called (in its own thread) when this candidate becomes the leader.
        on_stopped: called when it stops being the leader (lease lost, or the elector ended).
        lease_duration_s / renew_deadline_s / retry_period_s: whole seconds, kube-scheduler's
            defaults 15/10/2; the client requires lease > renew > 1.2 x retry and retry >= 1.

    Raises:
        ValueError: durations the client would reject (it would call ``sys.exit``).
    """

    def __init__(self, api_client: k8s.ApiClient, name: str, namespace: str, identity: str,
                 on_started: Callable[[], None], on_stopped: Callable[[], None], lease_duration_s: int = 15,
                 renew_deadline_s: int = 10, retry_period_s: int = 2) -> None:
        lease_duration_s, renew_deadline_s, retry_period_s = int(lease_duration_s), int(renew_deadline_s), int(retry_period_s)
        if not (retry_period_s >= 1 and renew_deadline_s > 1.2 * retry_period_s and lease_duration_s > renew_deadline_s):
            raise ValueError(f"leader election durations: need lease ({lease_duration_s}s) > renew deadline "
                             f"({renew_deadline_s}s) > 1.2 x retry period ({retry_period_s}s), retry period >= 1s")
        self.identity = identity
        self.lock = _SafeLeaseLock(name, namespace, identity, api_client)
        self.leading = threading.Event()
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._stopped_once = threading.Lock()
        self._stopped = False
        self.config = electionconfig.Config(self.lock, lease_duration_s, renew_deadline_s, retry_period_s,
                                            self._started, self._stop_leading)
        self.thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    def start(self) -> "LeaderElector":
        self.thread.start()
        return self

    def _started(self) -> None:
        log.info("leader election: %s is the leader of Lease %s/%s", self.identity, self.lock.namespace, self.lock.name)
        self.leading.set()
        self._on_started()

    def _stop_leading(self) -> None:
        with self._stopped_once:
            if self._stopped:
                return
            self._stopped = True
        was = self.leading.is_set()
        self.leading.clear()
        if was:
            log.error("leader election: %s lost Lease %s/%s", self.identity, self.lock.namespace, self.lock.name)
        self._on_stopped()

    def _run(self) -> None:
        try:
            leaderelection.LeaderElection(self.config).run()
        except Exception:  # noqa: BLE001 - an elector that died must not leave us leading
            log.exception("leader election ended with an error")
        if self.leading.is_set() or not self.lock.released:
            self._stop_leading()

    def release(self) -> None:
        """Graceful stop: stop renewing and, if leading, empty the Lease's holder (client-go's
        ReleaseOnCancel) so that a standby takes over at once. Safe to call when not leading."""
        was_leading = self.leading.is_set()
        self.lock.released = True
        self.leading.clear()
        if not was_leading:
            return
        now = str(datetime.now())
        record = LeaderElectionRecord(None, "1", now, now)
        try:
            lease = self.lock.api_instance.read_namespaced_lease(self.lock.name, self.lock.namespace)
            if lease.spec is not None and lease.spec.holder_identity == self.identity:
                self.lock.lease_reference = lease
                LeaseLock.update(self.lock, self.lock.name, self.lock.namespace, record)
        except Exception as e:  # noqa: BLE001 - the lease then simply expires
            log.warning("leader election: could not release Lease %s/%s: %s", self.lock.namespace, self.lock.name, e)
