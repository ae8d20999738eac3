"""A cluster the doctor finds healthy, on the simulated control plane: namespace ml, every CRD a
``trainjob`` with Kueue needs, two GKE spot A100 nodes (recorded), every verb allowed. Each
failing scenario changes one thing."""

from tests.trainops.cluster.kubernetes.control_plane import ControlPlane
from tests.trainops.cluster.kubernetes.fake_k8s import load

SERVER = "https://10.0.0.1"


def healthy_plane() -> ControlPlane:
    plane = ControlPlane()
    plane.crds |= {"clustertrainingruntimes", "jobsets", "localqueues", "clusterqueues", "queues"}
    for name in ("gke-spot-a", "gke-spot-b"):
        plane.add_node(name, recorded=load("node-gke-spot-a2"))
    return plane
