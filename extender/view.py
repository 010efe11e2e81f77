"""The extender's picture of the cluster, which the filter and prioritize answers are drawn from
(`extender.verbs`).

`ClusterView` is changed only on the event loop: the informers run there and hand it finished
values, so there is no lock to wedge and a request never waits on the API server. It holds

- the Nodes by name (parsed `NodeFacts`), for node-cache mode, where the scheduler sends names;
- a `UsageLedger` of the requests of planned Pods bound to each node, rebuilt from a list after
  a restart and kept current by a watch;
- a policy feed (`policy_io.feed`) per tenant namespace (`extender.tenants`), each profile
  verified once per ConfigMap revision, whose snapshot gives the binding a Pod's plan names and
  the accelerator it attests; the ledger is one for every tenant, so tenants sharing a node are
  accounted together, and it keeps each node's accounted shares by tenant, so a share is kept
  off a GPU where another tenant's share sits (`inference_policy.placing.tenancy`; each tenant's
  current profile says whether its shares may meet others');
- a decayed histogram of the GPU requests it has been asked to place (`RequestMix`, each Pod
  counted once, by UID), the workload distribution the fragmentation-aware score is taken
  against. It starts empty after a restart, and the score is plain best fit until the first
  request has been seen.

Accounting, and why it is enough. The extender only sees nodes kube-scheduler already found
feasible for the Pod's native resources, and every binding resource (`nvidia.com/gpu`,
`nvidia.com/mig-*`, the VRAM plugin's `kamiwaza.ai/vram-gb-*`) is a real node-allocatable
extended resource that the rendered configuration lists with `ignoredByScheduler: false`, so the
scheduler's NodeResourcesFit counts it too, including Pods it has assumed but not yet bound. The
ledger here sees planned Pods only once they are bound; it is a second, independent count that
gives the precise reason (which bucket, how much is free) and that still holds if a node's
plugin stops advertising a resource the scheduler would otherwise have to trust.

Answers, on purpose: a Pod without a plan that asks for no accelerator passes every node
untouched. A Pod that asks for one without a plan, a plan that cannot be read, or names a
binding the profile no longer grants, a refused profile, or a Pod that is not what its verified
revision plans for it (`inference_policy.granting.grant.check_grant`, the controller's own check:
the tenant's webhook is the tenant's software, so the owner's extender checks the grant itself, not
only the fit), or a Pod with a demand in a namespace where the allocation controller's rights
are denied (`extender.owner_rights`: its verdict there could not follow the Pod) puts every node
in `FailedAndUnresolvableNodes` with the reason (fail closed, visible in the Pod's events);
`Error` is kept for the extender's own trouble (caches not yet synced, no answer on those rights
to rely on), which fails the cycle so the scheduler retries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from extender.owner_rights import RightsBoard
from extender.tenants import Tenant
from extender.wire import ExtenderFilterResult, HostPriorityList
from inference_policy.base.bounded import keep
from inference_policy.base.codes import NodeVerdictCode
from inference_policy.base.pod_view import PodView
from inference_policy.granting.pod_demand import Unplaceable, outside_every_tenant, pod_demand
from inference_policy.placing.fragmentation import RequestMix
from inference_policy.placing.ledger import UsageLedger
from inference_policy.placing.nodes import NodeFacts, Verdict
from inference_policy.placing.placement import Demand, check_nodes, free_of
from inference_policy.placing.spread import ReplicaIndex
from inference_policy.placing.tenancy import Tenancy, crossing
from policy_io.feed import PolicyFeed
from policy_io.state import PolicySettings, PolicyState

NODES = "nodes"
PROFILE = "profile"
RIGHTS = "controller rights"
# Pods whose request is already in the histogram: a Pending Pod is prioritized on every retry,
# and counting each retry would weigh the workload towards the requests that do not fit.
SEEN_PODS = 10_000


Body = TypeVar("Body", ExtenderFilterResult, HostPriorityList)


@dataclass(frozen=True, slots=True)
class Outcome(Generic[Body]):
    """A filter or prioritize answer plus what the metrics and the log say about it: the count of
    each verdict code, and the code of each node the placement rules refused."""

    body: Body
    outcome: str
    codes: dict[str, int] = field(default_factory=dict)
    node_codes: dict[str, str] = field(default_factory=dict)
    # The candidate nodes a filter call named (None: the call was not read that far).
    nodes: int | None = None


FilterOutcome = Outcome[ExtenderFilterResult]
PriorityOutcome = Outcome[HostPriorityList]

MAX_CYCLES = 64


@dataclass(frozen=True, slots=True)
class Refusal:
    """A remembered Unplaceable."""

    reason: str
    code: NodeVerdictCode


# Pods whose demand (and grant check) is remembered: more than a scheduling queue's worth.
DEMAND_MEMO = 4096


@dataclass(slots=True)
class _Cycle:
    """What earlier scheduling cycles for one demand found, node by node. The next cycle for
    the same deployment (the next replica) sees the same nodes with one node's load changed
    (where the last replica went), so only the nodes whose facts or load changed since are
    judged again.

    Kept by node name, not by position in a candidate list: kube-scheduler sends the filter
    every feasible node, in an order that moves from cycle to cycle (its search starts where the
    last one stopped, and its filters run in parallel), and then sends prioritize only the nodes
    the filter kept. A memo of the last list would miss on every call. A node's entries go when
    its accounted load changes (the ledger's log, read at the next cycle) and when its Node
    object is replaced or removed (`ClusterView.node_changed`, at once). Not frozen: `version`
    moves to the ledger's as the entries it invalidates are dropped."""

    version: int
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    # The node's free amount of the demand's resource (None: the Pod cannot go there at all)
    # and its allocatable, `placement.free_of`'s pair.
    frees: dict[str, tuple[int | None, int]] = field(default_factory=dict)

    def forget(self, name: str) -> None:
        """What was found on this node no longer holds."""
        self.verdicts.pop(name, None)
        self.frees.pop(name, None)


V = TypeVar("V")


def _remembered(
    memo: dict[str, V],
    names: list[str],
    facts: list[NodeFacts | None],
    find: Callable[[list[NodeFacts | None]], list[V | None]],
) -> tuple[list[V | None], int]:
    """Each candidate's entry of `memo`, the missing ones found (by `find`, over their facts,
    None for a node not in the cache) and kept; and how many were found."""
    # Looked up in C; a 5,000-node cycle then costs a pass over the few that changed.
    out: list[V | None] = list(map(memo.get, names))
    missing = [i for i, entry in enumerate(out) if entry is None]
    found = 0
    if missing:
        for i, entry in zip(missing, find([facts[i] for i in missing]), strict=True):
            if entry is not None:
                out[i] = memo[names[i]] = entry
                found += 1
    return out, found


class ClusterView:
    """Nodes, accounted Pods and the verified profile, as last read from the API."""

    def __init__(
        self,
        settings: PolicySettings,
        pod_scopes: Iterable[str],
        clock: Callable[[], datetime],
        rollback_record: str | None = None,
        tenants: Sequence[Tenant] = (),
        rights: RightsBoard | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        # The allocation controller's rights per tenant namespace (`extender.owner_rights`);
        # None: not checked.
        self.rights = rights
        # One feed per tenant namespace (`extender.tenants`), the first is `settings`'. Each
        # re-derives its Pods' plans (the grant check), so it reads the recipe catalogs too;
        # every profile is held to the owner's rollback floor when one is named.
        every = tuple(tenants) or (Tenant(settings, rollback_record),)
        self.feeds: dict[str, PolicyFeed] = {
            t.namespace: PolicyFeed(t.policy, clock=clock, rollback=t.rollback_record)
            for t in every
        }
        self.feed = self.feeds[every[0].namespace]
        self._demands: dict[tuple[str, str, int, int], Demand | Refusal | None] = {}
        self.nodes: dict[str, NodeFacts] = {}
        self.ledger = UsageLedger()
        self.replicas = ReplicaIndex()
        self.pod_scopes = tuple(pod_scopes)
        self._pending: set[str] = {NODES, *(f"pods/{s}" for s in self.pod_scopes)}
        self.events = 0
        # Bumped whenever a Node is listed, changes or leaves (what the room figures key on).
        self.node_revision = 0
        self.mix = RequestMix()
        self._observed: OrderedDict[str, None] = OrderedDict()
        self._cycles: OrderedDict[tuple[Any, ...], _Cycle] = OrderedDict()
        self.recomputed = 0
        # Which resources each tenant's current profile lets its shares share across tenants,
        # as of the feeds' generations `_trusted_at`.
        self._trusted: dict[str, frozenset[str]] = {}
        self._trusted_at: tuple[int, ...] = ()
        self.tenancy = Tenancy(self.ledger.shares_get, self._crosses)

    # -- informer callbacks (event loop only) -------------------------------------------------

    @property
    def policy(self) -> PolicyState:
        """The feed's planning state: the profile in use, its refusal, the owner keys."""
        return self.feed.state

    @property
    def pending(self) -> set[str]:
        """The inputs not read yet: nodes, each Pod scope, each tenant's profile, and the
        controller's rights in each tenant namespace when they are checked."""
        unread = {
            PROFILE if len(self.feeds) == 1 else f"{PROFILE}/{namespace}"
            for namespace, feed in self.feeds.items()
            if not feed.ready
        }
        if self.rights is not None:
            unread.update(f"{RIGHTS}/{namespace}" for namespace in self.rights.pending)
        return {*self._pending, *unread}

    @property
    def ready(self) -> bool:
        return (
            not self._pending
            and all(feed.ready for feed in self.feeds.values())
            and (self.rights is None or not self.rights.pending)
        )

    def replace_nodes(self, nodes: Iterable[NodeFacts]) -> None:
        self.nodes = {node.name: node for node in nodes}
        self.node_revision += 1
        self._pending.discard(NODES)
        self._cycles.clear()

    def node_changed(self, name: str, node: NodeFacts | None) -> None:
        self.events += 1
        self.node_revision += 1
        if node is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = node
        # Its labels or allocatable may differ now.
        for cycle in self._cycles.values():
            cycle.forget(name)

    def replace_pods(
        self,
        scope: str,
        pods: Iterable[tuple[str, tuple[str, dict[str, int]] | None, str | None]],
    ) -> None:
        """Every planned Pod of one scope (a namespace, or * for all) as a list returned them:
        its key, what it holds where, and the deployment it is a replica of."""
        seen: set[str] = set()
        for key, accounted, deployment in pods:
            seen.add(key)
            self._account(key, accounted, deployment)
        prefix = "" if scope == "*" else scope + "/"
        for key in self.ledger.pod_keys():
            if key.startswith(prefix) and key not in seen:
                self.ledger.remove(key)
                self.replicas.apply(key, None, None)
        self._pending.discard(f"pods/{scope}")

    def pod_changed(
        self,
        key: str,
        accounted: tuple[str, dict[str, int]] | None,
        deployment: str | None = None,
    ) -> None:
        self.events += 1
        self._account(key, accounted, deployment)

    def _account(
        self, key: str, accounted: tuple[str, dict[str, int]] | None, deployment: str | None
    ) -> None:
        if accounted is None:
            self.ledger.remove(key)
            self.replicas.apply(key, None, None)
        else:
            self.ledger.upsert(key, *accounted)
            self.replicas.apply(key, deployment, accounted[0])

    @property
    def trust_version(self) -> tuple[int, ...]:
        """Moves whenever a tenant's profile may have changed whether its shares cross tenants."""
        return tuple(feed.generation for feed in self.feeds.values())

    def _crosses(self, tenant: str, resource: str) -> bool:
        version = self.trust_version
        if version != self._trusted_at:
            self._trusted_at = version
            self._trusted = {
                namespace: crossing(profile.envelope if profile is not None else None)
                for namespace, feed in self.feeds.items()
                for profile in (feed.snapshot.profile,)
            }
        # A Pod in no tenant's namespace (another scheduler's) is trusted with no one.
        return resource in self._trusted.get(tenant, ())

    def cycle(self, demand: Demand) -> _Cycle:
        """The remembered verdicts and free capacities for this demand, less those of the nodes
        whose accounted load changed since they were found. A share's also depend on its
        tenant and on whom the tenants' profiles let share a GPU."""
        key = (
            demand.key,
            tuple((n, demand.requests.get(n, 0)) for n in demand.checked),
            (demand.tenant, self.trust_version) if demand.shared else None,
        )
        found = self._cycles.get(key)
        if found is None:
            found = _Cycle(self.ledger.version)
            self._cycles[key] = found
            if len(self._cycles) > MAX_CYCLES:
                self._cycles.popitem(last=False)
            return found
        self._cycles.move_to_end(key)
        if found.version != self.ledger.version:
            changed = self.ledger.changed_since(found.version)
            if changed is None:
                found.verdicts.clear()
                found.frees.clear()
            else:
                for name in changed:
                    found.forget(name)
            found.version = self.ledger.version
        return found

    def verdicts(
        self, demand: Demand, names: list[str], facts: list[NodeFacts | None]
    ) -> list[Verdict | None]:
        """`placement.check` for each of the candidates, `facts` being the node cache's (None:
        a node not in it), judging only those not already judged on their present facts and
        load."""
        verdicts, found = _remembered(
            self.cycle(demand).verdicts,
            names,
            facts,
            lambda nodes: check_nodes(demand, nodes, self.ledger.used, self.tenancy),
        )
        self.recomputed += found
        return verdicts

    def frees(
        self, demand: Demand, names: list[str], facts: list[NodeFacts | None]
    ) -> tuple[list[int | None], int]:
        """`placement.free_capacity` for a one-resource GPU demand over the node cache's
        candidates, finding only what is not already known for their present facts and load."""
        used, tenancy = self.ledger.used, self.tenancy
        entries, found = _remembered(
            self.cycle(demand).frees,
            names,
            facts,
            lambda nodes: [
                None if n is None else free_of(demand, n, used(n.name), tenancy) for n in nodes
            ],
        )
        self.recomputed += found
        frees = [None if entry is None else entry[0] for entry in entries]
        scale = max((entry[1] for entry in entries if entry is not None), default=0)
        return frees, scale

    def observe(self, pod: Mapping[str, Any], demand: Demand) -> None:
        """Add the Pod's request to the workload histogram, once per Pod."""
        if demand.path != "gpu" or len(demand.kind) != 1:
            return
        view = PodView(pod)
        key = view.uid or f"{view.namespace}/{view.name}"
        if key in self._observed:
            return
        self._observed[key] = None
        if len(self._observed) > SEEN_PODS:
            self._observed.popitem(last=False)
        name = demand.kind[0]
        self.mix.observe(name, demand.requests.get(name, 0))

    # -- decisions ----------------------------------------------------------------------------

    def demand(self, pod: Mapping[str, Any]) -> Demand | None:
        """The Pod's demand; None for a Pod without a plan. Raises Unplaceable, or Unconfirmed
        (`extender.owner_rights`) while nothing can be said of the controller's rights.

        Remembered by the Pod's uid and resourceVersion, the policy's generation and the second:
        each scheduling cycle asks twice (filter, then prioritize) and a Pending Pod is asked
        again on every retry, and the grant check re-derives its plan each time (measured: 0.6
        ms of the scheduler's 3.1 ms a Pod without it, bench_scheduling). Within the second, an
        expiring profile is noticed at most that late. The controller's rights in the namespace
        are read afresh each time (`extender.owner_rights`): a Pod with a demand is placed only
        while they are confirmed."""
        now = self.clock()
        view = PodView(pod)
        namespace = view.namespace or ""
        feed = self.feeds.get(namespace)
        if feed is None:
            outside_every_tenant(pod)
            return None
        snapshot = feed.snapshot
        uid, version = view.uid, view.resource_version
        if uid is None or version is None:
            found: Demand | Refusal | None = pod_demand(
                pod, snapshot.context(now), snapshot.revisions, snapshot.options
            )
        else:
            key = (uid, version, snapshot.generation, int(now.timestamp()))
            if key in self._demands:
                found = self._demands[key]
            else:
                try:
                    found = pod_demand(
                        pod, snapshot.context(now), snapshot.revisions, snapshot.options
                    )
                except Unplaceable as refusal:
                    # The reason, not the exception: that would keep its traceback's frames.
                    found = Refusal(refusal.reason, refusal.code)
                keep(self._demands, key, found, DEMAND_MEMO)
        if isinstance(found, Refusal):
            raise Unplaceable(found.reason, found.code)
        if found is not None and self.rights is not None:
            self.rights.check(namespace)
        return found
