"""`KubernetesClusterResolver` and `GCEClusterResolver`: a cluster that a cloud
API lists (`tf.distribute.cluster_resolver`'s names and semantics).

Standard library only at import time. The `kubernetes` and
`googleapiclient` packages are imported only when a resolver is made
without a client of its own (`override_client=`, `service=`): code and
tests that pass one run offline and need neither package.
"""

from __future__ import annotations

import enum
import importlib
import os
from typing import Any, Mapping, Optional, Sequence

from keras_dist.cluster_resolver._cluster_spec import ClusterSpec, _describe, check_job_name, take_foreign
from keras_dist.cluster_resolver._resolvers import ClusterResolver

#: The pods of each job by default, as in TensorFlow.
DEFAULT_JOB_TO_LABEL_MAPPING = {"worker": ["job-name=tensorflow"]}
#: Set in every pod (Kubernetes' in-cluster configuration reads it).
IN_CLUSTER_VAR = "KUBERNETES_SERVICE_HOST"


def _import(module: str, pip_name: str, alternative: str, who: str) -> Any:
    """`module`, or an ImportError saying how to install it or do without it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{who} needs the {module.split('.')[0]!r} package to reach its API, "
            f"and it cannot be imported ({error}). Install it with "
            f"`pip install {pip_name}`, or pass {alternative}."
        ) from error


def _check_port(port: Any, name: str) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"{name} must be an integer port, got {_describe(port)}")
    if not 1 <= port <= 65535:
        raise ValueError(f"{name} must be a port in 1..65535, got {port}")
    return port


def _check_name(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {_describe(value)}")
    if not value.strip():
        raise ValueError(f"{name} must not be empty")
    return value


def _address(ip: Any, port: int, what: str) -> str:
    """`ip:port` (`[ip]:port` for IPv6); a RuntimeError naming `what` without an IP."""
    if not isinstance(ip, str) or not ip.strip():
        raise RuntimeError(
            f"{what} has no IP address yet (got {ip!r}); ask again once it has one"
        )
    ip = ip.strip()
    return f"[{ip}]:{port}" if ":" in ip and not ip.startswith("[") else f"{ip}:{port}"


class _ListedClusterResolver(ClusterResolver):
    """A resolver whose `cluster_spec()` asks a cloud API, again at each call."""

    def master(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        rpc_layer: Optional[str] = None,
    ) -> str:
        """The given task's address (this task by default) as
        `rpc_layer://ip:port`, read from a fresh `cluster_spec()`; "" when no
        task is given and this task is not set."""
        return self._master_of(task_type, task_id, rpc_layer)


# Kubernetes -----------------------------------------------------------------


def _check_label_mapping(mapping: Any) -> dict[str, list[str]]:
    where = "job_to_label_mapping"
    if not isinstance(mapping, Mapping):
        raise TypeError(
            f"{where} must be a dict of job name to a list of label selectors, "
            f"e.g. {DEFAULT_JOB_TO_LABEL_MAPPING}, got {_describe(mapping)}"
        )
    checked = {}
    for job, selectors in mapping.items():
        check_job_name(job, where)
        if isinstance(selectors, str) or not isinstance(selectors, Sequence):
            raise TypeError(
                f"{where}[{job!r}] must be a list of label selectors such as "
                f"['job-name=tensorflow'], got {_describe(selectors)}"
            )
        if not selectors:
            raise ValueError(f"{where}[{job!r}] lists no label selector")
        for selector in selectors:
            _check_name(selector, f"{where}[{job!r}]'s label selectors")
        checked[job] = list(selectors)
    return checked


class KubernetesExecutableLocation(enum.Enum):
    """Where the program runs, which says how `KubernetesClusterResolver`
    configures the `kubernetes` client (tf.distribute's
    `cluster_resolver.KubernetesExecutableLocation`): `WITHIN_CLUSTER`, in a
    pod (its service account); `OFF_CLUSTER`, elsewhere (the kube config).

    >>> KubernetesExecutableLocation.OFF_CLUSTER.value
    1
    """

    WITHIN_CLUSTER = 0
    OFF_CLUSTER = 1


def _kubernetes_api(location: Optional[KubernetesExecutableLocation]) -> Any:
    """A `CoreV1Api` of the `kubernetes` package, configured for where this
    runs (`location`; None: inside a pod when `KUBERNETES_SERVICE_HOST` is set)."""
    who, alternative = "KubernetesClusterResolver", "override_client=<a CoreV1Api-like client>"
    config = _import("kubernetes.config", "kubernetes", alternative, who)
    client = _import("kubernetes.client", "kubernetes", alternative, who)
    if location is None:
        within = bool(os.environ.get(IN_CLUSTER_VAR))
    else:
        within = location is KubernetesExecutableLocation.WITHIN_CLUSTER
    if within:
        config.load_incluster_config()  # in a pod: its service account
    else:
        config.load_kube_config()  # elsewhere: ~/.kube/config (or KUBECONFIG)
    return client.CoreV1Api()


def _check_location(location: Any, override_client: Any) -> Optional[KubernetesExecutableLocation]:
    if location is None:
        return None
    location = take_foreign(location, "executable_location")  # TensorFlow: tf's enum
    if not isinstance(location, KubernetesExecutableLocation):
        raise ValueError(
            "executable_location must be a keras_dist.cluster_resolver.KubernetesExecutableLocation "
            f"(WITHIN_CLUSTER or OFF_CLUSTER) or None, got {location!r}."
        )
    if override_client is not None:
        raise ValueError(
            "executable_location says how KubernetesClusterResolver configures "
            "the kubernetes client; with override_client= the client is yours, "
            "already configured, so it would not be used. Pass one of the two."
        )
    return location


class KubernetesClusterResolver(_ListedClusterResolver):
    """The pods of a Kubernetes cluster (as `tf.distribute.cluster_resolver`).

    Each job of `job_to_label_mapping` (default `{"worker":
    ["job-name=tensorflow"]}`) is the pods its label selectors match, in
    all namespaces: per selector sorted by pod name, the selectors in the
    order given. A task's address is its pod's IP and `tf_server_port`.
    `cluster_spec()` lists the pods again at each call and raises
    RuntimeError if a pod matched is not Running.

    The pods' labels do not say which pod this process is: set `task_type`
    and `task_id` (None by default) before making a multi-worker strategy.
    `override_client` is a `kubernetes.client.CoreV1Api`-like object, used
    as given; without one, the `kubernetes` package is imported (ImportError
    naming `pip install kubernetes` if it is missing) and configured from
    the pod's service account inside a cluster, else from the kube config;
    `executable_location` (a `KubernetesExecutableLocation`) says which
    instead of `KUBERNETES_SERVICE_HOST` (tf's default is `WITHIN_CLUSTER`;
    keras_dist's, None, looks).

    >>> from types import SimpleNamespace as Obj
    >>> class FakeCoreV1Api:  # answers as kubernetes.client.CoreV1Api()
    ...     def list_pod_for_all_namespaces(self, label_selector):
    ...         return Obj(items=[
    ...             Obj(metadata=Obj(name=f"trainer-{i}"),
    ...                 status=Obj(phase="Running", pod_ip=f"10.4.0.{7 + i}"))
    ...             for i in (1, 0)])
    >>> resolver = KubernetesClusterResolver(override_client=FakeCoreV1Api())
    >>> resolver.cluster_spec()
    ClusterSpec({'worker': ['10.4.0.7:8470', '10.4.0.8:8470']})
    >>> resolver.task_type, resolver.task_id = "worker", 1
    >>> resolver.master(), resolver.num_workers, resolver.is_chief
    ('grpc://10.4.0.8:8470', 2, False)
    """

    def __init__(
        self,
        job_to_label_mapping: Optional[Mapping[str, Sequence[str]]] = None,
        tf_server_port: int = 8470,
        rpc_layer: Optional[str] = "grpc",
        override_client: Any = None,
        executable_location: Optional[KubernetesExecutableLocation] = None,
    ):
        self._job_to_label_mapping = _check_label_mapping(
            job_to_label_mapping or DEFAULT_JOB_TO_LABEL_MAPPING
        )
        self._tf_server_port = _check_port(tf_server_port, "tf_server_port")
        location = _check_location(executable_location, override_client)
        self.task_type = None
        self.task_id = None
        self.rpc_layer = rpc_layer
        self._client = _kubernetes_api(location) if override_client is None else override_client

    def cluster_spec(self) -> ClusterSpec:
        """The pods each job's label selectors match now, as `pod_ip:tf_server_port`.

        RuntimeError if one of them is not in the Running phase.
        """
        cluster = {}
        for job, selectors in self._job_to_label_mapping.items():
            addresses = []
            for selector in selectors:
                listed = self._client.list_pod_for_all_namespaces(label_selector=selector)
                for pod in sorted(listed.items, key=lambda pod: pod.metadata.name):
                    name, phase = pod.metadata.name, pod.status.phase
                    if phase != "Running":
                        raise RuntimeError(
                            f'Pod "{name}" is not running; phase: "{phase}" (job '
                            f"{job!r}, label selector {selector!r}). Every pod a "
                            "selector matches must be Running: wait for them, or "
                            "delete finished pods that still carry the label."
                        )
                    addresses.append(
                        _address(pod.status.pod_ip, self._tf_server_port, f'Pod "{name}"')
                    )
            cluster[job] = addresses
        return ClusterSpec(cluster)

    def __repr__(self) -> str:
        return (
            f"KubernetesClusterResolver(job_to_label_mapping={self._job_to_label_mapping!r}, "
            f"tf_server_port={self._tf_server_port!r})"
        )


# Google Compute Engine --------------------------------------------------------


class GCEClusterResolver(_ListedClusterResolver):
    """The running instances of a Compute Engine instance group (as
    `tf.distribute.cluster_resolver`).

    `cluster_spec()` asks the Compute Engine API, at each call, for the
    group's RUNNING instances (every page) and each one's internal IP
    (`networkInterfaces[0].networkIP`): one job, `task_type`, of the
    `ip:port` addresses in sorted order. The instances do not say which one
    this process is: give each its `task_id`. `task_type` is the job's name,
    fixed when the resolver is made; `task_id` and `rpc_layer` can be set.

    `service` is a `googleapiclient.discovery.build("compute", "v1")`-like
    object, used as given; without one, `googleapiclient` is imported
    (ImportError naming `pip install google-api-python-client` if it is
    missing) and builds it with `credentials` ("default": the application
    default credentials).

    >>> class Answer:  # a googleapiclient request
    ...     def __init__(self, value): self.value = value
    ...     def execute(self): return self.value
    >>> class FakeCompute:  # answers as discovery.build("compute", "v1")
    ...     def instanceGroups(self): return self
    ...     def instances(self): return self
    ...     def listInstances(self, project, zone, instanceGroup, body):
    ...         return Answer({"items": [{"instance": ".../instances/vm-b"},
    ...                                  {"instance": ".../instances/vm-a"}]})
    ...     def listInstances_next(self, previous_request, previous_response):
    ...         return None  # one page
    ...     def get(self, project, zone, instance):
    ...         ip = {"vm-a": "10.0.0.3", "vm-b": "10.0.0.2"}[instance]
    ...         return Answer({"networkInterfaces": [{"networkIP": ip}]})
    >>> resolver = GCEClusterResolver("my-project", "us-west1-b", "trainers", 2222,
    ...                               task_id=1, service=FakeCompute())
    >>> resolver.cluster_spec()
    ClusterSpec({'worker': ['10.0.0.2:2222', '10.0.0.3:2222']})
    >>> resolver.master(), resolver.worker_index, resolver.chief_address
    ('grpc://10.0.0.3:2222', 1, '10.0.0.2:2222')
    """

    def __init__(
        self,
        project: str,
        zone: str,
        instance_group: str,
        port: int,
        task_type: str = "worker",
        task_id: int = 0,
        rpc_layer: Optional[str] = "grpc",
        credentials: Any = "default",
        service: Any = None,
    ):
        self._project = _check_name(project, "project")
        self._zone = _check_name(zone, "zone")
        self._instance_group = _check_name(instance_group, "instance_group")
        self._port = _check_port(port, "port")
        self._task_type = check_job_name(task_type, "task_type")
        self.task_id = task_id
        self.rpc_layer = rpc_layer
        self._credentials = credentials
        if service is None:
            discovery = _import(
                "googleapiclient.discovery",
                "google-api-python-client",
                'service=<a discovery.build("compute", "v1")-like object>',
                "GCEClusterResolver",
            )
            default = isinstance(credentials, str) and credentials == "default"
            service = discovery.build(
                "compute", "v1", credentials=None if default else credentials,
                cache_discovery=False,
            )
        self._service = service

    @ClusterResolver.task_type.setter
    def task_type(self, task_type: Optional[str]) -> None:
        raise RuntimeError(
            "The task_type of a GCEClusterResolver is the job name of its instance "
            "group's tasks and cannot be changed once it is made; pass task_type= "
            "to GCEClusterResolver(...) instead."
        )

    def cluster_spec(self) -> ClusterSpec:
        """`{task_type: ["ip:port", ...]}` of the group's RUNNING instances, sorted."""
        location = {"project": self._project, "zone": self._zone}
        groups = self._service.instanceGroups()
        request = groups.listInstances(
            instanceGroup=self._instance_group, body={"instanceState": "RUNNING"}, **location
        )
        addresses = []
        while request is not None:
            response = request.execute()
            for item in response.get("items", []):  # an empty page has no "items"
                name = item["instance"].rsplit("/", 1)[-1]
                details = self._service.instances().get(instance=name, **location).execute()
                interfaces = details.get("networkInterfaces") or [{}]
                addresses.append(
                    _address(interfaces[0].get("networkIP"), self._port, f"Instance {name!r}")
                )
            request = groups.listInstances_next(previous_request=request, previous_response=response)
        return ClusterSpec({self._task_type: sorted(addresses)})

    def __repr__(self) -> str:
        return (
            f"GCEClusterResolver(project={self._project!r}, zone={self._zone!r}, "
            f"instance_group={self._instance_group!r}, port={self._port!r})"
        )
