"""keras_dist.cluster_resolver's KubernetesClusterResolver, GCEClusterResolver
and UnionResolver, against fake Kubernetes / Compute Engine clients that
record what they are asked. Pure Python, the same on every backend; the
last tests hand the resolvers to MultiWorkerMirroredStrategy."""

from __future__ import annotations

import doctest
import inspect
import subprocess
import sys
import types
import typing
from types import SimpleNamespace as Obj

import pytest

import keras_dist
import keras_dist.cluster_resolver as cluster_resolver
from keras_dist.backends import get_adapter
from keras_dist.cluster_resolver import (
    ClusterResolver,
    ClusterSpec,
    GCEClusterResolver,
    KubernetesClusterResolver,
    SimpleClusterResolver,
    UnionResolver,
)
from keras_dist.cluster_resolver import _cloud, _union
from conftest import BACKEND

NEW = ["GCEClusterResolver", "KubernetesClusterResolver", "UnionResolver"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("KERAS_DIST_COORDINATOR", raising=False)
    monkeypatch.delenv(_cloud.IN_CLUSTER_VAR, raising=False)


# --------------------------------------------------------------------------
# Fakes


def pod(name, ip, phase="Running"):
    """A pod as the kubernetes client gives it; `host_ip` is its node's
    address, which must not be used (two pods may share a node)."""
    return Obj(metadata=Obj(name=name), status=Obj(phase=phase, pod_ip=ip, host_ip="192.0.2.99"))


class FakeCoreV1Api:
    """Answers `list_pod_for_all_namespaces` from `{selector: [pods]}` and
    records the selectors asked for."""

    def __init__(self, pods_by_selector):
        self.pods_by_selector = pods_by_selector
        self.selectors = []

    def list_pod_for_all_namespaces(self, *, label_selector):
        self.selectors.append(label_selector)
        return Obj(items=list(self.pods_by_selector.get(label_selector, [])))


class FakeRequest:
    def __init__(self, compute, call, answer):
        self.compute, self.call, self.answer = compute, call, answer

    def execute(self):
        self.compute.executed.append(self.call)
        return self.answer


class FakeCompute:
    """A `discovery.build("compute", "v1")`: the instance group's RUNNING
    instances in `pages` (lists of names), each name's IP in `ips`. Records
    every call; pages follow `nextPageToken` through `listInstances_next`."""

    def __init__(self, pages, ips, url="https://www.googleapis.com/compute/v1/projects/p/zones/z/instances/"):
        self.pages, self.ips, self.url = pages, ips, url
        self.calls, self.executed, self.next_calls, self.list_requests = [], [], [], []

    def instanceGroups(self):
        return Obj(listInstances=self._list_instances, listInstances_next=self._list_next)

    def instances(self):
        return Obj(get=self._get)

    def _page(self, number, call):
        answer = {"kind": "compute#instanceGroupsListInstances"}
        if self.pages[number]:  # the API leaves "items" out of an empty page
            answer["items"] = [{"instance": self.url + name, "status": "RUNNING"} for name in self.pages[number]]
        if number + 1 < len(self.pages):
            answer["nextPageToken"] = f"token-{number + 1}"
        request = FakeRequest(self, call, answer)
        self.list_requests.append(request)
        return request

    def _list_instances(self, *, project, zone, instanceGroup, body):
        call = ("listInstances", dict(project=project, zone=zone, instanceGroup=instanceGroup, body=body))
        self.calls.append(call)
        return self._page(0, call)

    def _list_next(self, *, previous_request, previous_response):
        self.next_calls.append((previous_request, previous_response))
        token = previous_response.get("nextPageToken")
        if token is None:
            return None
        return self._page(int(token.split("-")[1]), ("listInstances_next", token))

    def _get(self, *, project, zone, instance):
        call = ("get", dict(project=project, zone=zone, instance=instance))
        self.calls.append(call)
        return FakeRequest(self, call, {"name": instance, "networkInterfaces": [{"networkIP": self.ips[instance]}]})


def gce(pages, ips, **kwargs):
    service = FakeCompute(pages, ips)
    kwargs = {"project": "proj", "zone": "us-west1-b", "instance_group": "trainers", "port": 2222, **kwargs}
    return GCEClusterResolver(service=service, **kwargs), service


# --------------------------------------------------------------------------
# Kubernetes


def test_exported_sorted_hinted_and_documented():
    for name in NEW:
        cls = getattr(cluster_resolver, name)
        assert name in cluster_resolver.__all__ and issubclass(cls, ClusterResolver)
        assert ">>> " in cls.__doc__
        hints = typing.get_type_hints(cls.__init__)
        assert set(hints) >= set(inspect.signature(cls).parameters), name
    assert cluster_resolver.__all__ == sorted(cluster_resolver.__all__)


def test_kubernetes_default_mapping_sorted_by_pod_name_with_pod_ips():
    client = FakeCoreV1Api({"job-name=tensorflow": [
        pod("tensorflow-def456", "10.1.2.4"),
        pod("tensorflow-abc123", "10.1.2.3"),
        pod("tensorflow-999999", "10.1.2.5"),
    ]})
    resolver = KubernetesClusterResolver(override_client=client)
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.1.2.5:8470", "10.1.2.3:8470", "10.1.2.4:8470"]}
    assert client.selectors == ["job-name=tensorflow"]
    # tf's defaults: no task, grpc, nothing known about accelerators.
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, "grpc")
    assert resolver.master() == "" and resolver.num_accelerators() == {} and resolver.environment == ""
    assert repr(resolver) == (
        "KubernetesClusterResolver(job_to_label_mapping={'worker': ['job-name=tensorflow']}, "
        "tf_server_port=8470)"
    )


