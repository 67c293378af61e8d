"""`kubectl tessera`: an operator's view of tessera's nodes, pods and placement decisions.

Reads the cluster through the official `kubernetes` client's configuration and the core
`tessera` package only; it writes nothing.
"""
