// etcd for the local control plane: upstream's own entry point (go.etcd.io/etcd/v3's main.go
// does exactly this), built from the server module so that no replace directive is needed.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
