"""The infrastructure the Kubernetes backend needs: EKS, accelerator nodes, add-ons, storage, image.

    spec.py            the job's [cluster] section resolved and checked (names, zones, nodes)
    versions.py        every pinned version, in one table; eks_versions.py the EKS versions accepted
    eksctl.py          ClusterConfig files: cluster + system node group, accelerator node group, IRSA
    cloudformation.py  launch template (EFA per network card), security groups, node role
    addons.py, fsx.py  device plugins, Volcano queue, etcd, TensorBoard; FSx CSI, StorageClass, claim
    image.py           the training image's Dockerfiles (Neuron, CUDA, CPU)
    steps.py           a step as data; the ordered lists: upsteps.py (AWS, nodes), servicesteps.py
                       (what jobs need on the nodes), downsteps.py; runbook.py renders runbook.sh
    plan.py            `cluster plan`: writes the files (builders are pure; this is the I/O)
    up.py              `cluster up | down | scale`: runs the steps with progress, skip and resume
    status.py, aws.py  `cluster status`; boto3 look-ups with errors a user can act on
    nodeguard.py       the node mark's RBAC and admission policy, and the node watcher's objects
    progressguard.py   who may publish a job's progress: RBAC and admission policy
    monitoring.py      cluster.monitoring: Prometheus, Grafana, the jobs' monitors and alerts

Builders are pure functions of the config (docs/architecture.md 2); AWS and the cluster are touched
only by aws.py, status.py and the subprocesses up.py starts.
"""
