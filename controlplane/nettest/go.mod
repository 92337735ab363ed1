module trainmaster.local/controlplane/nettest

go 1.26.0