def test_kubernetes_jobs_selectors_port_and_task():
    client = FakeCoreV1Api({
        "job-name=worker1": [pod("w1-b", "10.0.1.2"), pod("w1-a", "10.0.1.1")],
        "job-name=worker2": [pod("w2-a", "10.0.2.1")],
        "job-name=chief": [pod("chief-0", "fd00::7")],
    })
    resolver = KubernetesClusterResolver(
        {"worker": ["job-name=worker1", "job-name=worker2"], "chief": ("job-name=chief",)},
        tf_server_port=5000, rpc_layer=None, override_client=client,
    )
    # Per selector sorted by pod name, selectors in the order given; IPv6 in brackets.
    assert resolver.cluster_spec() == ClusterSpec(
        {"worker": ["10.0.1.1:5000", "10.0.1.2:5000", "10.0.2.1:5000"], "chief": ["[fd00::7]:5000"]}
    )
    assert client.selectors == ["job-name=worker1", "job-name=worker2", "job-name=chief"]
    resolver.task_type, resolver.task_id = "worker", 2
    assert resolver.master() == "10.0.2.1:5000"  # rpc_layer None: no protocol
    assert resolver.master("chief", 0, rpc_layer="grpc") == "grpc://[fd00::7]:5000"
    resolver.rpc_layer = "grpc"
    assert resolver.master() == "grpc://10.0.2.1:5000"
    assert (resolver.num_workers, resolver.worker_index, resolver.is_chief) == (4, 3, False)
    assert resolver.chief_address == "[fd00::7]:5000"


def test_kubernetes_lists_pods_again_at_each_call():
    pods = {"job-name=tensorflow": [pod("a", "10.0.0.1")]}
    client = FakeCoreV1Api(pods)
    resolver = KubernetesClusterResolver(override_client=client)
    assert resolver.num_workers == 1
    pods["job-name=tensorflow"].append(pod("b", "10.0.0.2"))
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.1:8470", "10.0.0.2:8470"]}
    assert len(client.selectors) == 2


