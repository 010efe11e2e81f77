"""The local control plane itself: the binaries, etcd, kube-apiserver, kube-controller-manager and
kube-scheduler with their certificates and identities, the plain-JSON API client, processes, the
audit log, RBAC checks and metrics.
"""
