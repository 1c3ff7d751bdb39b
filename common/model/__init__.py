"""The cluster model: node and pod tables, the mutable cluster state, the openb trace loader
and data splits, the synthetic non-IID cluster generators, FGD's fragmentation model and
the metrics every simulator reports.

May import: numpy and the standard library only (no other fedsched package).
"""
