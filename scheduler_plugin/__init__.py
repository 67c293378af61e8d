"""The kube-scheduler extender: every device decision, binding, recovery and observability."""