@pytest.mark.parametrize("phase", ["Pending", "Failed", "Succeeded", "Unknown"])
def test_kubernetes_pod_not_running(phase):
    client = FakeCoreV1Api({"app=trainer": [pod("trainer-0", "10.0.0.1"), pod("trainer-1", None, phase)]})
    resolver = KubernetesClusterResolver({"worker": ["app=trainer"]}, override_client=client)
    with pytest.raises(RuntimeError) as info:
        resolver.cluster_spec()
    message = str(info.value)
    assert message.startswith(f'Pod "trainer-1" is not running; phase: "{phase}"')  # tf's words
    assert "label selector 'app=trainer'" in message and "job 'worker'" in message


def test_kubernetes_running_pod_without_ip():
    client = FakeCoreV1Api({"job-name=tensorflow": [pod("tensorflow-0", None)]})
    with pytest.raises(RuntimeError, match=r'Pod "tensorflow-0" has no IP address yet \(got None\)'):
        KubernetesClusterResolver(override_client=client).cluster_spec()


def install_fake_kubernetes(monkeypatch, calls):
    """A `kubernetes` package in sys.modules whose config loaders and
    CoreV1Api record that they were used."""
    package = types.ModuleType("kubernetes")
    config = types.ModuleType("kubernetes.config")
    client = types.ModuleType("kubernetes.client")
    config.load_incluster_config = lambda: calls.append("load_incluster_config")
    config.load_kube_config = lambda: calls.append("load_kube_config")

    class CoreV1Api(FakeCoreV1Api):
        def __init__(self):
            calls.append("CoreV1Api")
            super().__init__({"job-name=tensorflow": [pod("p0", "10.9.9.9")]})

    client.CoreV1Api = CoreV1Api
    package.config, package.client = config, client
    for name, module in (("kubernetes", package), ("kubernetes.config", config), ("kubernetes.client", client)):
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.parametrize("in_cluster", [True, False])
def test_kubernetes_client_made_from_the_package(monkeypatch, in_cluster):
    calls = []
    install_fake_kubernetes(monkeypatch, calls)
    if in_cluster:
        monkeypatch.setenv(_cloud.IN_CLUSTER_VAR, "10.96.0.1")
    resolver = KubernetesClusterResolver()
    loader = "load_incluster_config" if in_cluster else "load_kube_config"
    assert calls == [loader, "CoreV1Api"]  # configured once, when made
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.9.9.9:8470"]}
    assert calls == [loader, "CoreV1Api"]


@pytest.mark.parametrize("in_cluster_env", [True, False])
def test_kubernetes_executable_location_overrides_the_environment(monkeypatch, in_cluster_env):
    """tf's `executable_location=`: WITHIN_CLUSTER loads the pod's service
    account, OFF_CLUSTER the kube config, whatever KUBERNETES_SERVICE_HOST says."""
    from keras_dist.cluster_resolver import KubernetesExecutableLocation

    if in_cluster_env:
        monkeypatch.setenv(_cloud.IN_CLUSTER_VAR, "10.96.0.1")
    else:
        monkeypatch.delenv(_cloud.IN_CLUSTER_VAR, raising=False)
    for location, loader in [
        (KubernetesExecutableLocation.WITHIN_CLUSTER, "load_incluster_config"),
        (KubernetesExecutableLocation.OFF_CLUSTER, "load_kube_config"),
    ]:
        calls = []
        install_fake_kubernetes(monkeypatch, calls)
        resolver = KubernetesClusterResolver(executable_location=location)
        assert calls == [loader, "CoreV1Api"]
        assert resolver.cluster_spec().as_dict() == {"worker": ["10.9.9.9:8470"]}
    if BACKEND == "tensorflow":  # tf's own enum, as ported code holds it
        import tensorflow as tf

        calls = []
        install_fake_kubernetes(monkeypatch, calls)
        KubernetesClusterResolver(executable_location=tf.distribute.cluster_resolver.KubernetesExecutableLocation.OFF_CLUSTER)
        assert calls == ["load_kube_config", "CoreV1Api"]


