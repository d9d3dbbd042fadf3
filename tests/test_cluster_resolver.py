"""keras_dist.cluster_resolver: ClusterSpec and the TF_CONFIG, simple and SLURM
resolvers. Pure Python, so the same on every backend."""

from __future__ import annotations

import ast
import doctest
import inspect
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from keras_dist.cluster_resolver import (
    ClusterResolver,
    ClusterSpec,
    SimpleClusterResolver,
    SlurmClusterResolver,
    TFConfigClusterResolver,
)
from keras_dist.cluster_resolver import _cluster_spec, _resolvers, _slurm, _torchrun
from keras_dist.cluster_resolver._slurm import expand_hostlist, expand_tasks_per_node

PACKAGE_DIR = Path(_cluster_spec.__file__).resolve().parent
REPO = PACKAGE_DIR.parents[1]

ENV_VARS = [
    "TF_CONFIG",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_GPUS_ON_NODE",
    "CUDA_VISIBLE_DEVICES",
    _slurm.NODE_GPUS_VAR,
]

# The TF_CONFIG example of TensorFlow's distributed training guide.
GUIDE_CLUSTER = {
    "worker": ["host1:port", "host2:port", "host3:port"],
    "ps": ["host4:port", "host5:port"],
}
GUIDE_TF_CONFIG = {"cluster": GUIDE_CLUSTER, "task": {"type": "worker", "index": 1}}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Each test starts without the variables read here, and gets them back after.

    `setenv` first, so monkeypatch also undoes variables the code sets.
    """
    for name in ENV_VARS:
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    return monkeypatch


def set_tf_config(monkeypatch, config):
    monkeypatch.setenv("TF_CONFIG", config if isinstance(config, str) else json.dumps(config))


# --------------------------------------------------------------------------
# ClusterSpec


def test_cluster_spec_dense():
    spec = ClusterSpec(GUIDE_CLUSTER)
    assert spec.jobs == ["ps", "worker"]
    assert spec.num_tasks("worker") == 3 and spec.num_tasks("ps") == 2
    assert spec.task_indices("worker") == [0, 1, 2]
    assert spec.task_address("worker", 2) == "host3:port"
    assert spec.job_tasks("ps") == ["host4:port", "host5:port"]
    assert spec.as_dict() == GUIDE_CLUSTER
    assert bool(spec) and not ClusterSpec({})
    assert spec == ClusterSpec(dict(reversed(list(GUIDE_CLUSTER.items()))))
    assert spec == GUIDE_CLUSTER and spec != {"worker": ["host1:port"]}
    assert spec != "not a spec"
    assert repr(spec) == (
        "ClusterSpec({'ps': ['host4:port', 'host5:port'], "
        "'worker': ['host1:port', 'host2:port', 'host3:port']})"
    )
    assert eval(repr(spec)) == spec  # noqa: S307 - round trip of our own repr


def test_cluster_spec_sparse():
    spec = ClusterSpec({"worker": {1: "a:2222", 3: "b:2222"}, "ps": ("c:1",)})
    assert spec.task_indices("worker") == [1, 3]
    assert spec.num_tasks("worker") == 2
    assert spec.job_tasks("worker") == [None, "a:2222", None, "b:2222"]
    assert spec.task_address("worker", 3) == "b:2222"
    assert spec.as_dict() == {"worker": {1: "a:2222", 3: "b:2222"}, "ps": ["c:1"]}
    # JSON object keys are strings; a complete dict is a dense job.
    assert spec == ClusterSpec({"worker": {"3": "b:2222", "1": "a:2222"}, "ps": {0: "c:1"}})
    assert ClusterSpec({"w": {1: "b:1", 0: "a:1"}}).as_dict() == {"w": ["a:1", "b:1"]}
    empty_job = ClusterSpec({"worker": []})
    assert bool(empty_job) and empty_job.num_tasks("worker") == 0
    assert empty_job.job_tasks("worker") == [] and empty_job.as_dict() == {"worker": {}}


def test_cluster_spec_copy_is_independent():
    original = {"worker": ["a:1"]}
    spec = ClusterSpec(original)
    original["worker"].append("b:1")
    copy = ClusterSpec(spec)
    copy._cluster["worker"][5] = "z:1"
    assert spec.as_dict() == {"worker": ["a:1"]}
    with pytest.raises(TypeError):
        hash(spec)


@pytest.mark.parametrize(
    "address", ["host1:port", "10.0.0.1:2222", "[::1]:2222", "node-01.cluster.local:8888"]
)
def test_cluster_spec_accepts_addresses(address):
    assert ClusterSpec({"worker": [address]}).task_address("worker", 0) == address


@pytest.mark.parametrize(
    "cluster, error, message",
    [
        (None, TypeError, "cluster must be a dict mapping job names"),
        ({1: ["a:1"]}, TypeError, "cluster: job names must be strings, got int 1"),
        ({"": ["a:1"]}, ValueError, "cluster: invalid job name ''"),
        ({"my job": ["a:1"]}, ValueError, "cluster: invalid job name 'my job'"),
        ({"worker": "a:1"}, TypeError, 'cluster["worker"] must be a list of "host:port"'),
        ({"worker": ["a:1", 7]}, TypeError, 'cluster["worker"][1] must be a "host:port" string, got int 7'),
        ({"worker": ["a:1", "b"]}, ValueError, 'cluster["worker"][1] must be a "host:port" address'),
        ({"worker": ["a:"]}, ValueError, "the port is missing"),
        ({"worker": [":1"]}, ValueError, "the host is missing"),
        ({"worker": ["a :1"]}, ValueError, "got 'a :1'"),
        ({"worker": ["grpc://a:1"]}, ValueError, "give the protocol (e.g. grpc) as the rpc_layer"),
        ({"worker": ["::1:2222"]}, ValueError, "write an IPv6 host in brackets"),
        ({"worker": {"x": "a:1"}}, TypeError, "cluster[\"worker\"]: task indices must be non-negative integers, got str 'x'"),
        ({"worker": {-1: "a:1"}}, ValueError, "task indices must be non-negative integers, got -1"),
        ({"worker": {True: "a:1"}}, TypeError, "got bool True"),
        ({"worker": {0: "a:1", "0": "b:1"}}, ValueError, 'cluster["worker"]: task index 0 is given twice'),
        ({"worker": {2: None}}, TypeError, 'cluster["worker"][2] must be a "host:port" string'),
    ],
)
def test_cluster_spec_errors(cluster, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ClusterSpec(cluster)


def test_cluster_spec_lookup_errors():
    spec = ClusterSpec({"worker": {0: "a:1", 2: "b:1"}})
    with pytest.raises(ValueError, match=re.escape("No such job in cluster: 'ps'")):
        spec.num_tasks("ps")
    with pytest.raises(ValueError, match=re.escape("No task with index 1 in job 'worker' (task indices: [0, 2])")):
        spec.task_address("worker", 1)
    for method in (spec.task_indices, spec.job_tasks):
        with pytest.raises(ValueError, match="No such job"):
            method("chief")


# --------------------------------------------------------------------------
# TFConfigClusterResolver


def test_tf_config_guide_example(monkeypatch):
    set_tf_config(monkeypatch, GUIDE_TF_CONFIG)
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec(GUIDE_CLUSTER)
    assert resolver.cluster_spec().as_dict() == GUIDE_CLUSTER
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.num_workers == 3
    assert resolver.is_chief is False
    assert resolver.chief_address == "host1:port"  # no chief job: worker 0
    assert resolver.worker_index == 1
    assert resolver.master() == "host2:port"
    assert resolver.master(rpc_layer="grpc") == "grpc://host2:port"
    assert resolver.master("ps", 1) == "host5:port"
    assert resolver.rpc_layer is None and resolver.environment == ""
    assert resolver.num_accelerators() == {}
    assert isinstance(resolver, ClusterResolver)


@pytest.mark.parametrize(
    "task, is_chief, worker_index",
    [
        ({"type": "worker", "index": 0}, True, 0),
        ({"type": "worker", "index": 2}, False, 2),
        ({"type": "ps", "index": 0}, False, None),
    ],
)
def test_tf_config_guide_cluster_each_task(monkeypatch, task, is_chief, worker_index):
    set_tf_config(monkeypatch, {"cluster": GUIDE_CLUSTER, "task": task})
    resolver = TFConfigClusterResolver()
    assert resolver.is_chief is is_chief
    assert resolver.worker_index == worker_index
    assert resolver.num_workers == 3


CHIEF_CLUSTER = {
    "chief": ["chief0:2222"],
    "worker": ["worker0:2222", "worker1:2222"],
    "ps": ["ps0:2222"],
    "evaluator": ["eval0:2222"],
}


@pytest.mark.parametrize(
    "task, is_chief, worker_index",
    [
        ({"type": "chief", "index": 0}, True, 0),
        ({"type": "worker", "index": 0}, False, 1),
        ({"type": "worker", "index": 1}, False, 2),
        ({"type": "ps", "index": 0}, False, None),
        ({"type": "evaluator", "index": 0}, False, None),
    ],
)
def test_tf_config_chief_and_evaluator(monkeypatch, task, is_chief, worker_index):
    set_tf_config(monkeypatch, {"cluster": CHIEF_CLUSTER, "task": task})
    resolver = TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id) == (task["type"], task["index"])
    assert resolver.num_workers == 3  # chief + 2 workers; not ps, not evaluator
    assert resolver.chief_address == "chief0:2222"
    assert resolver.is_chief is is_chief
    assert resolver.worker_index == worker_index


def test_tf_config_evaluator_outside_cluster(monkeypatch):
    set_tf_config(monkeypatch, {"cluster": GUIDE_CLUSTER, "task": {"type": "evaluator", "index": 0}})
    resolver = TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("evaluator", 0)
    assert resolver.worker_index is None and resolver.is_chief is False
    assert resolver.num_workers == 3 and resolver.chief_address == "host1:port"


def test_tf_config_sparse_cluster(monkeypatch):
    set_tf_config(
        monkeypatch,
        {"cluster": {"worker": {"0": "w0:1", "2": "w2:1"}}, "task": {"type": "worker", "index": 2}},
    )
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec().job_tasks("worker") == ["w0:1", None, "w2:1"]
    assert resolver.num_workers == 2 and resolver.worker_index == 1
    assert resolver.master() == "w2:1"


@pytest.mark.parametrize("value", [None, "", "   \n"])
def test_tf_config_unset_or_empty_is_single_process(monkeypatch, value):
    if value is not None:
        monkeypatch.setenv("TF_CONFIG", value)
    resolver = TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    assert spec == ClusterSpec({}) and not spec and spec.jobs == []
    assert resolver.task_type is None and resolver.task_id is None
    assert resolver.num_workers == 1 and resolver.is_chief is True
    assert resolver.worker_index == 0 and resolver.chief_address is None
    assert resolver.master() == "" and resolver.rpc_layer is None


def test_tf_config_task_without_cluster_is_single_process(monkeypatch):
    set_tf_config(monkeypatch, {"task": {"type": "worker", "index": 0}})
    resolver = TFConfigClusterResolver()
    assert not resolver.cluster_spec()
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)
    assert resolver.num_workers == 1 and resolver.is_chief and resolver.worker_index == 0


def test_tf_config_is_read_at_call_time(monkeypatch):
    resolver = TFConfigClusterResolver()
    assert resolver.num_workers == 1
    set_tf_config(monkeypatch, GUIDE_TF_CONFIG)
    assert (resolver.task_type, resolver.task_id, resolver.num_workers) == ("worker", 1, 3)
    set_tf_config(monkeypatch, {"cluster": GUIDE_CLUSTER, "task": {"type": "worker", "index": 0}})
    assert resolver.task_id == 0 and resolver.is_chief


def test_tf_config_rpc_layer_and_environment(monkeypatch):
    set_tf_config(monkeypatch, {**GUIDE_TF_CONFIG, "rpc_layer": "grpc", "environment": "cloud"})
    resolver = TFConfigClusterResolver()
    assert resolver.rpc_layer == "grpc" and resolver.environment == "cloud"
    assert resolver.master() == "grpc://host2:port"
    assert resolver.master(rpc_layer="grpc+verbs") == "grpc+verbs://host2:port"


def test_tf_config_constructor_overrides(monkeypatch):
    set_tf_config(monkeypatch, {**GUIDE_TF_CONFIG, "rpc_layer": "grpc", "environment": "cloud"})
    resolver = TFConfigClusterResolver(task_type="worker", task_id=2, rpc_layer="rdma", environment="google")
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)
    assert resolver.rpc_layer == "rdma" and resolver.environment == "google"
    assert resolver.master() == "rdma://host3:port" and resolver.worker_index == 2
    only_id = TFConfigClusterResolver(task_id=0)
    assert (only_id.task_type, only_id.task_id, only_id.is_chief) == ("worker", 0, True)
    only_id.task_type, only_id.task_id = "ps", 1
    assert only_id.master() == "grpc://host5:port" and only_id.worker_index is None
    only_id.task_type, only_id.task_id = None, None  # back to TF_CONFIG
    assert (only_id.task_type, only_id.task_id) == ("worker", 1)


def test_tf_config_constructor_validation():
    with pytest.raises(TypeError, match="task_id must be an integer or None, got str '1'"):
        TFConfigClusterResolver(task_id="1")
    with pytest.raises(ValueError, match="task_id must be >= 0, got -2"):
        TFConfigClusterResolver(task_id=-2)
    with pytest.raises(TypeError, match="task_type must be a string or None"):
        TFConfigClusterResolver(task_type=0)


_W = {"worker": ["w0:1", "w1:1", "w2:1"]}

MALFORMED_TF_CONFIG = [
    ('{"cluster": ', "TF_CONFIG is not valid JSON: Expecting value at line 1 column 13 (char 12)"),
    ('{"cluster": {"worker": ["a:1",]}}', "TF_CONFIG is not valid JSON: Expecting value at line 1 column 31 (char 30)"),
    ("{'cluster': {}}", "TF_CONFIG is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2 (char 1)"),
    (["w0:1"], "TF_CONFIG must be a JSON object"),
    ({"cluster": ["w0:1"]}, 'TF_CONFIG["cluster"] must be a dict mapping job names to lists of "host:port" addresses, got list'),
    ({"cluster": {"worker": "w0:1"}}, 'TF_CONFIG["cluster"]["worker"] must be a list of "host:port" addresses or a dict mapping task indices to addresses, got str \'w0:1\''),
    ({"cluster": {"worker": ["w0:1", 2222]}}, 'TF_CONFIG["cluster"]["worker"][1] must be a "host:port" string, got int 2222'),
    ({"cluster": {"worker": ["w0:1", "w1"]}}, 'TF_CONFIG["cluster"]["worker"][1] must be a "host:port" address (e.g. "10.0.0.1:2222"), got \'w1\': the port is missing'),
    ({"cluster": {"worker": ["w0:1", ":2222"]}}, 'TF_CONFIG["cluster"]["worker"][1] must be a "host:port" address (e.g. "10.0.0.1:2222"), got \':2222\': the host is missing'),
    ({"cluster": {"worker": ["grpc://w0:1"]}}, 'TF_CONFIG["cluster"]["worker"][0] must be a plain "host:port" address'),
    ({"cluster": {"worker": {"one": "w0:1"}}}, 'TF_CONFIG["cluster"]["worker"]: task indices must be non-negative integers, got str \'one\''),
    ({"cluster": {"work er": ["w0:1"]}}, "TF_CONFIG[\"cluster\"]: invalid job name 'work er'"),
    ({"cluster": {"chief": ["c0:1", "c1:1"], **_W}}, 'TF_CONFIG["cluster"]["chief"] has 2 tasks; a cluster has at most one chief'),
    ({"cluster": {"evaluator": ["e0:1", "e1:1"], **_W}}, 'TF_CONFIG["cluster"]["evaluator"] has 2 tasks; a cluster has at most one evaluator'),
    ({"cluster": _W, "task": "worker"}, 'TF_CONFIG["task"] must be a JSON object like {"type": "worker", "index": 0}, got str'),
    ({"cluster": _W, "task": {"type": "worker"}}, 'TF_CONFIG["task"]["index"] is missing'),
    ({"cluster": _W, "task": {"index": 0}}, 'TF_CONFIG["task"]["type"] is missing'),
    ({"cluster": _W, "task": {"type": "worker", "index": "1"}}, 'TF_CONFIG["task"]["index"] must be an integer, got str \'1\''),
    ({"cluster": _W, "task": {"type": "worker", "index": 1.0}}, 'TF_CONFIG["task"]["index"] must be an integer, got float 1.0'),
    ({"cluster": _W, "task": {"type": "worker", "index": True}}, 'TF_CONFIG["task"]["index"] must be an integer, got bool True'),
    ({"cluster": _W, "task": {"type": "worker", "index": None}}, 'TF_CONFIG["task"]["index"] must be an integer, got NoneType None'),
    ({"cluster": _W, "task": {"type": "worker", "index": -1}}, 'TF_CONFIG["task"]["index"] must be >= 0, got -1'),
    ({"cluster": _W, "task": {"type": 1, "index": 0}}, 'TF_CONFIG["task"]["type"] must be a non-empty string such as "worker", got int 1'),
    ({"cluster": _W, "task": {"type": "", "index": 0}}, 'TF_CONFIG["task"]["type"] must be a non-empty string'),
    ({"cluster": {**_W, "ps": ["p:1"]}, "task": {"type": "chief", "index": 0}}, 'TF_CONFIG["task"]["type"] is "chief", which is not a job in TF_CONFIG["cluster"] (jobs: "ps", "worker")'),
    ({"cluster": _W, "task": {"type": "worker", "index": 3}}, 'TF_CONFIG["task"]["index"] is 3, out of range: job "worker" has 3 tasks (indices 0 to 2)'),
    ({"cluster": {"worker": {"0": "w0:1", "2": "w2:1"}}, "task": {"type": "worker", "index": 1}}, 'TF_CONFIG["task"]["index"] is 1, not a task of the sparse job "worker" (task indices: 0, 2)'),
    ({"cluster": _W, "task": {"type": "evaluator", "index": 1}}, 'TF_CONFIG["task"]["index"] is 1, but there is at most one evaluator'),
    ({"cluster": _W, "rpc_layer": 7}, 'TF_CONFIG["rpc_layer"] must be a string, got int 7'),
    ({"cluster": _W, "environment": ["cloud"]}, 'TF_CONFIG["environment"] must be a string, got list'),
]


@pytest.mark.parametrize(
    "config, message",
    MALFORMED_TF_CONFIG,
    ids=[message.split(" must ")[0].split(" is ")[0][:40] + f"-{i}" for i, (_, message) in enumerate(MALFORMED_TF_CONFIG)],
)
def test_tf_config_malformed(monkeypatch, config, message):
    set_tf_config(monkeypatch, config)
    resolver = TFConfigClusterResolver()
    with pytest.raises(ValueError, match=re.escape(message)):
        resolver.cluster_spec()
    with pytest.raises(ValueError, match=re.escape(message)):
        resolver.num_workers


def test_tf_config_extra_keys_are_ignored(monkeypatch):
    set_tf_config(
        monkeypatch,
        {**GUIDE_TF_CONFIG, "job": {"foo": 1}, "task": {"type": "worker", "index": 1, "trial": "3"}},
    )
    assert TFConfigClusterResolver().worker_index == 1


# --------------------------------------------------------------------------
# SimpleClusterResolver


def test_simple_cluster_resolver():
    spec = ClusterSpec(CHIEF_CLUSTER)
    resolver = SimpleClusterResolver(
        spec, master="chief0:2222", task_type="worker", task_id=1,
        environment="cloud", num_accelerators={"GPU": 2}, rpc_layer="grpc",
    )
    assert resolver.cluster_spec() == spec and resolver.cluster_spec() is not spec
    assert resolver.master() == "grpc://chief0:2222"
    assert resolver.master("ps", 0) == "grpc://ps0:2222"
    assert resolver.master("ps", 0, rpc_layer="rdma") == "rdma://ps0:2222"
    assert resolver.num_accelerators() == {"GPU": 2}
    assert resolver.environment == "cloud"
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.num_workers == 3 and resolver.worker_index == 2
    assert resolver.is_chief is False and resolver.chief_address == "chief0:2222"
    resolver.task_type, resolver.task_id = "chief", 0
    assert resolver.is_chief and resolver.worker_index == 0


def test_simple_cluster_resolver_defaults():
    resolver = SimpleClusterResolver({"worker": ["a:1", "b:1"]})
    assert resolver.master() == "" and resolver.rpc_layer is None
    assert resolver.task_type is None and resolver.task_id is None
    assert resolver.num_accelerators() == {} and resolver.environment == ""
    assert resolver.num_workers == 2 and resolver.chief_address == "a:1"
    assert resolver.is_chief is False and resolver.worker_index is None
    single = SimpleClusterResolver(ClusterSpec({}))
    assert single.num_workers == 1 and single.is_chief and single.worker_index == 0
    with pytest.raises(TypeError, match="cluster_spec must be a ClusterSpec or a dict"):
        SimpleClusterResolver(["a:1"])
    with pytest.raises(TypeError, match="master must be a string"):
        SimpleClusterResolver({}, master=None)
    with pytest.raises(ValueError, match="No such job in cluster: 'ps'"):
        resolver.master("ps", 0)


def test_cluster_resolver_is_abstract():
    with pytest.raises(TypeError):
        ClusterResolver()


# --------------------------------------------------------------------------
# SLURM


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("node01", ["node01"]),
        ("a,b,c", ["a", "b", "c"]),
        ("node[01-03,07],gpu-a[1-2]", ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[008-010]", ["n008", "n009", "n010"]),
        ("n[099-101]", ["n099", "n100", "n101"]),
        ("n[3],m[05]", ["n3", "m05"]),
        ("n[1-2,5-6,9]", ["n1", "n2", "n5", "n6", "n9"]),
        ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("c[2,1],c0", ["c2", "c1", "c0"]),  # order kept, as SLURM gives it
    ],
)
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    "hostlist, reason",
    [
        ("", "it is empty"),
        ("node[01-03", 'unclosed "["'),
        ("node01-03]", '"]" without "["'),
        ("n[[1]]", 'nested "["'),
        ("a,,b", "empty host name (stray comma)"),
        ("a,", "empty host name (stray comma)"),
        ("n[3-1]", "range '3-1' in [3-1] runs backwards"),
        ("n[a-b]", "bad range 'a-b' in [a-b]"),
        ("n[1-]", "bad range '1-'"),
        ("n[]", "bad range ''"),
        ("n[1-3:2]", "bad range '1-3:2'"),
        ("a b", "it contains whitespace"),
    ],
)
def test_expand_hostlist_errors(hostlist, reason):
    with pytest.raises(ValueError, match=re.escape(f"SLURM_STEP_NODELIST={hostlist!r} is not a valid SLURM host list: {reason}")):
        expand_hostlist(hostlist, "SLURM_STEP_NODELIST")


@pytest.mark.parametrize(
    "value, counts",
    [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,2(x2),3(x1)", [1, 2, 2, 3]), ("10(x2)", [10, 10])],
)
def test_expand_tasks_per_node(value, counts):
    assert expand_tasks_per_node(value) == counts


@pytest.mark.parametrize("value", ["", "2(x)", "x", "2(3)", "2x3", "2(x3", "-1", "1,,2"])
def test_expand_tasks_per_node_errors(value):
    with pytest.raises(ValueError, match=re.escape(f"SLURM_TASKS_PER_NODE={value!r} is not a valid SLURM tasks-per-node list")):
        expand_tasks_per_node(value, "SLURM_TASKS_PER_NODE")


def set_slurm(monkeypatch, procid, nodelist="node[01-03],gpu-a7", tasks="2(x3),1", ntasks=7, step=True):
    prefix = "SLURM_STEP_" if step else "SLURM_"
    monkeypatch.setenv("SLURM_PROCID", str(procid))
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS" if step else "SLURM_NTASKS", str(ntasks))
    monkeypatch.setenv("SLURM_STEP_NODELIST" if step else "SLURM_JOB_NODELIST", nodelist)
    monkeypatch.setenv(prefix + "TASKS_PER_NODE", tasks)


SLURM_ADDRESSES = [
    "node01:8888", "node01:8889", "node02:8888", "node02:8889",
    "node03:8888", "node03:8889", "gpu-a7:8888",
]


@pytest.mark.parametrize("step", [True, False], ids=["step-vars", "job-vars"])
def test_slurm_default_jobs(monkeypatch, step):
    set_slurm(monkeypatch, procid=4, step=step)
    resolver = SlurmClusterResolver()
    assert resolver.cluster_spec().as_dict() == {"worker": SLURM_ADDRESSES}
    assert (resolver.task_type, resolver.task_id) == ("worker", 4)
    assert resolver.get_task_info() == ("worker", 4)
    assert resolver.master() == "grpc://node03:8888"
    assert resolver.master("worker", 6, rpc_layer="rdma") == "rdma://gpu-a7:8888"
    assert resolver.num_workers == 7 and resolver.worker_index == 4
    assert resolver.is_chief is False and resolver.chief_address == "node01:8888"
    assert resolver.environment == "" and resolver.rpc_layer == "grpc"
    assert resolver.num_accelerators() == {}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # no GPUs: untouched
    resolver.rpc_layer = None
    assert resolver.master() == "node03:8888"


def test_slurm_step_vars_win_over_job_vars(monkeypatch):
    set_slurm(monkeypatch, procid=0, nodelist="job[1-4]", tasks="1(x4)", ntasks=4, step=False)
    set_slurm(monkeypatch, procid=1, nodelist="step[1-2]", tasks="1(x2)", ntasks=2, step=True)
    resolver = SlurmClusterResolver(port_base=7000)
    assert resolver.cluster_spec().as_dict() == {"worker": ["step1:7000", "step2:7000"]}
    assert resolver.master(rpc_layer=None) == "grpc://step2:7000"


@pytest.mark.parametrize(
    "procid, task, is_chief, worker_index",
    [(0, ("chief", 0), True, 0), (1, ("worker", 0), False, 1), (3, ("worker", 2), False, 3)],
)
def test_slurm_jobs_sorted_by_name(monkeypatch, procid, task, is_chief, worker_index):
    set_slurm(monkeypatch, procid, nodelist="n[1-2]", tasks="2(x2)", ntasks=4)
    resolver = SlurmClusterResolver(jobs={"worker": 3, "chief": 1})
    assert resolver.cluster_spec().as_dict() == {
        "chief": ["n1:8888"],
        "worker": ["n1:8889", "n2:8888", "n2:8889"],
    }
    assert (resolver.task_type, resolver.task_id) == task
    assert resolver.is_chief is is_chief and resolver.worker_index == worker_index
    assert resolver.num_workers == 4 and resolver.chief_address == "n1:8888"


def test_slurm_ps_job(monkeypatch):
    set_slurm(monkeypatch, 0, nodelist="n[1-2]", tasks="2(x2)", ntasks=4)
    resolver = SlurmClusterResolver(jobs={"worker": 3, "ps": 1})
    assert (resolver.task_type, resolver.task_id) == ("ps", 0)
    assert resolver.worker_index is None and resolver.num_workers == 3
    assert resolver.chief_address == "n1:8889"


def test_slurm_tasks_per_node_overrides(monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    resolver = SlurmClusterResolver(jobs={"worker": 4}, tasks_per_node=2, port_base=100)
    assert resolver.cluster_spec().as_dict() == {"worker": ["n1:100", "n1:101", "n2:100", "n2:101"]}
    assert resolver.task_id == 2
    by_host = SlurmClusterResolver(jobs={"worker": 3}, tasks_per_node={"x": 1, "y": 2})
    assert by_host.cluster_spec().as_dict() == {"worker": ["x:8888", "y:8888", "y:8889"]}
    assert by_host.master() == "grpc://y:8889"


def test_slurm_missing_variables_are_named():
    with pytest.raises(RuntimeError) as info:
        SlurmClusterResolver()
    message = str(info.value)
    for wanted in (
        "SLURM_PROCID",
        "SLURM_STEP_NUM_TASKS or SLURM_NTASKS",
        "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST",
        "SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE",
    ):
        assert wanted in message


def test_slurm_only_missing_variable_named(monkeypatch):
    set_slurm(monkeypatch, 0)
    monkeypatch.delenv("SLURM_PROCID")
    with pytest.raises(RuntimeError, match=r"not set: SLURM_PROCID\. Is this process"):
        SlurmClusterResolver()


@pytest.mark.parametrize(
    "env, kwargs, error, message",
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x2)"}, {}, ValueError, "SLURM_STEP_TASKS_PER_NODE='2(x2)' describes 2 nodes but SLURM_STEP_NODELIST='node[01-03],gpu-a7' lists 4"),
        ({"SLURM_STEP_NUM_TASKS": "8"}, {}, RuntimeError, "SLURM_STEP_NUM_TASKS=8 but SLURM_STEP_TASKS_PER_NODE lays out 7 tasks"),
        ({}, {"jobs": {"worker": 2, "ps": 1}}, RuntimeError, "jobs {'ps': 1, 'worker': 2} ask for 3 tasks but SLURM_STEP_TASKS_PER_NODE lays out 7"),
        ({"SLURM_PROCID": "7"}, {}, ValueError, "SLURM_PROCID=7 but the step has only 7 tasks"),
        ({"SLURM_PROCID": "zero"}, {}, ValueError, "SLURM_PROCID='zero' is not an integer >= 0"),
        ({"SLURM_STEP_NODELIST": "node[01-03"}, {}, ValueError, "SLURM_STEP_NODELIST='node[01-03' is not a valid SLURM host list"),
        ({}, {"jobs": {"bad job": 7}}, ValueError, "jobs: invalid job name 'bad job'"),
        ({}, {"port_base": 65535}, ValueError, "port_base=65535 with 2 tasks on node01 gives ports above 65535"),
        ({}, {"gpus_per_node": 2, "gpus_per_task": 2}, RuntimeError, "2 tasks on a node with gpus_per_task=2 need 4 GPUs, but gpus_per_node=2"),
    ],
)
def test_slurm_errors(monkeypatch, env, kwargs, error, message):
    set_slurm(monkeypatch, 0)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(error, match=re.escape(message)):
        SlurmClusterResolver(**kwargs)


def test_slurm_gpus_from_slurm_gpus_on_node(monkeypatch):
    set_slurm(monkeypatch, 3, nodelist="n[1-2]", tasks="2(x2)", ntasks=4)
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    resolver = SlurmClusterResolver()
    assert resolver.num_accelerators() == {"GPU": 2}
    assert resolver.gpu_ids == ["2", "3"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_slurm_gpus_map_through_visible_devices(monkeypatch):
    set_slurm(monkeypatch, 1, nodelist="n[1-2]", tasks="2(x2)", ntasks=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert SlurmClusterResolver().gpu_ids == ["6", "7"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"
    # A second resolver in the same process still sees the node's 4 GPUs.
    assert SlurmClusterResolver().gpu_ids == ["6", "7"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"


def test_slurm_auto_set_gpu_off(monkeypatch):
    set_slurm(monkeypatch, 1, nodelist="n[1-2]", tasks="2(x2)", ntasks=4)
    resolver = SlurmClusterResolver(gpus_per_node=4, gpus_per_task=1, auto_set_gpu=False)
    assert resolver.gpu_ids == ["1"] and resolver.num_accelerators() == {"GPU": 1}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


# --------------------------------------------------------------------------
# Docs and imports


@pytest.mark.parametrize("module", [_cluster_spec, _resolvers, _slurm, _torchrun], ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    output = []
    tests = [t for t in finder.find(module, module.__name__) if t.examples]
    assert tests, f"no examples in {module.__name__}"
    for test in tests:
        runner.run(test, out=output.append)
    assert runner.failures == 0, "".join(output)


def test_public_classes_have_examples_and_hints():
    import keras_dist.cluster_resolver as package

    for name in package.__all__:
        cls = getattr(package, name)
        assert ">>> " in (cls.__doc__ or ""), f"{name} has no example"
        if "__init__" in vars(cls):
            hints = typing.get_type_hints(cls.__init__)
            assert set(hints) >= set(inspect.signature(cls).parameters), f"{name} lacks hints"


BACKENDS = {"jax", "jaxlib", "tensorflow", "keras", "numpy", "tf_keras", "torch"}


def test_modules_import_only_the_standard_library():
    files = sorted(PACKAGE_DIR.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "_cluster_spec.py", "_resolvers.py", "_slurm.py"}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top not in BACKENDS, f"{path.name}:{node.lineno} imports {name}"
                assert name.startswith("keras_dist.cluster_resolver") or (
                    top in sys.stdlib_module_names
                ), f"{path.name}:{node.lineno} imports {name}, not the standard library"


@pytest.mark.starts_processes
def test_import_loads_no_backend():
    """Imported without keras_dist/__init__ (a stub parent), nothing else loads."""
    code = (
        "import sys, types\n"
        "stub = types.ModuleType('keras_dist'); stub.__path__ = [sys.argv[1]]\n"
        "sys.modules['keras_dist'] = stub\n"
        "import keras_dist.cluster_resolver as cr\n"
        "cr.TFConfigClusterResolver().cluster_spec()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in %r))\n" % (BACKENDS,)
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(PACKAGE_DIR.parent)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- torchrun -------------------------------------------------------------------

_TORCHRUN = {"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_torchrun_resolver_reads_torchruns_variables():
    from keras_dist.cluster_resolver import TorchrunClusterResolver

    resolver = TorchrunClusterResolver(environ=_TORCHRUN)
    assert (resolver.num_workers, resolver.worker_index, resolver.is_chief) == (3, 1, False)
    assert (resolver.task_type, resolver.task_id, resolver.local_rank) == ("worker", 1, 1)
    assert resolver.chief_address == resolver.master() == "10.0.0.1:29500"
    assert resolver.worker_addresses_known is False


@pytest.mark.parametrize(
    "change, message",
    [
        ({"RANK": None}, "RANK not set"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a non-negative integer"),
        ({"RANK": "3"}, "RANK=3 is not a rank of WORLD_SIZE=3"),
    ],
)
def test_torchrun_resolver_names_what_is_wrong(change, message):
    from keras_dist.cluster_resolver import TorchrunClusterResolver

    environ = {k: v for k, v in {**_TORCHRUN, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=re.escape(message)):
        TorchrunClusterResolver(environ=environ)


def test_multi_worker_strategy_reads_torchrun_where_tf_config_is_unset(monkeypatch):
    from keras_dist.strategies._multi_worker import _default_resolver
    from keras_dist.cluster_resolver import TorchrunClusterResolver

    monkeypatch.delenv("TF_CONFIG", raising=False)
    for name, value in _TORCHRUN.items():
        monkeypatch.setenv(name, value)
    assert isinstance(_default_resolver(), TorchrunClusterResolver)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}))
    assert isinstance(_default_resolver(), TFConfigClusterResolver)


def test_engines_that_need_every_address_refuse_a_torchrun_job():
    """JAX and TensorFlow need each worker's address (tf's gRPC servers, JAX's
    coordinator): one clear error, before anything joins."""
    import keras

    import keras_dist
    from keras_dist.cluster_resolver import TorchrunClusterResolver

    resolver = TorchrunClusterResolver(environ={**_TORCHRUN, "RANK": "0"})
    if keras.config.backend() == "torch":
        pytest.skip("torch joins a torchrun job (tests/test_torch_backend.py)")
    with pytest.raises(ValueError, match="torchrun names only its rendezvous address"):
        keras_dist.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
