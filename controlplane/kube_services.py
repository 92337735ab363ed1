"""Cluster DNS and Services for the real nodes: one CoreDNS and one kube-proxy, on the host.

A cluster runs both as pods on every node; here all nodes share one host, one network stack and
one set of iptables rules, so one of each serves them all, as host processes (no image needed).
- CoreDNS answers cluster.local from the API server (its kubernetes plugin, identity
  system:coredns with the read-only role its upstream manifests give it) on HOST_IP:53, the
  kubelets' clusterDNS; other names go to the host's resolver.
- kube-proxy, iptables mode, identity system:kube-proxy (bound to system:node-proxier by the
  API server's bootstrap policy), masqueradeAll: a pod that reaches a ClusterIP whose endpoint
  is on its own bridge would otherwise get replies straight from that pod, which it drops. It
  takes real-1's name, as it must be some node's (it reads the node's IPs at start and waits
  30 s for a node that does not exist).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kube_pki
import kube_procs
import yaml

DNS_IP = kube_pki.HOST_IP
COREDNS_USER = "system:coredns"


def make_certs(pki: Path, nodes: list[dict[str, Any]]) -> None:
    """The real nodes' identities: each kubelet's client (system:node:NAME in system:nodes, what
    the Node authorizer and NodeRestriction expect) and serving certificate (its node IP, which
    the API server dials and checks: --kubelet-certificate-authority), the API server's client
    certificate for the kubelets, kube-proxy's and CoreDNS's."""
    for node in nodes:
        name = node["name"]
        kube_pki.issue(pki, f"node-{name}", f"/O=system:nodes/CN=system:node:{name}", "clientAuth")
        sans = f"IP:{node['node_ip']},DNS:{name}"
        kube_pki.issue(pki, f"kubelet-{name}", f"/CN={name}", "serverAuth", sans)
    kube_pki.issue(
        pki,
        "apiserver-kubelet-client",
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
        "clientAuth",
    )
    kube_pki.issue(pki, "kube-proxy", "/CN=system:kube-proxy", "clientAuth")
    kube_pki.issue(pki, "coredns", f"/CN={COREDNS_USER}", "clientAuth")


def coredns_rbac(api: Any) -> None:
    """What CoreDNS's own deployment manifests grant it: read Services, EndpointSlices, pods and
    namespaces."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api)
    name = "trainmaster:coredns"
    rbac.create_cluster_role(
        {
            "metadata": {"name": name},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [
                {"kind": "User", "name": COREDNS_USER, "apiGroup": "rbac.authorization.k8s.io"}
            ],
        }
    )


def corefile(kubeconfig: Path, ports: dict[str, int]) -> str:
    """cluster.local from the API server (records live 5 s, cached 5 s at most, so a Service or a
    pod's name is found seconds after it appears), the rest forwarded to the host's resolver."""
    return f""".:53 {{
    bind {DNS_IP}
    errors
    log
    health 127.0.0.1:{ports["coredns-health"]}
    ready 127.0.0.1:{ports["coredns-ready"]}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} trainmaster-kube
        pods insecure
        ttl 5
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
    forward . /etc/resolv.conf
}}
"""


def start_coredns(procs: kube_procs.Processes, ports: dict[str, int]) -> None:
    run = procs.run
    (run / "coredns").mkdir(exist_ok=True)
    conf = run / "coredns" / "Corefile"
    conf.write_text(corefile(run / "kubeconfigs" / "coredns.kubeconfig", ports))
    procs.start("coredns", "-conf", str(conf))


def coredns_ready(ports: dict[str, int]) -> bool:
    return kube_procs.http_ok(f"http://127.0.0.1:{ports['coredns-ready']}/ready")


def kube_proxy_config(run: Path, ports: dict[str, int], node_name: str) -> dict[str, Any]:
    import kube_hostnet

    zero = "0s"  # conntrack timeouts: leave the host's as they are
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(run / "kubeconfigs" / "kube-proxy.kubeconfig")},
        "hostnameOverride": node_name,
        "bindAddress": kube_pki.HOST_IP,
        "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
        "clusterCIDR": kube_hostnet.CLUSTER_CIDR,
        "detectLocalMode": "ClusterCIDR",
        # no route_localnet on the host: NodePorts on 127.0.0.1 are not needed here
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False, "minSyncPeriod": "0s"},
        "conntrack": {
            "maxPerCore": 0,  # leave nf_conntrack_max alone
            "tcpEstablishedTimeout": zero,
            "tcpCloseWaitTimeout": zero,
        },
    }


def start_kube_proxy(procs: kube_procs.Processes, ports: dict[str, int], node_name: str) -> None:
    config = procs.run / "kube-proxy.yaml"
    config.write_text(yaml.safe_dump(kube_proxy_config(procs.run, ports, node_name)))
    procs.start("kube-proxy", f"--config={config}")


def kube_proxy_ready(ports: dict[str, int]) -> bool:
    """/healthz answers 200 once the rules were written at least once."""
    return kube_procs.http_ok(f"http://127.0.0.1:{ports['kube-proxy-healthz']}/healthz")