def test_kubernetes_executable_location_bad_values():
    from keras_dist.cluster_resolver import KubernetesExecutableLocation

    with pytest.raises(ValueError, match="must be a keras_dist.cluster_resolver.KubernetesExecutableLocation"):
        KubernetesClusterResolver(executable_location="OFF_CLUSTER", override_client=object())
    with pytest.raises(ValueError, match="Pass one of the two"):
        KubernetesClusterResolver(executable_location=KubernetesExecutableLocation.OFF_CLUSTER, override_client=object())


def hide(monkeypatch, *modules):
    """As if `modules` were not installed: importing them raises ImportError."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_missing_package_import_error(monkeypatch):
    hide(monkeypatch, "kubernetes", "kubernetes.config", "kubernetes.client",
         "googleapiclient", "googleapiclient.discovery")
    with pytest.raises(ImportError) as info:
        KubernetesClusterResolver()
    message = str(info.value)
    assert message.startswith("KubernetesClusterResolver needs the 'kubernetes' package")
    assert "`pip install kubernetes`" in message and "override_client=" in message
    assert isinstance(info.value.__cause__, ImportError)

    with pytest.raises(ImportError) as info:
        GCEClusterResolver("proj", "zone", "group", 2222)
    message = str(info.value)
    assert message.startswith("GCEClusterResolver needs the 'googleapiclient' package")
    assert "`pip install google-api-python-client`" in message and "service=" in message

    # With a client of their own, the packages are never imported.
    client = FakeCoreV1Api({"job-name=tensorflow": [pod("p", "10.0.0.1")]})
    assert KubernetesClusterResolver(override_client=client).num_workers == 1
    resolver, _ = gce([["vm"]], {"vm": "10.0.0.1"})
    assert resolver.num_workers == 1


def test_gce_service_built_from_the_package(monkeypatch):
    built = []
    discovery = types.ModuleType("googleapiclient.discovery")
    discovery.build = lambda *args, **kwargs: built.append((args, kwargs)) or FakeCompute([["vm"]], {"vm": "10.1.1.1"})
    package = types.ModuleType("googleapiclient")
    package.discovery = discovery
    monkeypatch.setitem(sys.modules, "googleapiclient", package)
    monkeypatch.setitem(sys.modules, "googleapiclient.discovery", discovery)
    resolver = GCEClusterResolver("proj", "zone", "group", 2222)
    credentials = object()
    GCEClusterResolver("proj", "zone", "group", 2222, credentials=credentials)
    assert built == [
        (("compute", "v1"), {"credentials": None, "cache_discovery": False}),  # application default
        (("compute", "v1"), {"credentials": credentials, "cache_discovery": False}),
    ]
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.1.1.1:2222"]}


# --------------------------------------------------------------------------
# Compute Engine


def test_gce_pages_sorted_addresses_and_calls():
    pages = [["vm-c", "vm-a"], [], ["vm-b"]]  # an empty page in the middle
    ips = {"vm-a": "10.0.0.9", "vm-b": "10.0.0.10", "vm-c": "10.0.0.2"}
    resolver, service = gce(pages, ips, task_id=1)
    spec = resolver.cluster_spec()
    # Sorted as strings, as TensorFlow sorts them.
    assert spec.as_dict() == {"worker": ["10.0.0.10:2222", "10.0.0.2:2222", "10.0.0.9:2222"]}
    location = {"project": "proj", "zone": "us-west1-b"}
    assert service.calls == [
        ("listInstances", {**location, "instanceGroup": "trainers", "body": {"instanceState": "RUNNING"}}),
        ("get", {**location, "instance": "vm-c"}),
        ("get", {**location, "instance": "vm-a"}),
        ("get", {**location, "instance": "vm-b"}),
    ]
    # Each page fetched once; each next page asked with the previous request
    # and its response, until listInstances_next gives None.
    pages_fetched = [call for call in service.executed if call[0] != "get"]
    assert pages_fetched == [service.calls[0], ("listInstances_next", "token-1"), ("listInstances_next", "token-2")]
    assert len(service.next_calls) == 3
    for (request, response), issued in zip(service.next_calls, service.list_requests):
        assert request is issued and response is issued.answer
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "grpc")
    assert resolver.master() == "grpc://10.0.0.2:2222"
    assert resolver.master("worker", 2, rpc_layer="http") == "http://10.0.0.9:2222"
    assert (resolver.num_workers, resolver.worker_index, resolver.is_chief) == (3, 1, False)
    assert repr(resolver) == (
        "GCEClusterResolver(project='proj', zone='us-west1-b', instance_group='trainers', port=2222)"
    )


def test_gce_task_type_is_the_job_and_fixed():
    resolver, _ = gce([["vm-a", "vm-b"]], {"vm-a": "10.0.0.1", "vm-b": "10.0.0.2"},
                      task_type="chief", task_id=0, rpc_layer=None)
    assert resolver.cluster_spec().as_dict() == {"chief": ["10.0.0.1:2222", "10.0.0.2:2222"]}
    assert resolver.master() == "10.0.0.1:2222"
    with pytest.raises(RuntimeError, match="task_type of a GCEClusterResolver .* cannot be changed"):
        resolver.task_type = "worker"
    assert resolver.task_type == "chief"
    resolver.task_id, resolver.rpc_layer = 1, "grpc"  # these can be set
    assert resolver.master() == "grpc://10.0.0.2:2222"


def test_gce_instance_without_ip():
    resolver, _ = gce([["vm-a"]], {"vm-a": ""})
    with pytest.raises(RuntimeError, match=r"Instance 'vm-a' has no IP address yet"):
        resolver.cluster_spec()


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: KubernetesClusterResolver({"worker": "job-name=x"}, override_client=object()),
         TypeError, r"job_to_label_mapping\['worker'\] must be a list of label selectors"),
        (lambda: KubernetesClusterResolver({"worker": []}, override_client=object()),
         ValueError, r"job_to_label_mapping\['worker'\] lists no label selector"),
        (lambda: KubernetesClusterResolver({"worker": [""]}, override_client=object()),
         ValueError, "label selectors must not be empty"),
        (lambda: KubernetesClusterResolver({"work-er": ["a=b"]}, override_client=object()),
         ValueError, "invalid job name 'work-er'"),
        (lambda: KubernetesClusterResolver(["job-name=x"], override_client=object()),
         TypeError, "job_to_label_mapping must be a dict"),
        (lambda: KubernetesClusterResolver(tf_server_port="8470", override_client=object()),
         TypeError, "tf_server_port must be an integer port, got str '8470'"),
        (lambda: KubernetesClusterResolver(tf_server_port=70000, override_client=object()),
         ValueError, "tf_server_port must be a port in 1..65535, got 70000"),
        (lambda: KubernetesClusterResolver(rpc_layer=1, override_client=object()),
         TypeError, "rpc_layer must be a string or None"),
        (lambda: gce([[]], {}, port=0), ValueError, "port must be a port in 1..65535, got 0"),
        (lambda: gce([[]], {}, project=None), TypeError, "project must be a string, got NoneType"),
        (lambda: gce([[]], {}, zone=" "), ValueError, "zone must not be empty"),
        (lambda: gce([[]], {}, task_id=-1), ValueError, "task_id must be >= 0, got -1"),
        (lambda: gce([[]], {}, task_id="0"), TypeError, "task_id must be an integer or None"),
        (lambda: gce([[]], {}, task_type="my job"), ValueError, "task_type: invalid job name"),
    ],
)
def test_bad_constructor_arguments(make, error, message):
    with pytest.raises(error, match=message):
        make()


# --------------------------------------------------------------------------
# UnionResolver


def simple(cluster, **kwargs):
    return SimpleClusterResolver(ClusterSpec(cluster), **kwargs)


def test_union_merges_jobs_and_concatenates_lists_in_order():
    first = simple({"worker": ["w0:1", "w1:1"]}, task_type="worker", task_id=1, rpc_layer="grpc",
                   num_accelerators={"GPU": 2}, environment="google", master="first-master")
    second = simple({"worker": ["w2:1"], "ps": ["p0:1"]}, task_type="ps", task_id=0, rpc_layer="http")
    resolver = UnionResolver(first, second)
    assert resolver.cluster_spec().as_dict() == {"ps": ["p0:1"], "worker": ["w0:1", "w1:1", "w2:1"]}
    assert UnionResolver(second, first).cluster_spec().as_dict()["worker"] == ["w2:1", "w0:1", "w1:1"]
    # The rest is the first resolver's.
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "grpc")
    assert resolver.num_accelerators() == {"GPU": 2} and resolver.environment == "google"
    assert resolver.master() == "grpc://first-master"
    assert resolver.master(rpc_layer="http") == "http://first-master"
    assert resolver.master("worker", 2) == "grpc://w2:1"  # from the merged cluster
    assert (resolver.num_workers, resolver.worker_index, resolver.chief_address) == (3, 1, "w0:1")
    assert resolver.cluster_resolvers == (first, second)


def test_union_sparse_jobs_merge_by_index():
    first = simple({"worker": {0: "w0:1", 3: "w3:1"}})
    second = simple({"worker": ["b:1", "c:1"]})  # dense: indices 0, 1
    with pytest.raises(ValueError):
        UnionResolver(first, second).cluster_spec()  # index 0 twice
    second = simple({"worker": {1: "w1:1", 2: "w2:1"}, "chief": ["c:1"]})
    merged = UnionResolver(first, second).cluster_spec()
    assert merged.as_dict() == {"chief": ["c:1"], "worker": ["w0:1", "w1:1", "w2:1", "w3:1"]}
    # A dense job meeting a sparse one is read as indices 0..n-1.
    dense = simple({"worker": ["x0:1", "x1:1"]})
    gap = simple({"worker": {5: "x5:1"}})
    assert UnionResolver(dense, gap).cluster_spec().as_dict() == {"worker": {0: "x0:1", 1: "x1:1", 5: "x5:1"}}


def test_union_conflicting_task_indices():
    first = simple({"worker": ["w0:1", "w1:1"]})
    second = simple({"ps": ["p0:1"]})
    third = simple({"worker": {1: "other:1"}})
    with pytest.raises(ValueError) as info:
        UnionResolver(first, second, third).cluster_spec()
    assert isinstance(info.value, KeyError)  # what tf raises, still caught as such
    message = str(info.value)
    assert message.startswith("Duplicate keys detected when merging two ClusterSpecs: ")
    assert "cluster_resolvers[0] and cluster_resolvers[2] both give task worker:1 ('w1:1' and 'other:1')" in message
    assert "give them distinct indices" in message


def test_union_overrides_and_setters():
    first = simple({"worker": ["w0:1", "w1:1"]}, task_type="worker", task_id=1, rpc_layer="grpc")
    chief = simple({"chief": ["c0:1"]})
    resolver = UnionResolver(first, chief, task_type="chief", task_id=0, rpc_layer="http")
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("chief", 0, "http")
    assert resolver.master() == "http://c0:1"  # this (overridden) task, in the merged cluster
    assert (resolver.is_chief, resolver.worker_index) == (True, 0)
    # task_id=0 overrides too (tf's `or` would fall back to the first resolver's 1).
    assert UnionResolver(first, task_id=0).task_id == 0
    resolver.task_type, resolver.task_id, resolver.rpc_layer = None, None, None
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "grpc")
    assert resolver.master() == ""  # the first resolver's master(): its `master` string
    resolver.task_id = 0
    assert resolver.master() == "grpc://w0:1"
    with pytest.raises(TypeError, match="task_id must be an integer or None"):
        resolver.task_id = "1"
    with pytest.raises(ValueError, match="task_id must be >= 0"):
        UnionResolver(first, task_id=-1)


def test_union_asks_its_resolvers_at_each_call():
    client = FakeCoreV1Api({"job-name=tensorflow": [pod("a", "10.0.0.1")]})
    pods = UnionResolver(KubernetesClusterResolver(override_client=client), simple({"chief": ["c:1"]}))
    assert pods.num_workers == 2
    client.pods_by_selector["job-name=tensorflow"].append(pod("b", "10.0.0.2"))
    assert pods.num_workers == 3


@pytest.mark.parametrize(
    "args, kwargs, error, message",
    [
        ((), {}, ValueError, r"At least one ClusterResolver is required"),
        (("not a resolver",), {}, TypeError, r"argument 0 is str 'not a resolver'"),
        ((None,), {}, TypeError, r"sub-class of keras_dist's ClusterResolver"),
        ((ClusterSpec({"worker": ["a:1"]}),), {}, TypeError, r"argument 0 is ClusterSpec"),
        ((simple({}),), {"task_index": 0}, ValueError, r"Unexpected kwargs provided \['task_index'\]"),
        ((simple({}),), {"task_type": 1}, TypeError, r"task_type must be a string or None"),
    ],
)
def test_union_bad_arguments(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        UnionResolver(*args, **kwargs)


# --------------------------------------------------------------------------
# With MultiWorkerMirroredStrategy


class Joined(Exception):
    """Raised by the fake join: the strategy got as far as joining."""


@pytest.fixture
def join(monkeypatch):
    """Stands in for the backend's join: records the resolver the strategy
    hands it, then stops the strategy there."""
    joins = []

    def initialize_multi_worker(resolver, options):
        joins.append(resolver)
        raise Joined

    monkeypatch.setattr(get_adapter(), "initialize_multi_worker", initialize_multi_worker)
    return joins


def two_pods():
    return FakeCoreV1Api({"job-name=tensorflow": [pod("tf-1", "10.0.0.2"), pod("tf-0", "10.0.0.1")]})


def multi_worker_resolvers():
    kubernetes = KubernetesClusterResolver(override_client=two_pods())
    kubernetes.task_type, kubernetes.task_id = "worker", 1
    compute, _ = gce([["vm-0"], ["vm-1"]], {"vm-0": "10.0.0.1", "vm-1": "10.0.0.2"}, task_id=1)
    union = UnionResolver(
        simple({"chief": ["10.0.0.1:8470"]}),
        KubernetesClusterResolver(override_client=FakeCoreV1Api({"job-name=tensorflow": [pod("tf-0", "10.0.0.2")]})),
        task_type="worker", task_id=0,
    )
    return {"kubernetes": kubernetes, "gce": compute, "union": union}


@pytest.mark.parametrize("kind", ["kubernetes", "gce", "union"])
def test_resolver_reaches_the_join_of_multi_worker_strategy(join, kind):
    resolver = multi_worker_resolvers()[kind]
    with pytest.raises(Joined):
        keras_dist.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    assert join == [resolver]  # validated, then handed to the backend's join
    # What the backends read from it there.
    assert (resolver.num_workers, resolver.worker_index, resolver.is_chief) == (2, 1, False)
    jobs = resolver.cluster_spec().as_dict()
    port = 2222 if kind == "gce" else 8470
    assert [address for job in ("chief", "worker") for address in jobs.get(job, [])] == [
        f"10.0.0.1:{port}", f"10.0.0.2:{port}"]
    assert resolver.chief_address.startswith("10.0.0.1:")
    assert resolver.cluster_spec().task_address(resolver.task_type, resolver.task_id).startswith("10.0.0.2:")


def test_single_pod_cluster_makes_a_strategy():
    """One worker joins nothing: the backend's real join returns at once."""
    client = FakeCoreV1Api({"job-name=tensorflow": [pod("tf-0", "127.0.0.1")]})
    resolver = KubernetesClusterResolver(override_client=client)
    resolver.task_type, resolver.task_id = "worker", 0
    strategy = keras_dist.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    assert strategy.cluster_resolver is resolver and client.selectors
    assert strategy.num_replicas_in_sync == 4  # conftest's simulated CPU devices
    assert strategy.extended.should_checkpoint and strategy.extended.task_type == "worker"


