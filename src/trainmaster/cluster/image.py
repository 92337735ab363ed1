"""The training image's Dockerfiles: Neuron, CUDA and CPU flavours, every base and package pinned.

The build context is a trainmaster source tree (runbook.sh: $TRAINMASTER_SRC), so the image runs
exactly the trainer the operator plans with, not a script fetched from another repository's
master branch (the tutorial's; docs/architecture.md 5: tutorial 6.1, 6.13). torch comes first,
pinned (the Neuron base image brings torch-neuronx's), then the project with a constraint that
keeps that torch: pip never swaps in another build. python-etcd (torch's etcd rendezvous) and
tensorboard (the TensorBoard Deployment runs this image) are pinned too. Builds use
`--platform linux/amd64`, so an ARM laptop builds the image the nodes run
(docs/architecture.md 5: tutorial 1). The base image and torch's pip index are build arguments
(BASE, TORCH_INDEX_URL) whose defaults are the pins: a plain build is the pinned image, and a
build behind a mirror, or controlplane/kube_image.py's without a registry, names its own.
"""

from __future__ import annotations

from trainmaster.cluster import versions
from trainmaster.launch import entry

FLAVOURS = ("neuron", "torchneuron", "cuda", "cpu")
SOURCE_DIR = "/opt/trainmaster/src"

_DOCKERIGNORE = """\
# The build context is a trainmaster checkout; send only what the image installs.
**
!pyproject.toml
!README.md
!src/**
**/__pycache__
"""


def _install(*pins: str) -> str:
    """Install the project around the image's torch; `pins`: versions the flavour was tested
    with (the neuron flavour's transformers: the trn1 stack's)."""
    extra = "".join(f'"{p}" ' for p in pins)
    return f"""\
COPY pyproject.toml README.md {SOURCE_DIR}/
COPY src {SOURCE_DIR}/src
# Keep the torch that is installed; install the project and its pinned extras around it.
RUN {{ python -m pip freeze | grep -i -E '^(torch|torch-neuronx|torch-xla)==' || true; }} > /tmp/keep.txt \\
 && python -m pip install --no-cache-dir -c /tmp/keep.txt \\
        "python-etcd=={versions.PYTHON_ETCD_VERSION}" "tensorboard=={versions.TENSORBOARD_VERSION}" \\
        {extra}{SOURCE_DIR} \\
 && python -c "import trainmaster, etcd, tensorboard; print('trainmaster', trainmaster.__version__)"
"""


_ENV = """\
ENV PYTHONUNBUFFERED=1 \\
    PIP_DISABLE_PIP_VERSION_CHECK=1
"""


def _header(flavour: str, base: str, note: str, torch_index: str = "") -> str:
    """The first lines: the pinned base and, where pip installs torch, its index, each a build
    argument whose default is the pin, so a plain build is the pinned image and a build behind a
    mirror (or without Docker Hub) names its own. BASE comes before FROM, which may use only such
    arguments; TORCH_INDEX_URL is declared inside the stage, where RUN sees it."""
    args = "#   BASE             the base image\n"
    if torch_index:
        args += "#   TORCH_INDEX_URL  the pip index torch comes from\n"
    text = (
        f"# syntax=docker/dockerfile:1\n"
        f"# trainmaster training image, {flavour} flavour (written by `trainmaster cluster plan`).\n"
        f"# {note}\n"
        f"# Build arguments (defaults: the pins; behind a mirror, --build-arg NAME=the mirror's):\n"
        f"{args}"
        f"ARG BASE={base}\n"
        f"FROM --platform=linux/amd64 ${{BASE}}\n"
    )
    return text + (f"ARG TORCH_INDEX_URL={torch_index}\n" if torch_index else "")


