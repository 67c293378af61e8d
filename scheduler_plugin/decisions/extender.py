"""The extender verbs as functions of decoded JSON: ExtenderArgs in, reply dict out.

No I/O here: filter, prioritize and preempt read the Cache's immutable views and answer in
kube-scheduler's exact shapes (its extender/v1 types; docs/scheduler.md):

- filter: `{"NodeNames"|"Nodes": survivors, "FailedNodes": {...},
  "FailedAndUnresolvableNodes": {...}, "Error": ""}`; the survivors come back in the form
  they arrived in (names when nodeCacheCapable, the NodeList items otherwise). With the
  `best` answer the survivors are the policy's one best node (kube-scheduler then skips
  scoring and prioritize) unless the pod states soft scheduling preferences;
- prioritize: `[{"Host": name, "Score": 0..10}, ...]`, the policy's [0, 1] node score
  scaled and rounded to an integer;
- preempt: `{"NodeNameToMetaVictims": {node: {"Pods": [{"UID": ...}], "NumPDBViolations":
  n}}}` with, per node, the smallest set of the offered victims that frees room for the
  pod's devices; nodes where no subset helps are left out.

Go decodes our replies case-insensitively, but it sends PascalCase and so do we; on input
we accept any casing of the keys, as Go would.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_plugin.decisions.gangs import GangAnswer, Gangs
from scheduler_plugin.decisions.preempt import chosen_victims
from scheduler_plugin.state.cache import Cache
from scheduler_plugin.views.metrics import Metrics
from tessera.cluster_decision import UNKNOWN_NODE, RowVerdicts
from tessera.cluster_index import IntArray
from tessera.errors import InputError, RequestError
from tessera.node_placement import NoFit
from tessera.request import PodParser, PodRequest

log = logging.getLogger(__name__)

MAX_PRIORITY = 10
REASON_PREFIX = "tessera: "
_MAX_CATEGORIES = 4096
"""Failure reasons whose metrics label is kept (they quote node figures, so new ones keep
coming slowly; past this many the memo starts afresh)."""
_REQUEST_CACHE = 4096
_PLAIN_NAMES = re.compile(r"[A-Za-z0-9._-]*")
"""Node names are DNS subdomains: when all are plain, they need no JSON escaping."""
_HEAD = '{"Host":"'
_TAILS = [f'","Score":{k}}}' for k in range(MAX_PRIORITY + 1)]
FILTER_ANSWERS = ("best", "all")
"""What filter returns when the pod fits somewhere: `best`, the policy's best node only
(kube-scheduler binds a lone survivor without scoring: one extender call per pod, and the
node is the policy's choice as in the simulator); `all`, every node where it fits, for
kube-scheduler to weigh with prioritize and its own score plugins."""

_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("tessera: gang ", "gang"),
    ("node is fenced", "fenced"),
    ("no tessera device inventory", "no_inventory"),
    ("device inventory", "inventory_invalid"),
    ("heartbeat", "agent_silent"),
    ("invalid device request", "invalid_request"),
    ("node has no GPUs", "no_gpu"),
    ("of model", "gpu_model"),
    ("UUID", "gpu_uuid_hint"),
    ("unhealthy", "gpu_unhealthy"),
    ("insufficient cpu", "host_resources"),
    ("insufficient memory", "host_resources"),
    ("largest GPU here", "gpu_too_small"),
    ("whole GPUs", "whole_gpus"),
    ("no GPU has", "gpu_share"),
    ("RDMA", "rdma"),
    (" share ", "topology"),
)
"""The labels of tessera_scheduler_node_failures{reason}: the first needle a failure reason
contains names its label."""


def reason_category(reason: str) -> str:
    """A small, fixed label for a free-text failure reason (bounded label cardinality)."""
    for needle, label in _CATEGORIES:
        if needle in reason:
            return label
    return "other"


class BadArgsError(InputError, ValueError):
    """The request body is not ExtenderArgs-shaped (answered with HTTP 400)."""


def get_field(obj: Any, name: str) -> Any:
    """A struct field as Go's encoding/json finds it: exact key first, then any casing."""
    if not isinstance(obj, Mapping):
        return None
    if name in obj:
        return obj[name]
    lower = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == lower:
            return value
    return None


@dataclass(frozen=True)
class _Nodes:
    names: list[str]
    items: list[Any] | None
    """The NodeList items when the call carried full Nodes (nodeCacheCapable false)."""


def _nodes_of(args: Mapping[str, Any]) -> _Nodes:
    names = get_field(args, "NodeNames")
    if names is not None:
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise BadArgsError("NodeNames must be a list of strings")
        return _Nodes(names, None)
    nodes = get_field(args, "Nodes")
    if nodes is None:
        return _Nodes([], None)
    if not isinstance(nodes, Mapping):
        raise BadArgsError("Nodes must be a NodeList object")
    items = get_field(nodes, "items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise BadArgsError("Nodes.items must be a list")
    result = []
    for item in items:
        name = get_field(get_field(item, "metadata"), "name")
        if not isinstance(name, str):
            raise BadArgsError("every node in Nodes.items needs metadata.name")
        result.append(name)
    return _Nodes(result, items)


def _pod_of(args: Any) -> Mapping[str, Any]:
    if not isinstance(args, Mapping):
        raise BadArgsError("the body must be a JSON object")
    pod = get_field(args, "Pod")
    if not isinstance(pod, Mapping):
        raise BadArgsError("Pod is missing or not an object")
    return pod


def _victims_of(args: Mapping[str, Any]) -> dict[str, tuple[list[str], int]]:
    """node -> (victim UIDs, NumPDBViolations) from either victims form."""
    result: dict[str, tuple[list[str], int]] = {}
    meta = get_field(args, "NodeNameToMetaVictims")
    full = get_field(args, "NodeNameToVictims")
    source = meta if meta is not None else full
    if source is None:
        return result
    if not isinstance(source, Mapping):
        raise BadArgsError("NodeNameToMetaVictims / NodeNameToVictims must be objects")
    for node, victims in source.items():
        if not isinstance(victims, Mapping):
            raise BadArgsError(f"victims of {node} must be an object")
        pods = get_field(victims, "Pods") or []
        if not isinstance(pods, list):
            raise BadArgsError(f"victims of {node}: Pods must be a list")
        uids = []
        for p in pods:
            uid = (
                get_field(p, "UID")
                if meta is not None
                else get_field(get_field(p, "metadata"), "uid")
            )
            if not isinstance(uid, str) or not uid:
                raise BadArgsError(f"victims of {node}: every pod needs a UID")
            uids.append(uid)
        pdb = get_field(victims, "NumPDBViolations") or 0
        if isinstance(pdb, bool) or not isinstance(pdb, int):
            raise BadArgsError(f"victims of {node}: NumPDBViolations must be an integer")
        result[str(node)] = (uids, pdb)
    return result


class Extender:
    """filter / prioritize / preempt over a Cache. Thread-safe."""

    def __init__(
        self,
        cache: Cache,
        metrics: Metrics | None = None,
        *,
        manage_nvidia_gpu: bool = False,
        answer: str = "all",
        nri_plugin: str | None = None,
    ) -> None:
        if answer not in FILTER_ANSWERS:
            raise ValueError(f"answer must be one of {', '.join(FILTER_ANSWERS)}, got {answer!r}")
        self.cache = cache
        self.metrics = metrics
        self.manage_nvidia_gpu = manage_nvidia_gpu
        self.nri_plugin = nri_plugin
        """The NRI hook's name, required of containerd on every pod bound with a record
        (None: no requirement written)."""
        self.answer_best = answer == "best"
        self._parser = PodParser(nvidia_gpu_enabled=manage_nvidia_gpu, nri_plugin=nri_plugin)
        self.gangs: Gangs | None = None
        """Gang members are answered by their gang (scheduler_plugin/decisions/gangs.py)."""
        self._requests: OrderedDict[str, tuple[str, PodRequest]] = OrderedDict()
        self._requests_lock = threading.Lock()
        self._categories: dict[NoFit, str] = {}
        """The metrics label of each failure reason met (reasons repeat from pod to pod)."""
        self._judged: PodRequest | None = None
        """The request the last filter judged, for `catch_up`."""
        self._uncounted: tuple[npt.NDArray[np.int32], Sequence[NoFit], Counter[str]] | None = None
        """The last best-node answer's failures not yet in the metrics: its reason codes,
        the reasons they index and the failures already sorted into labels."""

    # --- pods ---------------------------------------------------------------------------

    def parse(self, pod: Mapping[str, Any]) -> PodRequest:
        """The pod's request (RequestError when it breaks a rule)."""
        return self._parser.parse(pod)

    def request_of(self, pod: Mapping[str, Any]) -> PodRequest:
        """The pod's request, parsed once per version of the pod: kube-scheduler sends the
        same pod to filter, then prioritize (and filter again when it retries), and a pod at
        one resourceVersion is immutable, so the request filter parsed is reused."""
        meta = pod.get("metadata")
        if isinstance(meta, Mapping):
            uid = meta.get("uid")
            version = meta.get("resourceVersion")
            if isinstance(uid, str) and isinstance(version, str) and version:
                with self._requests_lock:
                    hit = self._requests.get(uid)
                if hit is not None and hit[0] == version:
                    return hit[1]
        return self.parse(pod)

    def remember(self, pod: Mapping[str, Any], request: PodRequest) -> None:
        """Keep the parsed request for the bind that usually follows (bind gets no pod)."""
        rv = str((pod.get("metadata") or {}).get("resourceVersion") or "")
        with self._requests_lock:
            self._requests[request.uid] = (rv, request)
            self._requests.move_to_end(request.uid)
            while len(self._requests) > _REQUEST_CACHE:
                self._requests.popitem(last=False)

    def remembered(self, uid: str) -> PodRequest | None:
        with self._requests_lock:
            hit = self._requests.get(uid)
            return None if hit is None else hit[1]

    def forget(self, uid: str) -> None:
        with self._requests_lock:
            self._requests.pop(uid, None)

    # --- filter ---------------------------------------------------------------------------

    def filter(self, args: Any) -> dict[str, Any]:
        self._count_uncounted()  # where no `catch_up` followed the last answer
        pod = _pod_of(args)
        nodes = _nodes_of(args)
        try:
            request = self.request_of(pod)
        except RequestError as exc:
            message = f"{REASON_PREFIX}invalid device request: {exc}"
            self._count_failures(Counter({"invalid_request": len(nodes.names)}))
            return self._filter_reply(nodes, [], {}, dict.fromkeys(nodes.names, message))
        if not request.wants_devices:
            return self._filter_reply(nodes, nodes.names, {}, {})
        self.remember(pod, request)
        if self.gangs is not None:
            gang = self.gangs.filter(pod, request, nodes.names)
            if gang is not None:
                return self._gang_reply(nodes, gang)
        assessment = self.cache.assess(request, nodes.names)
        self._judged = request
        judgement, problems = assessment.judgement, assessment.problems
        if self.answer_best and not states_preferences(pod):
            best = self._best_of(judgement, nodes.names, problems)
            if best is not None:
                return self._filter_reply(nodes, [best], {}, {})
        evaluation = assessment.evaluation
        scores = evaluation.scores
        passed = [name for name in nodes.names if name in scores]
        # refused for the node's problem alone, counted and shown under that reason (a node
        # that also fails on capacity shows and counts the capacity reason, once)
        by_problem: list[str] = []
        if problems and not problems.keys().isdisjoint(passed):
            by_problem = [name for name in passed if name in problems]
            passed = [name for name in passed if name not in problems]
        # failures share a few NoFit objects: one text per object, then C-level passes
        failures = evaluation.failures
        ids = list(map(id, failures.values()))
        nofit_of = dict(zip(ids, failures.values(), strict=True))
        text_of = {key: REASON_PREFIX + nofit.reason for key, nofit in nofit_of.items()}
        counts = Counter(ids)
        if problems:
            # no usable inventory, and the problem says why (e.g. it does not parse)
            unknown = [n for n in problems.keys() & failures.keys() if failures[n] is UNKNOWN_NODE]
            counts[id(UNKNOWN_NODE)] -= len(unknown)
            by_problem += unknown
        reasons: Counter[str] = Counter()
        for key, count in counts.items():
            if count:
                reasons[self._category(nofit_of[key])] += count
        for name in by_problem:
            reasons[reason_category(REASON_PREFIX + problems[name])] += 1
        self._count_failures(reasons)
        if passed and self.answer_best and not states_preferences(pod):
            # kube-scheduler reads the other nodes' reasons only when none survives: they
            # are not even written
            return self._filter_reply(nodes, [best_node(scores, passed)], {}, {})
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        texts = map(text_of.__getitem__, ids)
        if any(nofit.unresolvable for nofit in nofit_of.values()):
            for name, key, text in zip(failures, ids, texts, strict=True):
                (unresolvable if nofit_of[key].unresolvable else failed)[name] = text
        else:
            failed.update(zip(failures, texts, strict=True))
        for name in by_problem:
            unresolvable.pop(name, None)
            failed[name] = REASON_PREFIX + problems[name]
        return self._filter_reply(nodes, passed, failed, unresolvable)

    def catch_up(self) -> int:
        """After a filter's answer is sent: judge the nodes that changed since its pod's
        shape last looked at them (Cache.catch_up), so the next pod of that shape (usually
        the next pod of its job) is answered without waiting for it; and count its
        failures into the metrics. The rows judged."""
        self._count_uncounted()
        request, self._judged = self._judged, None
        return 0 if request is None else self.cache.catch_up(request)

    def _best_of(
        self, verdicts: RowVerdicts, names: list[str], problems: Mapping[str, str]
    ) -> str | None:
        """The `best` answer from the arrays, counting the failures as `filter` does; None
        when no node passes or the names repeat (then `filter` answers from the dicts)."""
        fits = verdicts.fits
        rows = verdicts.rows
        names_of = verdicts.names_of
        candidates = fits
        closed: list[int] = []
        if problems:
            closed = [k for k, row in enumerate(rows.tolist()) if names_of[row] in problems]
            if closed:
                candidates = fits.copy()
                candidates[closed] = False
        if not rows.size:
            return None
        levels = np.where(candidates, _levels(verdicts.scores), -np.inf)
        pos = int(np.argmax(levels))  # the first NaN, where a candidate's score is NaN
        if not levels[pos] > -np.inf or _repeats(names, rows, verdicts.unknown, len(names_of)):
            return None  # no candidate, a NaN score, or a name listed twice
        best = names_of[int(rows[pos])] or ""
        if self.metrics is not None:
            reasons: Counter[str] = Counter()
            for k in closed:
                if fits[k]:  # refused for the node's problem alone
                    text = REASON_PREFIX + problems[names_of[int(rows[k])] or ""]
                    reasons[reason_category(text)] += 1
            for name in verdicts.unknown:
                reason = problems.get(name)
                text = REASON_PREFIX + (UNKNOWN_NODE.reason if reason is None else reason)
                reasons[reason_category(text)] += 1
            # the reason codes are counted once the answer is out (`catch_up`): about 40
            # µs of a filter with the caches cold, none of it part of the answer
            self._uncounted = (verdicts.codes, verdicts.reasons, reasons)
        return best

    def _count_uncounted(self) -> None:
        """Count the last best-node answer's failures into the metrics, if not yet."""
        uncounted, self._uncounted = self._uncounted, None
        if uncounted is None:
            return
        codes, reasons_of, reasons = uncounted
        by_code = np.bincount(codes + 1)[1:]  # FITS (-1) counted apart
        for code in np.flatnonzero(by_code).tolist():
            reasons[self._category(reasons_of[code])] += int(by_code[code])
        self._count_failures(reasons)

    def _gang_reply(self, nodes: _Nodes, answer: GangAnswer) -> dict[str, Any]:
        """A gang member passes on its reserved node only; until its gang is reserved,
        every node fails with the gang's reason (resolvable: kube-scheduler retries)."""
        if answer.node is not None:
            return self._filter_reply(nodes, [answer.node], {}, {})
        self._count_failures(Counter({"gang": len(nodes.names)}))
        text = REASON_PREFIX + answer.reason
        return self._filter_reply(nodes, [], dict.fromkeys(nodes.names, text), {})

    def _category(self, nofit: NoFit) -> str:
        label = self._categories.get(nofit)
        if label is None:
            if len(self._categories) >= _MAX_CATEGORIES:
                self._categories.clear()
            label = self._categories[nofit] = reason_category(REASON_PREFIX + nofit.reason)
        return label

    def _count_failures(self, reasons: Counter[str]) -> None:
        if self.metrics is not None and reasons:
            self.metrics.node_failures(reasons)

    @staticmethod
    def _filter_reply(
        nodes: _Nodes,
        passed: Sequence[str],
        failed: dict[str, str],
        unresolvable: dict[str, str],
    ) -> dict[str, Any]:
        reply: dict[str, Any]
        if nodes.items is None:
            reply = {"Nodes": None, "NodeNames": list(passed)}
        else:
            keep = set(passed)
            items = [
                item for item, name in zip(nodes.items, nodes.names, strict=True) if name in keep
            ]
            reply = {"Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
        reply["FailedNodes"] = failed
        reply["FailedAndUnresolvableNodes"] = unresolvable
        reply["Error"] = ""
        return reply

    # --- prioritize -------------------------------------------------------------------------

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        pod = _pod_of(args)
        nodes = _nodes_of(args)
        try:
            request = self.request_of(pod)
        except RequestError:
            return [{"Host": name, "Score": 0} for name in nodes.names]
        if not request.wants_devices:
            return [{"Host": name, "Score": 0} for name in nodes.names]
        scores = self.cache.assess(request, nodes.names).evaluation.scores
        priorities = rank_priorities(scores, nodes.names)
        return [{"Host": n, "Score": k} for n, k in zip(nodes.names, priorities, strict=True)]

    def prioritize_json(self, args: Any) -> bytes:
        """`prioritize` already encoded as JSON (the hot path: thousands of entries)."""
        pod = _pod_of(args)
        nodes = _nodes_of(args)
        try:
            request = self.request_of(pod)
            scores = {}
            if request.wants_devices:
                scores = self.cache.assess(request, nodes.names).evaluation.scores
        except RequestError:
            scores = {}
        names = nodes.names
        priorities = rank_priorities(scores, names)
        if _PLAIN_NAMES.fullmatch("".join(names)):
            # C-level maps: this list has an entry per node
            tails = map(_TAILS.__getitem__, priorities)
            parts = list(map(_HEAD.__add__, map(str.__add__, names, tails)))
        else:
            parts = [
                '{"Host":' + json.dumps(n) + _TAILS[k][1:]
                for n, k in zip(names, priorities, strict=True)
            ]
        return ("[" + ",".join(parts) + "]").encode()

    # --- preempt ------------------------------------------------------------------------------

    def preempt(self, args: Any) -> dict[str, Any]:
        """ExtenderPreemptionResult for ExtenderPreemptionArgs (either victims form)."""
        pod = _pod_of(args)
        try:
            request = self.parse(pod)
        except RequestError as exc:
            raise BadArgsError(f"invalid device request: {exc}") from None
        offered = _victims_of(args)
        gang = None
        if self.gangs is not None and request.wants_devices:
            gang = self.gangs.preemption(pod, request)
        return {"NodeNameToMetaVictims": chosen_victims(self.cache, request, offered, gang)}


def best_node(scores: Mapping[str, float], names: Sequence[str]) -> str:
    """The node of `names` (each in `scores`) with the policy's best score; among equal
    scores the first listed, as prioritize's 10 and a first-listed tie-break would pick."""
    values = np.fromiter(map(scores.__getitem__, names), float, len(names))
    return names[int(np.argmax(_levels(values)))]


def _repeats(names: list[str], rows: IntArray, unknown: list[str], row_count: int) -> bool:
    """Whether a name is listed twice; from the rows (one per known name) when every name
    is known, which needs no hashing of the names again."""
    if unknown:
        return len(set(names)) != len(names)
    seen = np.zeros(row_count, dtype=np.bool_)
    seen[rows] = True
    return int(np.count_nonzero(seen)) != rows.size


def _levels(values: np.ndarray) -> np.ndarray:
    """Scores as levels: rounded, so that float noise makes no second level of one score
    (prioritize's ranks and filter's best node read the same levels)."""
    return np.round(values, 9)


_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def states_preferences(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks kube-scheduler to weigh nodes: preferred node or pod
    (anti-)affinity, or a topology spread constraint it may break (ScheduleAnyway). A spec
    that is not shaped as the API server stores it counts as asking (kube-scheduler then
    judges it)."""
    spec = pod.get("spec")
    if spec is None:
        return False
    if not isinstance(spec, Mapping):
        return True
    affinity = spec.get("affinity")
    if affinity is not None:
        if not isinstance(affinity, Mapping):
            return True
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            terms = affinity.get(kind)
            if terms is None:
                continue
            if not isinstance(terms, Mapping):
                return True
            if terms.get(_PREFERRED):
                return True
    spread = spec.get("topologySpreadConstraints")
    if spread is None:
        return False
    if not isinstance(spread, list):
        return True
    return any(
        not isinstance(c, Mapping) or c.get("whenUnsatisfiable") != "DoNotSchedule" for c in spread
    )


def rank_priorities(scores: Mapping[str, float], names: Sequence[str]) -> list[int]:
    """Extender priorities (integers 0..10) that keep the policy's order of the best nodes.

    Scaling a score in [0, 1] to ten steps would lump nodes the policy tells apart (the
    fragmentation policy's scores differ in the third decimal), and kube-scheduler's own
    plugins would then choose among them. Instead the best distinct score gets 10, the
    next 9, and so on down to 1; nodes where the pod does not fit get 0.
    """
    values = np.fromiter(map(scores.get, names, repeat(math.nan)), float, len(names))
    fits = ~np.isnan(values)
    result = np.zeros(len(names), dtype=np.int64)
    if fits.any():
        levels = _levels(values[fits])
        # the distinct levels, ascending: np.unique would import numpy.ma (1 MB) to ask
        # whether the array is masked
        ordered = np.sort(levels)
        distinct = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
        rank = len(distinct) - 1 - np.searchsorted(distinct, levels)
        result[fits] = np.maximum(MAX_PRIORITY - rank, 1)
    priorities: list[int] = result.tolist()
    return priorities
