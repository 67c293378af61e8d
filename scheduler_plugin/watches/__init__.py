"""The cluster watches: what each watched resource does to the state, and the rebuild rule
that judges a pod's allocation record."""
