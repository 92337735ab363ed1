// The pod sandbox ("pause") process of the local cluster's real nodes, what upstream's pause.c
// does: hold the pod's namespaces open, reap the zombies of processes that share its PID
// namespace, and exit 0 on SIGINT or SIGTERM. No registry is reachable here, so the image is
// made locally (controlplane/kube_images.py) from this static binary alone.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for { // one SIGCHLD may stand for several exits: reap all that are waiting
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
