"""The local backend (the embedded default): each job is a detached supervisor on this host
running one torchrun process group per "node"."""
