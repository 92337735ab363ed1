module trainmaster.local/controlplane/pause

go 1.26.0