def test_task_not_set_fails_before_joining(join):
    resolver = KubernetesClusterResolver(override_client=two_pods())  # tf: task unset
    with pytest.raises(ValueError, match=r"The cluster has 2 worker tasks but this process's task is not set"):
        keras_dist.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    ps = UnionResolver(resolver, simple({"ps": ["p:1"]}), task_type="ps", task_id=0)
    with pytest.raises(ValueError, match="runs on chief and worker tasks; this task is 'ps'"):
        keras_dist.MultiWorkerMirroredStrategy(cluster_resolver=ps)
    assert join == []


def test_empty_listing_is_refused_before_joining(join):
    """Selectors that match no pod, a group with no RUNNING instance: one
    clear error, not a strategy with no worker (that would never save)."""
    nothing, _ = gce([[]], {})
    assert nothing.cluster_spec().as_dict() == {"worker": {}}
    no_pods = KubernetesClusterResolver({"worker": ["app=x"], "ps": ["app=ps"]}, override_client=FakeCoreV1Api({
        "app=ps": [pod("ps-0", "10.0.0.5")]}))
    no_pods.task_type, no_pods.task_id = "worker", 0
    for resolver, jobs in ((nothing, r"worker \(0 task\(s\)\)"), (no_pods, r"ps \(1 task\(s\)\), worker \(0 task\(s\)\)")):
        with pytest.raises(ValueError, match=rf"The cluster has no chief or worker task \(its jobs: {jobs}\).*none was found running"):
            keras_dist.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    assert join == []


