"""keras_dist.cluster_resolver.TPUClusterResolver: a Cloud TPU VM or slice,
read from the environment Cloud TPU VMs set. Pure Python, no TPU needed."""

from __future__ import annotations

import doctest
import socket

import pytest

import keras_dist.cluster_resolver as cluster_resolver
from keras_dist.cluster_resolver import ClusterSpec, TPUClusterResolver
from keras_dist.cluster_resolver import _tpu

ENV_VARS = [
    "TPU_WORKER_HOSTNAMES",
    "TPU_WORKER_ID",
    "CLOUD_TPU_TASK_ID",
    "TPU_NAME",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_ACCELERATOR_TYPE",
]
SLICE = ["t1v-n-0", "t1v-n-1", "t1v-n-2", "t1v-n-3"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Each test starts as on a machine without a TPU (the variables unset),
    and gets them back after (`setenv` first, so monkeypatch restores them)."""
    for name in ENV_VARS:
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    return monkeypatch


def set_slice(monkeypatch, worker_id, hosts=SLICE, var="TPU_WORKER_ID"):
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", ",".join(hosts))
    monkeypatch.setenv(var, str(worker_id))


def test_exported_sorted_and_documented():
    assert cluster_resolver.TPUClusterResolver is TPUClusterResolver
    assert "TPUClusterResolver" in cluster_resolver.__all__
    assert cluster_resolver.__all__ == sorted(cluster_resolver.__all__)
    assert ">>> " in TPUClusterResolver.__doc__


def test_defaults_without_tpu_env_are_one_local_host():
    resolver = TPUClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec({"worker": ["localhost:8470"]})
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)
    assert resolver.master() == "" and resolver.get_master() == ""
    assert resolver.master("worker", 0) == "grpc://localhost:8470"
    assert resolver.get_job_name() == "worker"
    assert (resolver.num_workers, resolver.is_chief, resolver.worker_index) == (1, True, 0)
    assert resolver.chief_address == "localhost:8470"
    assert resolver.environment == "google"
    assert resolver.rpc_layer == "grpc"
    assert resolver.num_accelerators() == {}
    assert (resolver.tpu, resolver.zone, resolver.project) == (None, None, None)
    assert repr(resolver) == "TPUClusterResolver(tpu=None, zone=None, project=None)"


@pytest.mark.parametrize("tpu", ["", "local", "my-tpu"])
def test_local_names_and_a_name_without_tpu_name_env(tpu):
    resolver = TPUClusterResolver(tpu)
    assert resolver.tpu == tpu
    assert resolver.cluster_spec() == ClusterSpec({"worker": ["localhost:8470"]})
    assert resolver.master() == ""
    assert repr(resolver) == f"TPUClusterResolver(tpu={tpu!r}, zone=None, project=None)"


def test_name_matching_tpu_name_env(monkeypatch):
    monkeypatch.setenv("TPU_NAME", "my-tpu")
    set_slice(monkeypatch, 2)
    resolver = TPUClusterResolver("my-tpu", zone="us-central2-b", project="proj")
    assert resolver.task_id == 2 and resolver.num_workers == 4
    assert (resolver.tpu, resolver.zone, resolver.project) == ("my-tpu", "us-central2-b", "proj")
    assert repr(resolver) == (
        "TPUClusterResolver(tpu='my-tpu', zone='us-central2-b', project='proj')"
    )
    # The local names are not checked against TPU_NAME.
    assert TPUClusterResolver("local").task_id == 2


@pytest.mark.parametrize("worker_id", range(4))
def test_four_host_slice(monkeypatch, worker_id):
    set_slice(monkeypatch, worker_id)
    resolver = TPUClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec(
        {"worker": [f"{host}:8470" for host in SLICE]}
    )
    assert (resolver.task_type, resolver.task_id) == ("worker", worker_id)
    assert resolver.master() == f"grpc://t1v-n-{worker_id}:8470"
    assert resolver.master("worker", 3) == "grpc://t1v-n-3:8470"
    assert resolver.master(rpc_layer="http") == f"http://t1v-n-{worker_id}:8470"
    assert resolver.num_workers == 4
    assert resolver.is_chief is (worker_id == 0)
    assert resolver.worker_index == worker_id
    assert resolver.chief_address == "t1v-n-0:8470"


def test_hostnames_are_stripped_and_env_read_once(monkeypatch):
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", " 10.0.0.1 , 10.0.0.2 ")
    monkeypatch.setenv("TPU_WORKER_ID", " 1 ")
    resolver = TPUClusterResolver()
    monkeypatch.setenv("TPU_WORKER_ID", "0")  # read in the constructor only
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.1:8470", "10.0.0.2:8470"]}
    assert resolver.master() == "grpc://10.0.0.2:8470"


def test_cloud_tpu_task_id_fallback_and_precedence(monkeypatch):
    set_slice(monkeypatch, 3, var="CLOUD_TPU_TASK_ID")
    assert TPUClusterResolver().task_id == 3
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    assert TPUClusterResolver().task_id == 1
    monkeypatch.setenv("TPU_WORKER_ID", "")  # blank counts as unset
    assert TPUClusterResolver().task_id == 3


@pytest.mark.parametrize(
    "bounds, expected",
    [("2,2,1", {"TPU": 4}), ("1,1,1", {"TPU": 1}), ("2, 4 ,1", {"TPU": 8}),
     ("", {}), ("2x2", {}), ("0,2,1", {}), ("-1,2", {})],
)
def test_num_accelerators_from_chips_per_host_bounds(monkeypatch, bounds, expected):
    monkeypatch.setenv("TPU_CHIPS_PER_HOST_BOUNDS", bounds)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-8")  # not used
    assert TPUClusterResolver().num_accelerators() == expected


def test_makes_no_network_calls(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("TPUClusterResolver opened a socket")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    set_slice(monkeypatch, 1)
    resolver = TPUClusterResolver("my-tpu", zone="z", project="p")
    assert resolver.master() == "grpc://t1v-n-1:8470" and resolver.num_accelerators() == {}


# Bad input: one clear error each, from the constructor.


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tpu": 1}, "tpu must be a TPU name, '', 'local' or None, got int 1"),
        ({"tpu": ["a", "b"]}, "tpu must be a TPU name, '', 'local' or None, got list"),
        ({"zone": 1}, "zone must be a string or None, got int 1"),
        ({"project": b"p"}, "project must be a string or None, got bytes b'p'"),
    ],
)
def test_wrong_types(kwargs, message):
    with pytest.raises(TypeError) as info:
        TPUClusterResolver(**kwargs)
    assert str(info.value).startswith(message)


def test_grpc_tpu_node_is_rejected():
    with pytest.raises(ValueError) as info:
        TPUClusterResolver("grpc://10.240.1.2:8470")
    message = str(info.value)
    assert "tpu='grpc://10.240.1.2:8470'" in message
    assert "TPU Nodes" in message and "not supported" in message
    assert "TPU VM with tpu=None" in message


def test_tpu_name_different_from_tpu_name_env(monkeypatch):
    monkeypatch.setenv("TPU_NAME", "this-tpu")
    with pytest.raises(ValueError, match=r"tpu='other-tpu' but this VM is TPU_NAME='this-tpu'"):
        TPUClusterResolver("other-tpu")


@pytest.mark.parametrize(
    "var, value, hosts, message",
    [
        ("TPU_WORKER_ID", "4", SLICE,
         "TPU_WORKER_ID=4 is out of range: TPU_WORKER_HOSTNAMES lists 4 hosts (indices 0 to 3)"),
        ("CLOUD_TPU_TASK_ID", "9", SLICE,
         "CLOUD_TPU_TASK_ID=9 is out of range: TPU_WORKER_HOSTNAMES lists 4 hosts"),
        ("TPU_WORKER_ID", "1", None,
         "TPU_WORKER_ID=1 is out of range: TPU_WORKER_HOSTNAMES is unset, so this is a single-host"),
        ("TPU_WORKER_ID", "one", SLICE, "TPU_WORKER_ID='one' is not an integer >= 0"),
        ("TPU_WORKER_ID", "-1", SLICE, "TPU_WORKER_ID='-1' is not an integer >= 0"),
        ("CLOUD_TPU_TASK_ID", "1.0", SLICE, "CLOUD_TPU_TASK_ID='1.0' is not an integer >= 0"),
    ],
)
def test_bad_worker_id(monkeypatch, var, value, hosts, message):
    if hosts is not None:
        monkeypatch.setenv("TPU_WORKER_HOSTNAMES", ",".join(hosts))
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as info:
        TPUClusterResolver()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("hostnames", ["h0,,h2", "h0,h1:8470", "h0,h 1", "h0,"])
def test_bad_hostnames(monkeypatch, hostnames):
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", hostnames)
    with pytest.raises(ValueError, match="TPU_WORKER_HOSTNAMES=.* is not a comma-separated list"):
        TPUClusterResolver()


def test_docstring_examples_run():
    """(clean_env restores the variables the example sets and deletes.)"""
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    output = []
    tests = [t for t in finder.find(_tpu, _tpu.__name__) if t.examples]
    assert tests, "no examples in keras_dist.cluster_resolver._tpu"
    for test in tests:
        runner.run(test, out=output.append)
    assert runner.failures == 0, "".join(output)
