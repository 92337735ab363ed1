"""The Kubernetes backend: jobs as Volcano Jobs."""
