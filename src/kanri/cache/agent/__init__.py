"""The in-pod agent of a Cache's pods: it starts Valkey fenced, decides its role, and writes Sentinel's file.

It imports nothing of the operator (``kanri.cache.api``, the kit, the runtime): only the standard library and the
``valkey`` client, so the pod's image needs no Kubernetes code.
"""