def neuron() -> str:
    return (
        _header(
            "neuron",
            versions.NEURON_BASE_IMAGE,
            "AWS Neuron DLC: torch-neuronx, neuronx-cc, Neuron runtime and tools, EFA, libfabric.",
        )
        + f"""\
{_ENV}ENV PATH=/opt/aws/neuron/bin:$PATH \\
    FI_PROVIDER=efa \\
    FI_EFA_USE_DEVICE_RDMA=1 \\
    FI_EFA_FORK_SAFE=1
{_install(f"transformers=={versions.TRN1_TRANSFORMERS}")}WORKDIR /workspace
CMD ["/bin/bash"]
"""
    )


def torchneuron() -> str:
    """Trn2/Trn3 on TorchNeuron (PUBLIC BETA, as AWS flags it): torch and torch-neuronx
    (versions.TORCH_VERSION, versions.TORCHNEURON_VERSION) from Neuron's pip repository, on the
    Ubuntu of Neuron's own images (versions.py says what was and was not verified). The Neuron
    runtime and collectives come from Neuron's apt repository as the quickstart installs them;
    their Neuron 2.34 versions were not readable here, so they are the repository's at build
    time: the build prints them, pin them then (`apt-get install aws-neuronx-runtime-lib=VERSION`)."""
    efa = versions.EFA_INSTALLER_URL
    return (
        _header(
            "torchneuron",
            versions.TORCHNEURON_BASE_IMAGE,
            f"BETA: {versions.TORCHNEURON_BETA}. Native PyTorch on Trainium2/3, device 'neuron'.",
            versions.TORCH_INDEX["cpu"],
        )
        + f"""\
{_ENV}ENV PATH=/opt/venv/bin:/opt/aws/neuron/bin:$PATH \\
    FI_PROVIDER=efa \\
    FI_EFA_USE_DEVICE_RDMA=1 \\
    FI_EFA_FORK_SAFE=1
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
        python3 python3-venv ca-certificates curl gnupg \\
 && curl -fsSL https://apt.repos.neuron.amazonaws.com/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB \\
        | gpg --dearmor -o /usr/share/keyrings/neuron-archive-keyring.gpg \\
 && . /etc/os-release \\
 && echo "deb [signed-by=/usr/share/keyrings/neuron-archive-keyring.gpg] https://apt.repos.neuron.amazonaws.com $VERSION_CODENAME main" \\
        > /etc/apt/sources.list.d/neuron.list \\
 && apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
        aws-neuronx-runtime-lib aws-neuronx-collectives \\
 && dpkg -l 'aws-neuronx-*' \\
 && curl -fsSL --retry 5 -o /tmp/efa.tar.gz {efa} \\
 && tar -xf /tmp/efa.tar.gz -C /tmp \\
 && (cd /tmp/aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify) \\
 && rm -rf /tmp/efa.tar.gz /tmp/aws-efa-installer /var/lib/apt/lists/* \\
 && python3 -m venv /opt/venv
RUN python -m pip install --no-cache-dir "torch=={versions.TORCH_VERSION}" --index-url "$TORCH_INDEX_URL" \\
 && python -m pip install --no-cache-dir --extra-index-url {versions.NEURON_PIP_INDEX} \\
        "torch-neuronx=={versions.TORCHNEURON_VERSION}.*" "torch=={versions.TORCH_VERSION}"
{_install()}WORKDIR /workspace
CMD ["/bin/bash"]
"""
    )


# Where the EFA installer puts the aws-ofi-nccl plugin on Ubuntu: a multiarch folder, not lib/
# itself. NCCL finds the plugin only through LD_LIBRARY_PATH; with the wrong
# folder it silently falls back to TCP sockets, on p5 a large slow-down. Source:
# github.com/awslabs/awsome-distributed-training micro-benchmarks/nccl-tests/nccl-tests.Dockerfile
# (LD_LIBRARY_PATH .../ofi-nccl/lib/x86_64-linux-gnu, and its `ls .../libnccl-ofi*.so` check).
OFI_NCCL_LIB = "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu"


