#!/usr/bin/env python3
"""A local Kubernetes control plane on loopback, to watch a trainmaster job gang-schedule.

    python controlplane/kube.py up [--nodes N] [--real-nodes N] [--instance-type T] [--port P]
    python controlplane/kube.py status | down | kill-node NAME | load-image ARCHIVE

`up` starts etcd, kube-apiserver, kube-controller-manager, Volcano's webhook manager,
controller manager and scheduler, and kwok, all on 127.0.0.1, with every file under the run
dir (TRAINMASTER_KUBE_DIR, default /tmp/trainmaster-kube): pki/, logs/NAME.log, pids/NAME.pid,
state.json and the admin kubeconfig RUN_DIR/kubeconfig. It applies Volcano's CRDs and webhook
configurations and creates N fake nodes of an instance type from trainmaster's catalog (default
3 x trn1.32xlarge) that kwok keeps Ready; kwok also runs the pods bound to them (phase Running,
a pod IP), so Volcano's whole path is real but no container ever starts. `down` stops the
processes (each is a process group of its own) and removes the run dir. Binaries come from
controlplane/build.sh (make kube-build); nothing here builds.

`--real-nodes N` (TRAINMASTER_KUBE_REAL_NODES) adds N real nodes, real-1..real-N, that do run
containers: each its own containerd (runc, CNI bridge tm-br-N, pods in 10.244.N.0/24) and
kubelet in a cgroup of its own, with one kube-proxy and one CoreDNS on the host (kube_real.py;
root, cgroup v1 and Debian's containerd, runc and CNI plugins needed). `kill-node NAME` loses
one (every process SIGKILLed, its bridge gone); `load-image ARCHIVE` imports an image archive
into every live real node (kube_images.load_image); `up --image-archive TAR` gives every node the
image from its start instead, from a store made once (kube_seed.py: seconds, not minutes a node). `--nodes 0` leaves only real nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kube_objects  # noqa: E402
import kube_pki  # noqa: E402
import kube_procs  # noqa: E402
import kube_real  # noqa: E402
import kube_start  # noqa: E402

RUN_DIR = Path(os.environ.get("TRAINMASTER_KUBE_DIR", "/tmp/trainmaster-kube")).absolute()
DEFAULT_PORT = 6443
UP_TIMEOUT = 90.0  # seconds for everything to be ready: ~10 s here, 30 s on a busy machine


def bin_dir() -> Path:
    out = subprocess.run(
        ["bash", str(HERE / "build.sh"), "--bin-dir"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether a server could listen on PORT (SO_REUSEADDR, as Go's servers set it: connections
    of a plane just stopped may linger in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read_state(run: Path) -> dict | None:
    try:
        return json.loads((run / "state.json").read_text())
    except (OSError, ValueError):
        return None


def is_up(run: Path) -> bool:
    state = read_state(run)
    return (
        bool(state)
        and kube_procs.all_alive(run)
        and all(kube_real.liveness(run, state or {}).values())
        and kube_procs.api_healthy(run, state or {})
    )


def print_usage_hint(run: Path, state: dict) -> None:
    kubeconfig = run / "kubeconfig"
    print(f"  API server  https://127.0.0.1:{state['ports']['apiserver']}")
    print(f"  nodes       {state['nodes']} x {state['instance_type']} (kwok)")
    for node in state.get("real_nodes", []):
        print(
            f"  real node   {node['name']}: {node['node_ip']}, pods {node['pod_cidr']} "
            f"on {node['bridge']}, containerd {node['containerd_socket']}"
            + (" (LOST)" if node.get("lost") else "")
        )
    print(f"  logs        {run}/logs/")
    print("Point trainmaster (or kubectl) at it:")
    print(f"  export KUBECONFIG={kubeconfig}")
    print(f"  trainmaster --kubeconfig {kubeconfig} ...")
    print("Stop it: make kube-down (or python controlplane/kube.py down)")


def up(args: argparse.Namespace) -> int:
    start = time.monotonic()
    run = RUN_DIR
    if is_up(run):
        state = read_state(run) or {}
        if len(state.get("real_nodes", [])) != args.real_nodes:
            print(
                f"control plane up in {run} with {len(state.get('real_nodes', []))} real nodes, "
                f"not {args.real_nodes}: `kube.py down` first",
                file=sys.stderr,
            )
            return 2
        print(f"control plane already up in {run}")
        print_usage_hint(run, state)
        return 0
    if run.exists():  # a stale or half-started run: clear it, then start afresh
        down_quietly(run)
    problem = kube_objects.check_shape(args.instance_type, max(args.nodes, 1))
    if args.nodes < 0 or (args.nodes == 0 and args.real_nodes < 1):
        problem = f"--nodes {args.nodes}: at least 1 (0 only with --real-nodes)"
    bins = bin_dir()
    if not problem and args.real_nodes:
        problem = kube_real.problem(run, bins, args.real_nodes)
    missing_archives = [a for a in args.image_archive if not Path(a).is_file()]
    if not problem and missing_archives:
        problem = f"--image-archive {missing_archives[0]}: no such file (kube_image.py build)"
    if not problem and args.image_archive and not args.real_nodes:
        problem = "--image-archive: only with --real-nodes N (kwok's nodes run no image)"
    if problem:
        print(problem, file=sys.stderr)
        return 2
    share = bins.parent / "share"
    missing = [n for n in kube_procs.ORDER if not (bins / n).exists()]
    if missing or not (share / ".complete").exists():
        print(
            f"not built ({', '.join(missing) or 'data files'} missing in {bins.parent}): "
            "run `make kube-build` (controlplane/build.sh) first",
            file=sys.stderr,
        )
        return 2
    port = (
        args.port
        if args.port is not None
        else int(os.environ.get("TRAINMASTER_KUBE_PORT", DEFAULT_PORT))
    )
    if port == 0:
        port = free_port()
    elif not port_free(port):
        print(
            f"127.0.0.1:{port} is in use: set TRAINMASTER_KUBE_PORT to another port, or to 0 "
            "for any free one",
            file=sys.stderr,
        )
        return 2
    ports = {"apiserver": port} | {name: free_port() for name in kube_procs.PORT_NAMES}
    state = {
        "ports": ports,
        "nodes": args.nodes,
        "instance_type": args.instance_type,
        "node_grace_s": args.node_grace_s,
        "bin_dir": str(bins),
        "run_dir": str(run),
    }
    for sub in ("logs", "pids", "kubeconfigs"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    (run / "state.json").write_text(json.dumps(state, indent=1))

    procs = kube_procs.Processes(run, bins, deadline=start + UP_TIMEOUT)
    try:
        kube_pki.make_pki(run / "pki")
        server = f"https://127.0.0.1:{port}"
        kube_pki.write_kubeconfig(run / "kubeconfig", run / "pki", "admin", server)
        for client in ("controller-manager", "volcano", "kwok"):
            kube_pki.write_kubeconfig(
                run / "kubeconfigs" / f"{client}.kubeconfig", run / "pki", client, server
            )
        if args.real_nodes:
            state["image_archives"] = [str(Path(a).absolute()) for a in args.image_archive]
            kube_real.prepare(run, state, args.real_nodes, free_port)
        kube_start.start(procs, share, state)
        if args.real_nodes:
            from kubernetes import config

            api = config.new_client_from_config(config_file=str(run / "kubeconfig"))
            kube_real.start(procs, state, api)
    except KeyboardInterrupt:
        kube_real.teardown(run, read_state(run))
        procs.stop()
        print("interrupted: stopped what had started", file=sys.stderr)
        return 130
    except Exception as e:  # whatever failed, no process of a half-started plane stays behind
        kube_real.teardown(run, read_state(run))
        procs.stop()
        print(f"kube up failed after {time.monotonic() - start:.1f}s: {e}", file=sys.stderr)
        print(f"logs kept in {run}/logs (make kube-down removes them)", file=sys.stderr)
        return 1
    print(f"control plane up in {time.monotonic() - start:.1f}s ({run})")
    print(
        "  ready at   "
        + ", ".join(f"{what.split(' (')[0]} {t:.1f}s" for what, t in procs.milestones)
    )
    print_usage_hint(run, state)
    return 0


def down_quietly(run: Path) -> int:
    kube_real.teardown(run, read_state(run))  # the real nodes first: nothing of theirs is left
    stopped = kube_procs.stop_recorded(run)
    shutil.rmtree(run, ignore_errors=True)
    return stopped


def down(_: argparse.Namespace) -> int:
    if not RUN_DIR.exists():
        print(f"control plane not running ({RUN_DIR} does not exist)")
        return 0
    stopped = down_quietly(RUN_DIR)
    print(f"stopped {stopped} processes, removed {RUN_DIR}")
    return 0


def status(_: argparse.Namespace) -> int:
    state = read_state(RUN_DIR)
    if state is None:
        print(f"control plane not running ({RUN_DIR})")
        return 3
    procs = kube_procs.liveness(RUN_DIR) | kube_real.liveness(RUN_DIR, state)
    for name, alive in procs.items():
        print(f"  {name:24} {'running' if alive else 'NOT RUNNING'}")
    if not is_up(RUN_DIR):
        print("control plane NOT healthy: make kube-down, then make kube-up")
        return 3
    print(f"control plane up in {RUN_DIR}")
    print_usage_hint(RUN_DIR, state)
    return 0


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(
        prog="kube.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start the control plane (no-op when it is up)")
    p_up.add_argument("--nodes", type=int, default=int(os.environ.get("TRAINMASTER_KUBE_NODES", 3)))
    p_up.add_argument(
        "--real-nodes",
        type=int,
        default=int(os.environ.get("TRAINMASTER_KUBE_REAL_NODES", 0)),
        help="real nodes (containerd + kubelet each) beside the kwok ones (default 0)",
    )
    p_up.add_argument(
        "--image-archive",
        action="append",
        default=[],
        metavar="TAR",
        help="an image every real node has from its start (repeatable; kube_seed.py: imported "
        "once into a cached store, which each node's containerd starts from)",
    )
    p_up.add_argument(
        "--instance-type", default=os.environ.get("TRAINMASTER_KUBE_INSTANCE_TYPE", "trn1.32xlarge")
    )
    p_up.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"API server port (TRAINMASTER_KUBE_PORT, default {DEFAULT_PORT}; 0: any free)",
    )
    p_up.add_argument(
        "--node-grace-s",
        type=int,
        default=None,
        help="the node controller's grace before a silent node is NotReady (default: "
        "Kubernetes' own, 50 s); the kwok tests give 30 (three lease renewals), which only "
        "shortens their waits",
    )
    p_up.set_defaults(func=up)
    sub.add_parser("down", help="stop everything and remove the run dir").set_defaults(func=down)
    sub.add_parser("status", help="exit 0 when up and healthy").set_defaults(func=status)
    p_kill = sub.add_parser(
        "kill-node", help="lose a real node: SIGKILL all of it, cut its network"
    )
    p_kill.add_argument("name", help="real-1, real-2, ...")
    p_kill.set_defaults(func=lambda a: kube_real.cli_kill_node(RUN_DIR, a.name))
    p_load = sub.add_parser("load-image", help="import an image archive into every live real node")
    p_load.add_argument("archive", help="a docker-archive or oci-archive tar")
    p_load.set_defaults(func=lambda a: kube_real.cli_load_image(RUN_DIR, a.archive))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
