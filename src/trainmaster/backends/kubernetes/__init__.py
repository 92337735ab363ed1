"""The Kubernetes backend: jobs as Volcano Jobs.

Modules, from the commands down to the client:
  backend      the Backend of Volcano jobs: plan, submit, status, logs, cancel, list, top
  top          `top` on Kubernetes: devices and workers of each running pod
  stage        `data stage`: a dataset onto the shared claim, from a folder or S3
  nodewatch    the node watcher: a gang leaves a node that stopped answering, by itself
  clusterinfo  `cluster status`, the cluster's side: nodes, accelerators, queue, claim
  tensorboard  the add-ons' TensorBoard, port-forwarded
  jobs         submit, status, cancel and list of Volcano jobs
  status       a job's phase, pods, restarts, and the pod that holds rank 0
  volcano      the job config as a Volcano Job and its ConfigMap (pure)
  waiting      why a job waits: the gang scheduler's answer, from the PodGroup
  nodemark     mark, list and clear unhealthy nodes
  publish      in every pod: run the command; rank 0's pod publishes the run's progress
  progressmap  the job's progress ConfigMap: read by `status`, written by publish
  pod_script   the pod script's parts that identify the attempt (rendezvous id, cache lock)
  podspec      what a training pod takes from the node type: resources, env, placement
  client       the connection to a cluster and the errors its API answers
  cache_hold   in pod 0: hold a cacheset's lock around the command
  podproc      a pod's first process running its command as a child, signals passed on
  podpeers     in every pod: the peer watch and the fence (run/peers.py), and what the pod does
  names        Kubernetes names, and what Volcano's admission webhook checks
"""
