"""The cluster, as the backend reaches it through the ``kubernetes`` client: the kubeconfig (or, in a
pod, its service account), and what the API can tell before a job is created, each refusal one
sentence that says what to do: no cluster to talk to, no MPIJob resource, an unknown namespace, Kueue
queue, PriorityClass or service account, credentials it does not take, a verb it forbids, more GPU
workers than its nodes hold."""

from __future__ import annotations

import os
from typing import Any

from ...errors import BackendSetupError
from .manifest import GPU_RESOURCE

GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"  # the MPI Operator's MPIJob
KUEUE, KUEUE_VERSION, LOCAL_QUEUES = "kueue.x-k8s.io", "v1beta1", "localqueues"
INSTALL_KUBERNETES = "pip install 'kubernetes>=29'"  # the ``kubernetes`` extra's
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"  # a pod's own credentials and namespace
NO_OPERATOR = ("the cluster has no MPIJob resource (kubeflow.org/v2beta1): install Kubeflow's MPI Operator "
               "(v0.5 or later; SageMaker HyperPod's EKS clusters ship it)")


class KubernetesSetupError(BackendSetupError):
    """The cluster cannot take the job (said before anything is created)."""


def kubernetes():
    """The ``kubernetes`` package, or the sentence that says how to install it."""
    try:
        import kubernetes as package
    except ImportError:
        raise KubernetesSetupError(f"the kubernetes backend needs the kubernetes package, which is not installed: "
                                   f"{INSTALL_KUBERNETES}") from None
    return package


def connect() -> tuple[Any, str]:
    """(an API client, the namespace jobs go to unless --namespace says): from the kubeconfig
    (``KUBECONFIG``, else ``~/.kube/config``), else in a pod from its service account."""
    k8s = kubernetes()
    config_exception = k8s.config.config_exception.ConfigException
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if any(os.path.exists(p) for p in path.split(os.pathsep)):
        try:
            api = k8s.config.new_client_from_config(config_file=path)  # (the client reads KUBECONFIG once, on import)
            _, active = k8s.config.list_kube_config_contexts(config_file=path)
        except (config_exception, OSError, ValueError, TypeError) as exc:
            raise KubernetesSetupError(f"the kubeconfig {path} cannot be used ({exc}); point KUBECONFIG at a "
                                       "working one (on EKS: aws eks update-kubeconfig --name CLUSTER)") from None
        return api, (active or {}).get("context", {}).get("namespace") or "default"
    if os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(os.path.join(SERVICE_ACCOUNT, "token")):
        configuration = k8s.client.Configuration()
        k8s.config.load_incluster_config(client_configuration=configuration)
        with open(os.path.join(SERVICE_ACCOUNT, "namespace")) as f:
            return k8s.client.ApiClient(configuration), f.read().strip() or "default"
    raise KubernetesSetupError("no Kubernetes cluster to talk to: there is no kubeconfig (KUBECONFIG, ~/.kube/config) "
                               "and this is not a pod with a service account; point KUBECONFIG at the cluster's "
                               "(on SageMaker HyperPod's EKS clusters: aws eks update-kubeconfig --name CLUSTER)")


def refusal(exc: Exception, verb: str, resource: str, namespace: str) -> KubernetesSetupError:
    """The API's refusal of ``verb`` on ``resource`` in ``namespace``, in one sentence."""
    status, message = getattr(exc, "status", None), _message(exc)
    if status == 401:
        return KubernetesSetupError(f"the cluster does not take the kubeconfig's credentials (401 Unauthorized: "
                                    f"{message}); log in again (on EKS: aws eks update-kubeconfig --name CLUSTER)")
    if status == 403:
        return KubernetesSetupError(
            f"the cluster forbids you to {verb} {resource} in namespace {namespace} ({message}); ask its admin for a "
            f"Role that grants it (kubectl auth can-i {verb} {resource} -n {namespace} says whether you may)")
    if status is None:
        return KubernetesSetupError(f"the cluster cannot be reached to {verb} {resource} ({type(exc).__name__}: "
                                    f"{exc}); is the kubeconfig's server reachable from here?")
    return KubernetesSetupError(f"the cluster refused to {verb} {resource} in namespace {namespace} "
                                f"({status} {getattr(exc, 'reason', '')}: {message})")