# --------------------------------------------------------------------------
# Docs and imports


@pytest.mark.parametrize("module", [_cloud, _union], ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    output = []
    tests = [t for t in finder.find(module, module.__name__) if t.examples]
    assert len(tests) >= (2 if module is _cloud else 1), f"no examples in {module.__name__}"
    for test in tests:
        runner.run(test, out=output.append)
    assert runner.failures == 0, "".join(output)
    assert runner.tries >= 8


@pytest.mark.starts_processes
def test_importing_and_using_with_fakes_imports_no_client_package():
    """In a fresh process: importing keras_dist.cluster_resolver, and using
    the resolvers with clients of their own, loads neither client package
    nor a backend."""
    code = (
        "import sys\n"
        "from types import SimpleNamespace as Obj\n"
        "import keras_dist.cluster_resolver as cr\n"
        "pods = Obj(items=[Obj(metadata=Obj(name='p'), status=Obj(phase='Running', pod_ip='10.0.0.1'))])\n"
        "client = Obj(list_pod_for_all_namespaces=lambda label_selector: pods)\n"
        "k8s = cr.KubernetesClusterResolver(override_client=client)\n"
        "print(cr.UnionResolver(k8s).cluster_spec().as_dict())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "      {'kubernetes', 'googleapiclient', 'jax', 'tensorflow', 'keras'}))\n"
    )
    stub = "import sys, types; s = types.ModuleType('keras_dist'); s.__path__ = [sys.argv[1]]; sys.modules['keras_dist'] = s\n"
    result = subprocess.run(
        [sys.executable, "-c", stub + code, str(_cloud.__file__.rsplit("/", 2)[0])],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["{'worker': ['10.0.0.1:8470']}", "[]"]
