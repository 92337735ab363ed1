"""`trainmaster export torchx FILE`: the job as a TorchX component, for teams that keep `torchx run`.

The component's one role runs what a Volcano pod of the job runs (backends/kubernetes/volcano.py): the
resolved job file copied into the run folder, then the torchrun command line of
launch/torchrun.py, with the pod's environment and resources. Where TorchX differs, it decides:
- rendezvous c10d at rank 0's host, which the scheduler publishes in the environment variable
  that the `rank0_env` macro names; the `$$${rank0_env}` spelling (an escaped `$`, then the
  macro) leaves `$TORCHX_RANK0_HOST`-style text for bash to expand, as TorchX's own dist.ddp
  does (pytorch/torchx torchx/components/dist.py, `rdzv_endpoint` default);
- --rdzv-id the TorchX app id (`${app_id}`), new per submission, so a relaunch never meets the
  rendezvous its previous run closed (backends/local/agents.py rdzv_id says why that matters);
- macros are substituted by string.Template (pytorch/torchx torchx/specs/api.py,
  macros.Values.substitute), so every other `$` in the script is written `$$`.
The rendezvous is always c10d (TorchX publishes rank 0's host; no etcd needed).
A compile job's rank 0 takes the cacheset's lock itself (train/__main__.py), as when no launcher
holds it. Gang scheduling and queues are the TorchX scheduler's business (`-s kubernetes -cfg
queue=...` submits a Volcano job); trainmaster's own checks ran when the file was written.
What the role carries so that the pods match trainmaster's own (TorchX 0.7.0
torchx/schedulers/kubernetes_scheduler.py, role_to_pod):
- the shared storage: kubernetes.pvc mounted at kubernetes.mount (specs.VolumeMount), where the
  job finds its dataset and writes its run;
- memory in TorchX's unit: memMB becomes the limit `{memMB}M`, decimal megabytes, so memMB is the
  pod limit in bytes / 10**6 (460Gi -> 493921), not MiB;
- the instance type as the capability TorchX turns into a node selector;
- /dev/shm: TorchX mounts its own memory-backed emptyDir there without a sizeLimit and offers no
  way to set one; Kubernetes sizes such a volume to the pod's memory limit, so it is bounded by
  the limit, not by the 1/8 of it that trainmaster's pods use (backends/kubernetes/podspec.py).
Device taints need no tolerations here: EKS enables the ExtendedResourceToleration admission
plugin, which adds them for the extended resources a pod requests.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from trainmaster.backends.kubernetes import podspec, volcano
from trainmaster.config import JobConfig, jobfile
from trainmaster.launch import torchrun
from trainmaster.launch.entry import WORKSPACE_DIR
from trainmaster.storage import RunPaths, Storage

C10D_PORT = volcano.C10D_PORT
_ENDPOINT, _ID = "@TRAINMASTER_ENDPOINT@", "@TRAINMASTER_APP_ID@"
_TOML_END = "TRAINMASTER_JOB_TOML"


def _escape(text: str) -> str:
    return text.replace("$", "$$")


def script(cfg: JobConfig) -> str:
    """The role's `bash -c` script, macros in TorchX's spelling."""
    run = RunPaths(Storage(Path(cfg.kubernetes.mount)).run_dir(cfg.job.name))
    cmd = torchrun.command(
        cfg,
        torchrun.Rendezvous("c10d", _ENDPOINT, run_id=_ID),
        job_file=str(run.job_toml),
        storage=cfg.kubernetes.mount,
        python="python",
        workdir=WORKSPACE_DIR,
    )
    toml = jobfile.render(cfg, f"resolved job {cfg.job.name} (trainmaster export torchx)")
    q = shlex.quote
    tmp = f"{run.dir}/.job.toml.@TRAINMASTER_REPLICA@"
    text = (
        "\n".join(
            [
                "set -eu",
                f"mkdir -p {q(str(run.dir))}",
                f"cat > {q(tmp)} <<'{_TOML_END}'",
                toml.rstrip("\n"),
                _TOML_END,
                f"mv -f {q(tmp)} {q(str(run.job_toml))}",
                "exec " + shlex.join(cmd),
            ]
        )
        + "\n"
    )
    text = _escape(text)
    # The endpoint's host is expanded by bash at run time: double quotes, not single.
    text = re.sub(
        rf"'?--rdzv-endpoint={_ENDPOINT}'?", f'"--rdzv-endpoint=$$${{rank0_env}}:{C10D_PORT}"', text
    )
    return text.replace(_ID, "${app_id}").replace("@TRAINMASTER_REPLICA@", "${replica_id}")


def component(cfg: JobConfig, *, image: str | None = None) -> str:
    """The text of a Python module with one TorchX component function, named after the job."""
    # The Volcano backend's checks (node type, workers per node, names, endpoint); an image may
    # still be left for `torchx run --image`.
    inst = volcano.check(cfg, image or cfg.kubernetes.image or "IMAGE")[0]
    limits = podspec.resources(inst, cfg)["limits"]
    # hugepages-2Mi (EFA pods) is no device count, and TorchX's Resource has no field for it
    devices = {
        k: int(v) for k, v in limits.items() if k not in ("cpu", "memory", podspec.HUGEPAGES)
    }
    gpu = devices.pop("nvidia.com/gpu", 0)
    mem_mb = int(limits["memory"].removesuffix("Gi")) * 2**30 // 10**6  # TorchX writes f"{memMB}M"
    selector = podspec.node_selector(cfg, inst)
    env = {e["name"]: _escape(e["value"]) for e in podspec.env(cfg, inst) if "value" in e}
    fn = cfg.job.name.replace("-", "_")
    return f'''"""TorchX component of the trainmaster job {cfg.job.name} (written by `trainmaster export torchx`).

    torchx run -s kubernetes -cfg queue={cfg.kubernetes.queue},namespace={cfg.kubernetes.namespace} \\
        THIS_FILE.py:{fn} --image IMAGE

Its role runs what trainmaster's Volcano pods run: the resolved job file into the run folder
under {cfg.kubernetes.mount}, then torchrun (c10d at rank 0's host, --rdzv-id the TorchX app id).
Regenerate it after changing the job file; edits here are not read back.
"""

import torchx.specs as specs

SCRIPT = {script(cfg)!r}
ENV = {env!r}


def {fn}(image: str = {(image or cfg.kubernetes.image or "")!r}) -> specs.AppDef:
    """{cfg.job.name}: {cfg.job.nnodes} x {cfg.job.nproc_per_node} workers on {inst.name}."""
    return specs.AppDef(
        name={cfg.job.name!r},
        roles=[specs.Role(
            name="worker", image=image, entrypoint="bash", args=["-c", SCRIPT],
            env=dict(ENV), num_replicas={cfg.job.nnodes}, max_retries={cfg.job.max_restarts},
            resource=specs.Resource(cpu={max(1, round(float(limits["cpu"])))}, gpu={gpu}, memMB={mem_mb}, devices={devices!r},
                                    capabilities={selector!r}),
            port_map={{"c10d": {C10D_PORT}}},
            mounts=[specs.VolumeMount(src={cfg.kubernetes.pvc!r}, dst_path={cfg.kubernetes.mount!r})],
        )],
    )
'''