def _message(exc: Exception) -> str:
    import json

    try:
        return json.loads(getattr(exc, "body", "") or "{}").get("message") or str(getattr(exc, "reason", exc))
    except ValueError:
        return str(getattr(exc, "reason", exc))


def check(api, namespace: str, queue: str | None, priority_class: str | None = None,
          service_account: str | None = None) -> None:
    """What the API can tell before the job is created: the MPIJob resource, the namespace, the queue, the
    pods' PriorityClass and service account (which the operator could not make pods with)."""
    k8s = kubernetes()
    api_exception = k8s.client.exceptions.ApiException
    try:
        groups = {group.name: [v.version for v in group.versions]
                  for group in k8s.client.ApisApi(api).get_api_versions().groups}
    except Exception as exc:  # noqa: BLE001 - refused, or unreachable (a connection refused, a name that does not resolve)
        raise refusal(exc, "list", "API groups", namespace) from None
    if VERSION not in groups.get(GROUP, []):
        raise KubernetesSetupError(NO_OPERATOR)
    try:
        k8s.client.CoreV1Api(api).read_namespace(namespace)
    except api_exception as exc:
        if exc.status == 404:
            raise KubernetesSetupError(f"the cluster has no namespace {namespace}: name another with --namespace "
                                       f"(kubectl get namespaces lists them), or create it") from None
        if exc.status != 403:  # (many users may not read namespaces, only use their own)
            raise refusal(exc, "get", "namespaces", namespace) from None
    if service_account:
        try:
            k8s.client.CoreV1Api(api).read_namespaced_service_account(service_account, namespace)
        except api_exception as exc:
            if exc.status == 404:
                raise KubernetesSetupError(f"there is no service account {service_account} in namespace {namespace} "
                                           f"(kubectl get serviceaccounts -n {namespace} lists them)") from None
            if exc.status != 403:
                raise refusal(exc, "get", "serviceaccounts", namespace) from None
    if priority_class:
        try:
            k8s.client.SchedulingV1Api(api).read_priority_class(priority_class)
        except api_exception as exc:
            if exc.status == 404:
                raise KubernetesSetupError(f"the cluster has no PriorityClass {priority_class} (kubectl get "
                                           "priorityclasses lists them)") from None
            if exc.status != 403:
                raise refusal(exc, "get", "priorityclasses.scheduling.k8s.io", namespace) from None
    if queue:
        if KUEUE not in groups:
            raise KubernetesSetupError(f"--queue {queue} names a Kueue queue, but the cluster has no Kueue "
                                       f"(no {KUEUE} API): drop --queue, or install Kueue")
        try:
            k8s.client.CustomObjectsApi(api).get_namespaced_custom_object(KUEUE, KUEUE_VERSION, namespace,
                                                                          LOCAL_QUEUES, queue)
        except api_exception as exc:
            if exc.status == 404:
                raise KubernetesSetupError(f"there is no Kueue local queue {queue} in namespace {namespace} "
                                           f"(kubectl get localqueues -n {namespace} lists them)") from None
            if exc.status != 403:
                raise refusal(exc, "get", f"localqueues.{KUEUE}", namespace) from None


def node_gpus(api, node_selector: dict[str, str]) -> list[int] | None:
    """The GPUs each node that matches ``node_selector`` has (by what it has, not what runs there); None
    where the nodes cannot be listed (a user may not)."""
    k8s = kubernetes()
    selector = ",".join(f"{key}={value}" for key, value in node_selector.items())
    try:
        nodes = k8s.client.CoreV1Api(api).list_node(label_selector=selector).items
    except Exception:  # noqa: BLE001 - forbidden, or unreachable: the scheduler will say
        return None
    return [int((node.status.allocatable or {}).get(GPU_RESOURCE, 0)) for node in nodes]
