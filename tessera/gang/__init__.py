"""Gangs: pods placed all together or not at all (docs/gangs.md).

`spec`: what a gang is (its key, its size and timeout, its topology), read from hostile
objects within bounds, and `GangSource`, where gangs come from (PodGroups today);
`plan`: fitting every member at once, inside one topology domain when asked; `book`: the
reservations that hold a planned gang's devices until its members bind; `min_resources`:
whether a PodGroup's minResources exceed what is free.
"""
