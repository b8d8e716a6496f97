"""Test infrastructure, not part of the scheduler: the simulated cluster served over HTTP as a
Kubernetes API server (`simapi`) and the envtest fixture that starts a real kube-apiserver and
etcd (`envtest`). The tests, the chaos scenarios and the benchmarks use them."""