def cuda() -> str:
    efa = versions.EFA_INSTALLER_URL
    return (
        _header(
            "cuda",
            versions.CUDA_BASE_IMAGE,
            "CUDA base; torch's wheels bring cuDNN and NCCL; EFA userspace + aws-ofi-nccl from the EFA installer.",
            versions.TORCH_INDEX["cuda"],
        )
        + f"""\
{_ENV}ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility \\
    FI_PROVIDER=efa \\
    FI_EFA_USE_DEVICE_RDMA=1 \\
    LD_LIBRARY_PATH={OFI_NCCL_LIB}:/opt/amazon/efa/lib:$LD_LIBRARY_PATH \\
    PATH=/opt/venv/bin:$PATH
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
        python3 python3-venv ca-certificates curl \\
 && curl -fsSL --retry 5 -o /tmp/efa.tar.gz {efa} \\
 && tar -xf /tmp/efa.tar.gz -C /tmp \\
 && (cd /tmp/aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify) \\
 && ls {OFI_NCCL_LIB}/libnccl-ofi*.so \\
 && rm -rf /tmp/efa.tar.gz /tmp/aws-efa-installer /var/lib/apt/lists/* \\
 && python3 -m venv /opt/venv
RUN python -m pip install --no-cache-dir "torch=={versions.TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"
{_install()}WORKDIR /workspace
CMD ["/bin/bash"]
"""
    )


def cpu() -> str:
    return (
        _header(
            "cpu",
            versions.CPU_BASE_IMAGE,
            "CPU only: CPU node groups, and a quick check of the image without accelerators.",
            versions.TORCH_INDEX["cpu"],
        )
        + f"""\
{_ENV}RUN python -m pip install --no-cache-dir "torch=={versions.TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"
{_install()}WORKDIR /workspace
CMD ["/bin/bash"]
"""
    )


def dockerfiles() -> dict[str, str]:
    """File name -> text, with BuildKit's per-Dockerfile ignore files next to each."""
    files: dict[str, str] = {}
    for flavour, text in (
        ("neuron", neuron()),
        ("torchneuron", torchneuron()),
        ("cuda", cuda()),
        ("cpu", cpu()),
    ):
        files[f"Dockerfile.{flavour}"] = text
        files[f"Dockerfile.{flavour}.dockerignore"] = _DOCKERIGNORE
    return files


# --- your code on top of the training image (kubernetes.workspace, docs/architecture.md 3.8) ------
# A custom job.entrypoint runs from the image, like the built-in trainer: the pods of a job all
# run the same code, and a restart months later runs it again. So the workspace is built into
# an image of its own, FROM the pushed training image, rather than copied into pods at run time.
WORKSPACE_DIR = entry.WORKSPACE_DIR  # the training images' WORKDIR; the shim looks there

_WORKSPACE_IGNORE = """\
# Not part of the code the job runs: version control, environments, data, plans, caches.
.git
**/.venv
**/__pycache__
trainmaster-data
cluster-plan
"""


def workspace(folder: str, flavour: str) -> str:
    """image/Dockerfile.workspace: COPY the workspace folder onto the training image."""
    return f"""\
# syntax=docker/dockerfile:1
# Your code on top of the {flavour} training image (written by `trainmaster cluster plan`;
# kubernetes.workspace = {folder!r}). Build it from that folder once the training image is pushed
# (`cluster up`, or `cluster status` prints it as REPO@sha256:...), push it, and launch with it:
#   docker build --platform linux/amd64 -f image/Dockerfile.workspace \\
#       --build-arg BASE=REPO@sha256:... -t REPO:TAG-workspace {folder}
#   docker push REPO:TAG-workspace
#   trainmaster launch JOB.toml --set kubernetes.image=REPO@sha256:<the pushed digest>
# job.entrypoint's relative paths and -m modules are found in {WORKSPACE_DIR}.
ARG BASE
FROM --platform=linux/amd64 ${{BASE}}
COPY . {WORKSPACE_DIR}
WORKDIR {WORKSPACE_DIR}
"""


def workspace_files(folder: str, flavour: str) -> dict[str, str]:
    return {
        "Dockerfile.workspace": workspace(folder, flavour),
        "Dockerfile.workspace.dockerignore": _WORKSPACE_IGNORE,
    }
